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

import pytest
from helpers import SCRIPTS, launch_command, root_cause, run_launch


pytestmark = pytest.mark.multiprocess

PROBE = os.path.join(SCRIPTS, "launch_probe.py")


def _launch(tmp_path, mode: str, warm: bool) -> dict:
    out = tmp_path / ("warm" if warm else "cold")
    out.mkdir()
    result = run_launch(launch_command(PROBE, str(out), mode, num_processes=2), timeout=120, check=False, warm=warm)
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


@pytest.mark.parametrize("mode", ["return", "exit3", "raise", "os_exit5", "sigkill"])
def test_a_warm_worker_starts_and_ends_as_a_fresh_one(tmp_path, mode):
    cold, warm = _launch(tmp_path, mode, warm=False), _launch(tmp_path, mode, warm=True)
    assert warm["seen"] == cold["seen"], (warm["seen"], cold["seen"])
    assert (warm["returncode"], warm["blamed"]) == (cold["returncode"], cold["blamed"]), warm["output"][-3000:]
    expected = {"return": None, "exit3": (1, 3), "raise": (1, 1), "os_exit5": (1, 5), "sigkill": (1, -9)}[mode]
    assert warm["blamed"] == expected, warm["output"][-3000:]
    assert warm["seen"][0]["env"]["WORLD_SIZE"] == "2" and warm["seen"][1]["env"]["RANK"] == "1"
    assert warm["seen"][1]["atexit"] == (mode not in ("os_exit5", "sigkill"))
    if mode == "raise":
        assert "ValueError: rank 1 raises" in warm["output"]
