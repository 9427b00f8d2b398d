"""The peer watch (common/liveness.py, issue 42) in a real gloo world of 3 processes: a worker whose pulse stands still
is named by the others, which end with exit code 75 although their main thread is blocked in a collective that
would wait 10 minutes; a worker whose main thread is busy longer than `peer_timeout`, and one that stopped its pulse
at its end, are not named.

A stopped worker is SIGSTOPped (every thread of it, as a machine cut from the network looks to the others: its
process alive, its sockets silent). What the tests assert depends on which worker is silent, not on speed: a
beating pulse moves every second, `peer_timeout` is 4 s, and a silent one never moves again.
"""

import re
import subprocess
import sys
import textwrap

import pytest

from adloco_hf.common.liveness import PEER_LOST_EXIT_CODE, silent_peers


PEER_TIMEOUT = 4.0

# role: "wait" (into the second barrier at once), "busy" (its main thread sleeps 2 x peer_timeout first),
# "stopped" (SIGSTOPs itself before it), "ends" (through the second barrier, then stops its pulse and lives on,
# silent); "wait" and "busy" then stay 2 x peer_timeout longer, watching the one that ended.
WORKER = textwrap.dedent(
    """
    import datetime, os, signal, sys, time
    import torch.distributed as dist
    from adloco_hf.common.job_store import job_store
    from adloco_hf.common.liveness import PeerWatch
    from adloco_hf.common.pulse import Pulse

    rank, world, role, timeout, port = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], float(sys.argv[4]), sys.argv[5]
    # the job's store lives in the launcher, as under torchrun or accelerate launch: here its own process
    launcher_store = dist.TCPStore("127.0.0.1", int(port), is_master=False)
    dist.init_process_group(
        "gloo", store=launcher_store, rank=rank, world_size=world, timeout=datetime.timedelta(seconds=600)
    )
    store = job_store()
    pulse = Pulse(store, rank).start()
    watch = PeerWatch(store, rank, world, timeout).start()
    dist.barrier()
    print(f"started in a world of {dist.get_world_size()}", flush=True)
    if role == "busy":
        time.sleep(2 * timeout)
    elif role == "stopped":
        os.kill(os.getpid(), signal.SIGSTOP)
    dist.barrier()  # bounded by 600 s: only the watch can end a worker waiting here for a stopped one
    print("through", flush=True)
    if role == "ends":
        watch.stop()
        pulse.stop()
    time.sleep(2 * timeout)
    watch.stop()
    pulse.stop()
    print("done", flush=True)
    """
)


# The launcher's store: it outlives the workers (a worker that ends does not take the store with it).
STORE_HOST = textwrap.dedent(
    """
    import sys, time
    import torch.distributed as dist
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    print(store.port, flush=True)
    sys.stdin.read()
    """
)


@pytest.fixture
def store_port():
    host = subprocess.Popen(
        [sys.executable, "-c", STORE_HOST], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        yield int(host.stdout.readline())
    finally:
        host.kill()
        host.wait()


def _launch(roles: list[str], port: int) -> list[subprocess.Popen]:
    return [
        subprocess.Popen(
            [sys.executable, "-c", WORKER, str(rank), str(len(roles)), role, str(PEER_TIMEOUT), str(port)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank, role in enumerate(roles)
    ]


def _named(err: str) -> list[int]:
    found = re.search(r"worker rank\(s\) ([\d, ]+) gave no pulse", err)
    return [int(rank) for rank in found.group(1).split(",")] if found else []


def test_a_silent_peer_is_named_and_the_workers_waiting_for_it_end(store_port):
    processes = _launch(["wait", "wait", "stopped"], store_port)
    try:
        outputs = [p.communicate(timeout=180) for p in processes[:2]]  # a hang guard: the barrier waits 600 s
    finally:
        for p in processes:
            p.kill()
        processes[2].wait()
    for rank, (process, (out, err)) in enumerate(zip(processes[:2], outputs, strict=True)):
        assert "started in a world of 3" in out, err
        assert "through" not in out  # still in the barrier when it ended
        assert process.returncode == PEER_LOST_EXIT_CODE, err
        assert 2 in _named(err), err
        assert f"AdLoCo: rank {rank}: worker rank(s)" in err and "raise peer_timeout" in err


def test_a_busy_peer_and_one_that_ended_are_not_named(store_port):
    processes = _launch(["wait", "busy", "ends"], store_port)
    try:
        outputs = [p.communicate(timeout=180) for p in processes]
    finally:
        for p in processes:
            p.kill()
    for process, (out, err) in zip(processes, outputs, strict=True):
        assert "started in a world of 3" in out, err
        assert process.returncode == 0 and "gave no pulse" not in err, err
        assert "through" in out and "done" in out


def test_silent_peers_are_those_unmoved_for_the_timeout():
    assert silent_peers({1: 10.0, 2: 14.0, 3: 5.9}, now=15.0, timeout=5.0) == [1, 3]
    assert silent_peers({1: 10.1}, now=15.0, timeout=5.0) == []
    assert silent_peers({}, now=15.0, timeout=5.0) == []
