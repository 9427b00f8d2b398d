"""The round quorum (issue 52's engine): real torchft lighthouse, real worker processes (each its own torchft replica
group), a real SIGKILL. Survivors go on without the dead worker and are never restarted; a worker that comes back
heals from a live peer (φ and the round number) and averages with them again."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest
from helpers import SCRIPTS, free_port

from adloco_hf.quorum import LighthouseSettings, RoundQuorum, replica_id, start_lighthouse
from adloco_hf.quorum.requirement import TORCHFT_REQUIREMENT, import_torchft


pytestmark = pytest.mark.multiprocess

WORKER = os.path.join(SCRIPTS, "quorum_worker.py")


def step(members: list[int]) -> float:
    """What a committed round adds to φ: the members' contributions φ + (i + 1), weighted by i + 1."""
    return sum((i + 1) ** 2 for i in members) / sum(i + 1 for i in members)


STARTED: list[subprocess.Popen] = []


def start(command: list[str], **kwargs) -> subprocess.Popen:
    """A process of this test, killed when the test ends however it ends (a worker may be waiting for a round)."""
    process = subprocess.Popen(command, **kwargs)
    STARTED.append(process)
    return process


@pytest.fixture(autouse=True)
def no_process_outlives_its_test():
    yield
    while STARTED:
        process = STARTED.pop()
        if process.poll() is None:
            process.kill()
            process.wait()


def launch(out, worker_id: int, lighthouse, **spec):
    spec = {"worker_id": worker_id, "lighthouse": lighthouse.address(), "out": str(out), "timeout": 20.0, **spec}
    return start([sys.executable, WORKER, json.dumps(spec)], stderr=open(out / f"stderr{worker_id}.txt", "a"))


def lines(out, worker_id: int) -> list[dict]:
    path = out / f"worker{worker_id}.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def wait_for(condition, processes, what: str, limit: float = 120.0):
    """Poll `condition` until it holds; fail (naming `what`) if a process ends or `limit` seconds pass."""
    deadline = time.monotonic() + limit
    while not condition():
        ended = [p.returncode for p in processes if p.poll() is not None and p.returncode != 0]
        assert not ended and time.monotonic() < deadline, f"waiting for {what}: exits {ended}"
        time.sleep(0.05)


@pytest.fixture
def lighthouse():
    # A dead worker is named by its silent heartbeats (2 s); a live one that is late (a busy machine) is waited for,
    # so that which workers share a round never depends on how fast the machine is.
    server = start_lighthouse(LighthouseSettings(min_workers=1, join_timeout=60.0, heartbeat_timeout=2.0))
    yield server
    server.shutdown()


def test_the_members_average_by_their_weights_and_agree(tmp_path, lighthouse):
    # min_workers=3 in every worker: the first round waits for all three.
    workers = [launch(tmp_path, i, lighthouse, rounds=3, workers=3, min_workers=3) for i in range(3)]
    assert [w.wait(timeout=120) for w in workers] == [0, 0, 0]
    logs = [lines(tmp_path, i) for i in range(3)]
    assert [[line["round"] for line in log] for log in logs] == [[1, 2, 3]] * 3
    assert all(line["members"] == [0, 1, 2] for log in logs for line in log)  # a world of 3 workers
    assert all(line["reports"] == line["members"] for log in logs for line in log)  # every member's, in order
    expected = [step([0, 1, 2]) * r for r in (1, 2, 3)]
    for log in logs:
        assert [line["phi"] for line in log] == [pytest.approx([value] * 4) for value in expected]
        assert not any(line["healed"] for line in log)


