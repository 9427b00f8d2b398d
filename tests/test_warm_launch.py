"""The test suite's warm launches (`warm_launch.py`) against the launches they stand for.

Most launched tests run through the session's launch server: the same `accelerate launch` command line and elastic
agent, with the launcher and the workers forked from a process that has the library imported. This checks, on one
probe script, that a worker started so sees what a freshly started one sees and leaves as it would: the same
arguments, `__name__`, `sys.path[0]`, launcher variables, signal dispositions and session, its atexit hooks run (or
not, after `os._exit`), and the launch's exit code and the launcher's blame (rank, exit code) for each way a worker
can end.
"""

import json
import os
import signal
import threading

import pytest
from helpers import SCRIPTS, launch_command, new_zygote, root_cause, run_launch


pytestmark = pytest.mark.multiprocess

PROBE = os.path.join(SCRIPTS, "launch_probe.py")


def _launch(tmp_path, mode: str, warm: bool, zygote=None) -> dict:
    out = tmp_path / ("warm" if warm else "cold")
    out.mkdir()
    command = launch_command(PROBE, str(out), mode, num_processes=2)
    result = run_launch(command, timeout=120, check=False, warm=warm, zygote=zygote)
    output = result.stdout + result.stderr
    seen = {}
    for rank in (0, 1):
        with open(out / f"rank-{rank}.json") as f:
            seen[rank] = json.load(f)
        seen[rank]["atexit"] = (out / f"atexit-{rank}").exists()
        seen[rank]["env"].pop("MASTER_PORT")  # one port per launch
        assert seen[rank]["argv"][0] == str(out)
        seen[rank]["argv"][0] = "OUT"
    return {
        "returncode": result.returncode,
        "blamed": root_cause(output) if result.returncode else None,
        "seen": seen,
        "output": output,
    }


def _differing(warm: dict, cold: dict) -> dict:
    """{rank: {what: (warm, cold)}}, only what differs."""
    return {
        rank: {key: (warm["seen"][rank].get(key), cold["seen"][rank].get(key)) for key in cold["seen"][rank]
               if warm["seen"][rank].get(key) != cold["seen"][rank].get(key)}
        for rank in (0, 1)
    }  # fmt: skip


@pytest.mark.parametrize("mode", ["return", "exit3", "raise", "os_exit5", "sigkill"])
def test_a_warm_worker_starts_and_ends_as_a_fresh_one(tmp_path, mode):
    cold, warm = _launch(tmp_path, mode, warm=False), _launch(tmp_path, mode, warm=True)
    assert warm["seen"] == cold["seen"], _differing(warm, cold)
    assert (warm["returncode"], warm["blamed"]) == (cold["returncode"], cold["blamed"]), warm["output"][-3000:]
    expected = {"return": None, "exit3": (1, 3), "raise": (1, 1), "os_exit5": (1, 5), "sigkill": (1, -9)}[mode]
    assert warm["blamed"] == expected, warm["output"][-3000:]
    assert warm["seen"][0]["env"]["WORLD_SIZE"] == "2" and warm["seen"][1]["env"]["RANK"] == "1"
    assert warm["seen"][1]["atexit"] == (mode not in ("os_exit5", "sigkill"))
    if mode == "raise":
        assert "ValueError: rank 1 raises" in warm["output"]


@pytest.mark.skipif(threading.current_thread() is not threading.main_thread(), reason="signals: main thread only")
def test_a_launch_server_started_while_signals_were_ignored_does_not_pass_them_on(tmp_path):
    """A fork keeps its parent's signal dispositions where `exec` resets them: a launch server started while the test
    process ignored SIGINT and SIGHUP (a background job ignores SIGINT, `nohup` SIGHUP; a pytest-xdist worker started
    the session's server then) and used once they are back must start launchers and workers as a fresh launch
    would, not with the server's start-up dispositions."""
    ignored = (signal.SIGINT, signal.SIGHUP)
    previous = {sig: signal.signal(sig, signal.SIG_IGN) for sig in ignored}
    try:
        zygote = new_zygote()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    try:
        warm = _launch(tmp_path, "return", warm=True, zygote=zygote)
    finally:
        zygote.close()
    cold = _launch(tmp_path, "return", warm=False)
    assert warm["seen"] == cold["seen"], _differing(warm, cold)
    assert warm["seen"][0]["env"]["WORLD_SIZE"] == "2" and warm["seen"][1]["env"]["RANK"] == "1"
    assert warm["seen"][1]["signals"]["SIGINT"] == repr(signal.default_int_handler)
    assert warm["seen"][1]["signals"]["SIGHUP"] == repr(signal.SIG_DFL)
