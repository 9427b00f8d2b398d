"""One `netfaults` scenario for real: 4 machines in network namespaces, each its own `accelerate launch
--max_restarts`, worker 3's link set down for 5 s one second into a round's outer all-reduce (root only)."""

import json
import subprocess

import pytest

from recipes.benchmarks import netfaults
from recipes.benchmarks.toolkit.testbed import unavailable_reason


@pytest.mark.slow  # ~4 minutes on 2 shared cores: the uninterrupted run and the scenario, 40 steps each
@pytest.mark.skipif(unavailable_reason() is not None, reason=f"no testbed here: {unavailable_reason()}")
def test_a_link_down_in_the_outer_all_reduce_costs_no_restart_and_changes_nothing(tmp_path):
    out, results = tmp_path / "out", tmp_path / "results"
    argv = ["--scenarios", "down_in_allreduce", "--max_steps", "40", "--output_dir", str(out)]
    report = netfaults.main([*argv, "--results_dir", str(results)])
    row = json.loads((out / "scenarios" / "down_in_allreduce.json").read_text())
    assert "error" not in row, row.get("error")
    assert report["settings"]["workers"] == 4 and row["exit_codes"] == [0, 0, 0, 0]  # 4 machines of one worker
    # asserting the world size (the worker's spec says 4) and every launch ended by itself
    assert [e["action"] for e in row["events"]] == ["cut", "restore"] and row["actions_not_applied"] == 0
    assert row["restarts"] == 0 and row["work_lost_steps"] == 0 and row["ended_by_itself"]
    assert row["merged_max_difference"] <= 1e-6
    assert (results / "netfaults.png").stat().st_size > 0
    left = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert "adnf-" not in left, left  # the namespaces are gone
