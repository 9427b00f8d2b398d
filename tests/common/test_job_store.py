"""The job's store with every call bounded (common/job_store.py, issue 42): a real TCPStore whose host stops
answering ends the worker that waits for it, with the exit code its launcher sees and a message naming the store and
the fix; calls that are answered never trip the watchdog."""

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from adloco_hf.common.job_store import STORE_LOST_EXIT_CODE


HOST = textwrap.dedent(
    """
    import time
    import torch.distributed as dist
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    print(store.port, flush=True)
    time.sleep(600)
    """
)

# A worker's calls as the library makes them: answered ones, then (after a line on stdin) one more.
CLIENT = textwrap.dedent(
    """
    import sys, time
    import torch.distributed as dist
    from adloco_hf.common.job_store import BoundedStore, bound_store_calls
    store = BoundedStore(dist.PrefixStore("job", dist.TCPStore("127.0.0.1", int(sys.argv[1]), is_master=False)), 3)
    bound_store_calls(float(sys.argv[2]))
    for i in range(20):
        store.set("adloco/k", str(i)); assert store.check(["adloco/k"]); store.add("adloco/pulse/3", 1)
    time.sleep(float(sys.argv[3]))  # nothing in flight: nothing to end
    print("answered", store.get("adloco/k").decode(), flush=True)
    sys.stdin.readline()
    print("calling", flush=True)
    store.add("adloco/pulse/3", 1)
    print("answered again", flush=True)
    """
)


@pytest.fixture
def store_host():
    host = subprocess.Popen([sys.executable, "-c", HOST], stdout=subprocess.PIPE, text=True)
    try:
        yield host, int(host.stdout.readline())
    finally:
        os.kill(host.pid, signal.SIGCONT)
        host.kill()
        host.wait()


def _stop(host: subprocess.Popen) -> None:
    """SIGSTOP the store's host and wait until it is stopped (the signal is delivered asynchronously)."""
    os.kill(host.pid, signal.SIGSTOP)
    while not all(_state(host.pid, task) == "T" for task in os.listdir(f"/proc/{host.pid}/task")):
        time.sleep(0.01)


def _state(pid: int, task: str) -> str:
    with open(f"/proc/{pid}/task/{task}/stat") as stat:
        return stat.read().rsplit(")", 1)[1].split()[0]


def _client(port: int, worker_timeout: float, idle: float) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", CLIENT, str(port), str(worker_timeout), str(idle)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_a_store_that_stops_answering_ends_the_worker_naming_the_store_and_the_fix(store_host):
    host, port = store_host
    client = _client(port, worker_timeout=2.5, idle=6.0)  # calls bounded by 5 s
    assert client.stdout.readline().strip() == "answered 19"  # 60 answered calls and 6 s idle did not trip it
    _stop(host)  # the store's host stops answering (a dead link looks the same to the client)
    client.stdin.write("go\n")
    client.stdin.flush()
    out, err = client.communicate(timeout=120)  # a hang guard: the bound is 5 s
    assert client.returncode == STORE_LOST_EXIT_CODE, err
    assert "calling" in out and "answered again" not in out
    assert (
        f"rank 3: the job's store (127.0.0.1:{port}) did not answer add('adloco/pulse/3') in 5 s (2 x worker_timeout)"
        in err
    )
    assert "raise worker_timeout" in err and "docs/faults.md#timeouts" in err


def test_a_store_that_answers_late_within_the_bound_costs_nothing(store_host):
    host, port = store_host
    client = _client(port, worker_timeout=15.0, idle=0.0)  # calls bounded by 30 s
    assert client.stdout.readline().strip() == "answered 19"
    _stop(host)
    client.stdin.write("go\n")
    client.stdin.flush()
    assert client.stdout.readline().strip() == "calling"  # the call cannot be answered while the host is stopped
    time.sleep(3)
    os.kill(host.pid, signal.SIGCONT)  # an outage shorter than the bound: the call waited, then is answered
    out, err = client.communicate(timeout=120)
    assert client.returncode == 0, err
    assert "answered again" in out
