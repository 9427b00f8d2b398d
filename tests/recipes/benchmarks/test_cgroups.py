"""The slow-worker testbed (`recipes/benchmarks/toolkit/testbeds/cgroups.py`): a real cgroup with a CPU quota, joined by a
listed rank, removed on every exit path (a normal end, an exception, SIGTERM, and a SIGKILLed benchmark's leftover
removed by the next one). Skipped, with the reason, where this machine cannot make one."""

import os
import signal
import subprocess
import sys

import pytest
from helpers import REPO

from recipes.benchmarks.toolkit.runs import slow_group
from recipes.benchmarks.toolkit.testbeds import cgroups as slow


def _parent_or_skip() -> tuple[str, str]:
    try:
        return slow.cpu_controller()
    except slow.CgroupUnavailable as error:
        pytest.skip(f"no cgroup with a CPU quota can be made here: {error}")


def test_quota_lines_for_cgroup_v1_and_v2():
    assert slow.quota_lines(0.25, "v1") == {"cpu.cfs_period_us": "100000", "cpu.cfs_quota_us": "25000"}
    assert slow.quota_lines(1.5, "v2") == {"cpu.max": "150000 100000"}
    assert slow.quota_lines(0.001, "v1")["cpu.cfs_quota_us"] == "1000"  # the kernel's smallest quota
    with pytest.raises(ValueError, match="positive number of CPUs"):
        slow.quota_lines(0, "v1")


def _read(path: str) -> str:
    with open(path, encoding="utf-8") as f:
        return f.read().strip()


def _child(code: str, **env) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", code],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": REPO, **env},
        stdout=subprocess.PIPE,
        text=True,
    )


def test_a_listed_rank_joins_the_group_with_its_quota_and_the_group_goes_at_the_end():
    parent, version = _parent_or_skip()
    joined = None
    try:
        with slow.cpu_quota_group(0.25) as procs:
            group = os.path.dirname(procs)
            assert os.path.dirname(group) == parent.rstrip("/") and os.path.basename(group).startswith(slow.PREFIX)
            for name, value in slow.quota_lines(0.25, version).items():
                assert _read(os.path.join(group, name)) == value
            env = {slow.ENV_PROCS: procs, slow.ENV_RANKS: "1,3"}
            join = "import time; from recipes.benchmarks.toolkit.testbeds.cgroups import join_from_environment as j; "
            joined = _child(join + "print(j(3), flush=True); time.sleep(600)", **env)  # rank 3 is listed
            left_out = _child(join + "print(j(0), flush=True)", **env)
            assert joined.stdout.readline().strip() == "True"
            assert left_out.communicate(timeout=60)[0].strip() == "False"
            members = _read(procs).split()
            assert str(joined.pid) in members and str(left_out.pid) not in members
            assert os.path.basename(group) in _read(f"/proc/{joined.pid}/cgroup")
        # The block is left with the worker still running: it was moved back to the parent, the group removed.
        assert not os.path.exists(group)
        assert os.path.basename(group) not in _read(f"/proc/{joined.pid}/cgroup")
    finally:
        if joined is not None:
            joined.kill()
            joined.wait()


def test_the_group_is_removed_when_the_benchmark_raises():
    _parent_or_skip()
    with pytest.raises(RuntimeError, match="launch failed"):
        with slow.cpu_quota_group(0.5) as procs:
            group = os.path.dirname(procs)
            raise RuntimeError("launch failed")
    assert not os.path.exists(group)


def test_the_group_is_removed_on_sigterm_and_a_sigkilled_benchmark_s_by_the_next_one():
    parent, _ = _parent_or_skip()
    hold = (
        "import time; from recipes.benchmarks.toolkit.testbeds.cgroups import cpu_quota_group as g\n"
        "with g(0.25) as procs:\n    print(procs, flush=True)\n    time.sleep(600)\n"
    )
    terminated = _child(hold)
    group = os.path.dirname(terminated.stdout.readline().strip())
    assert os.path.isdir(group)
    terminated.send_signal(signal.SIGTERM)
    assert terminated.wait(timeout=60) == 128 + signal.SIGTERM
    assert not os.path.exists(group)

    killed = _child(hold)
    leftover = os.path.dirname(killed.stdout.readline().strip())
    killed.kill()
    killed.wait(timeout=60)
    assert os.path.isdir(leftover)  # SIGKILL runs no cleanup...
    assert os.path.basename(leftover) in slow.remove_stale_groups(parent)  # ...the next benchmark does it
    assert not os.path.exists(leftover)


def test_the_benchmarks_group_covers_every_process_of_the_slow_workers():
    _parent_or_skip()
    with slow_group({"slow_workers": {"workers": [1], "cores": 0.5}, "processes_per_worker": 2}) as env:
        procs = env[slow.ENV_PROCS]
        assert env[slow.ENV_RANKS] == "2,3"  # worker 1's two processes (links: machine 1's)
        assert os.path.isfile(procs)
    assert not os.path.exists(os.path.dirname(procs))
    with slow_group({"slow_workers": None}) as env:
        assert env == {}