def test_survivors_go_on_without_a_killed_worker_who_heals_from_a_peer_when_it_returns(tmp_path, lighthouse):
    spec = dict(rounds=8, workers=3, min_workers=2, pause=0.1)
    first = [launch(tmp_path, i, lighthouse, holds=[2], **spec) for i in range(3)]
    wait_for(lambda: all(len(lines(tmp_path, i)) >= 2 for i in range(3)), first, "round 2 on every worker")
    first[2].send_signal(signal.SIGKILL)
    assert first[2].wait(timeout=30) == -signal.SIGKILL
    (tmp_path / "go2").touch()
    survivors = first[:2]
    wait_for(lambda: all(len(lines(tmp_path, i)) >= 4 for i in range(2)), survivors, "round 4 on the survivors")
    back = launch(tmp_path, 2, lighthouse, **spec)  # its launcher restarts it: same id, fresh state
    assert [w.wait(timeout=120) for w in (*survivors, back)] == [0, 0, 0]

    logs = {i: lines(tmp_path, i) for i in range(3)}
    # The survivors were never restarted and committed every round, one after the other.
    for i in (0, 1):
        assert len({line["pid"] for line in logs[i]}) == 1
        assert [line["round"] for line in logs[i]] == list(range(1, len(logs[i]) + 1))
    # Without the dead worker from round 3 until it came back, then with it again to the end.
    before, after = logs[2][:2], logs[2][2:]
    assert [line["round"] for line in before] == [1, 2] and after
    returned = after[0]["round"]
    assert returned > 4 and after[0]["healed"] and not any(line["healed"] for line in after[1:])
    assert {line["pid"] for line in after} != {line["pid"] for line in before}
    assert all(line["reports"] == line["members"] for log in logs.values() for line in log)
    members = {line["round"]: line["members"] for line in logs[0]}
    assert [members[r] for r in (1, 2)] == [[0, 1, 2]] * 2
    assert all(members[r] == [0, 1] for r in range(3, returned))
    assert all(members[r] == [0, 1, 2] for r in range(returned, len(members) + 1))
    assert [line["round"] for line in after] == list(range(returned, len(members) + 1))
    # Every round's φ is the members' weighted average, the same on every worker (the healed one included).
    phi = 0.0
    for line in logs[0]:
        phi += step(line["members"])
        assert line["phi"] == pytest.approx([phi] * 4, rel=1e-6)
    by_round = {line["round"]: line["phi"] for line in logs[0]}
    for i in (1, 2):
        assert all(line["phi"] == by_round[line["round"]] for line in logs[i])


def test_replica_ids_sort_as_the_workers_do():
    ids = [replica_id(w) for w in (0, 2, 10, 99999)]
    assert ids == sorted(ids) and ids[0] == "worker00000"
    with pytest.raises(ValueError, match="worker_id=-1"):
        replica_id(-1)


def test_a_missing_torchft_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "torchft", None)  # as if not installed
    with pytest.raises(ImportError, match=r"pip install 'adloco_hf\[ft\]'"):
        import_torchft()
    with pytest.raises(ImportError, match="torchft"):
        RoundQuorum(0, lighthouse="http://localhost:1", state_dict=dict, load_state_dict=print)


def test_the_extra_pins_the_release_the_quorum_is_built_on():
    setup = open(os.path.join(os.path.dirname(SCRIPTS), "..", "setup.py")).read()
    assert f'"ft": ["{TORCHFT_REQUIREMENT}"]' in setup


def test_the_lighthouse_s_timeouts_default_to_adloco_s():
    from adloco_hf import AdLoCoConfig
    from adloco_hf.config.timeouts import DEFAULT_PEER_TIMEOUT

    defaults = LighthouseSettings()
    assert defaults.heartbeat_timeout == DEFAULT_PEER_TIMEOUT  # names the dead: peer_timeout
    assert defaults.join_timeout == AdLoCoConfig.__dataclass_fields__["worker_timeout"].default  # bounds the waits


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [("min_workers", 0, "min_workers=0"), ("port", 70000, "port=70000"), ("join_timeout", 0, "join_timeout=0")],
)
def test_bad_lighthouse_settings_are_refused(field, value, message):
    with pytest.raises(ValueError, match=message):
        LighthouseSettings(**{field: value})


