"""A collective entered by one worker fails at once with the rule named, on real 2-worker launches (it used to hang
until `worker_timeout`, 30 minutes by default, which the workers here keep: only the check ends them in time)."""

import json

import pytest
from helpers import SCRIPTS, launch_failing, root_cause


pytestmark = pytest.mark.multiprocess

SCRIPT = f"{SCRIPTS}/collective_worker.py"


def run(tmp_path, other: str) -> str:
    spec = {"output_dir": str(tmp_path / "out"), "other": other}
    return launch_failing(SCRIPT, json.dumps(spec), num_processes=2, timeout=300)


def test_evaluate_on_rank_0_alone_fails_when_the_other_worker_leaves(tmp_path):
    output = run(tmp_path, "exit")
    assert "CollectiveCallError: evaluate() is collective: every worker must call it" in output, output[-4000:]
    assert "if rank == 0:" in output
    assert "Rank(s) 1 exited without calling it, so this worker (rank 0) stops" in output
    assert "rank 1: leaving the script" in output  # the other side left normally...
    assert root_cause(output) == (0, 1)  # ...and only rank 0 failed
    assert "evaluate() returned" not in output


def test_evaluate_on_rank_0_while_rank_1_ends_fails_on_both_naming_the_other_call(tmp_path):
    output = run(tmp_path, "end")
    assert "This worker (rank 0) called evaluate() as its collective number 2, but rank 1 called end()" in output
    assert "This worker (rank 1) called end() as its collective number 2, but rank 0 called evaluate()" in output
    assert "returned" not in output