def test_the_lighthouse_command_serves_a_job_until_it_is_stopped(tmp_path):
    command = [sys.executable, "-m", "adloco_hf.cli", "lighthouse", "--port", "0", "--min_workers", "2"]
    server = start(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        first = server.stdout.readline()
        assert first.startswith("lighthouse: http://") and "min_workers=2" in first
        address = first.split()[1]
        spec = {"lighthouse": address, "out": str(tmp_path), "rounds": 2, "workers": 2, "timeout": 20.0}
        workers = [
            start([sys.executable, WORKER, json.dumps({**spec, "worker_id": i})], stderr=subprocess.DEVNULL)
            for i in range(2)
        ]
        assert [w.wait(timeout=120) for w in workers] == [0, 0]
        assert [[line["members"] for line in lines(tmp_path, i)] for i in range(2)] == [[[0, 1]] * 2] * 2
        server.send_signal(signal.SIGTERM)
        assert server.wait(timeout=30) == 0
    finally:
        server.kill()


def test_the_lighthouse_command_refuses_bad_settings(capsys):
    from adloco_hf.commands import main

    assert main(["lighthouse", "--min_workers", "0"]) == 1
    assert "min_workers=0" in capsys.readouterr().err


OUTER_WORKER = os.path.join(SCRIPTS, "quorum_outer_worker.py")


def run_outer(tmp_path, lighthouse, workers: int, **spec) -> list[dict]:
    spec = {"workers": workers, "lighthouse": lighthouse.address(), "rounds": 3, "out": str(tmp_path), **spec}
    per_worker = spec.pop("per_worker", {})
    processes = [
        start(
            [sys.executable, OUTER_WORKER, json.dumps({**spec, **per_worker.get(w, {}), "worker_id": w})],
            stderr=open(tmp_path / f"outer_stderr{w}.txt", "w"),
        )
        for w in range(workers)
    ]
    assert [p.wait(timeout=180) for p in processes] == [0] * workers
    paths = [tmp_path / f"outer{w}.json" for w in range(workers)]
    return [json.loads(path.read_text()) if path.exists() else None for path in paths]


def test_the_outer_step_over_the_quorum_equals_today_s(tmp_path, lighthouse):
    # Same algorithm, another transport: DiLoCo's weighted bf16 average and Nesterov outer step, 3 rounds, 3 workers.
    results = run_outer(tmp_path, lighthouse, 3, port=free_port())
    for result in results:
        assert result["world_size"] == 3 and result["members"] == [[0, 1, 2]] * 3
        assert not any(r["skipped"] for r in result["today"] + result["quorum"])
        for today, quorum in zip(result["today"], result["quorum"], strict=True):
            assert max(abs(a - b) for a, b in zip(today["phi"], quorum["phi"], strict=True)) <= 1e-6
    assert all(result["quorum"] == results[0]["quorum"] for result in results)  # one φ per round on every worker
    assert results[0]["quorum"][0]["phi"] != results[0]["quorum"][1]["phi"]  # the rounds moved φ


def test_a_member_that_dies_inside_a_round_makes_every_survivor_drop_that_round_alike(tmp_path, lighthouse):
    results = run_outer(tmp_path, lighthouse, 3, today=False, per_worker={2: {"die_at_round": 1}})
    assert results[2] is None  # it died after joining round 2's quorum, before averaging
    survivors = results[:2]
    for result in survivors:
        assert result["members"] == [[0, 1, 2], [0, 1, 2], [0, 1]]
        assert [r["skipped"] for r in result["quorum"]] == [False, True, False]
        first, dropped, third = (r["phi"] for r in result["quorum"])
        assert dropped == first and third != first  # φ unchanged by the dropped round, moved by the next
    assert survivors[0]["quorum"] == survivors[1]["quorum"]
