"""`distributed_costs` (`recipes/benchmarks/distributed_costs/`): the merge events from the library's timings and
the sockets (fast), and the benchmark end to end with real workers (slow)."""

import json
import subprocess
import sys

import pytest
from helpers import REPO

from recipes.benchmarks import distributed_costs


def _line(step, instance, comm_bytes, merged_from=(), merge_bytes=None, merge_seconds=0.0):
    line = {
        "outer_step": step,
        "instance": instance,
        "comm_bytes": comm_bytes,
        "merged_from": list(merged_from),
        "merge_seconds": merge_seconds,
    }
    if merge_bytes is not None:
        line["merge_bytes"] = merge_bytes
    return line


def test_merge_events_take_the_library_timings_and_the_round_end_sockets_less_the_outer_all_reduces():
    rounds = [
        # Round 1: single-worker instances (no all-reduce), instance 1 merged into 0 (1000 bytes).
        _line(1, 0, 1000, merged_from=[1], merge_bytes=1000, merge_seconds=0.25),
        _line(1, 2, 0),
        _line(1, 3, 0),
        # Round 2: no merge.
        _line(2, 0, 300),
        _line(2, 2, 0),
        # Round 3: instance 0 (2 workers, 300 bytes of all-reduce) absorbs instance 2 (2000 bytes).
        _line(3, 0, 2300, merged_from=[2], merge_bytes=2000, merge_seconds=0.5),
        _line(3, 3, 0),
    ]
    reports = [
        {"outer_rounds": [1, 2, 3], "outer_bytes": [600, 160, 1500]},
        {"outer_rounds": [1, 2, 3], "outer_bytes": [410, 150, 1110]},
    ]
    events = distributed_costs.merge_events(reports, rounds)
    assert [e["round"] for e in events] == [1, 3]
    assert events[0] == {
        "round": 1,
        "seconds": 0.25,
        "modelled_bytes": 1000,
        "socket_bytes": 1010,
        "round_end_socket_bytes": 1010,
        "round_outer_modelled_bytes": 0,
    }
    assert events[1]["seconds"] == 0.5 and events[1]["modelled_bytes"] == 2000
    assert events[1]["round_end_socket_bytes"] == 2610
    assert events[1]["socket_bytes"] == 2610 - 300
    # Without `ss`, the socket counts are unknown rather than wrong.
    reports[1]["outer_bytes"][0] = None
    assert distributed_costs.merge_events(reports, rounds)[0]["socket_bytes"] is None


@pytest.mark.slow
@pytest.mark.multiprocess
def test_distributed_costs_script_end_to_end(tmp_path):
    out = tmp_path / "costs"
    command = [
        sys.executable,
        "-m",
        "recipes.benchmarks.distributed_costs",
        "--workers",
        "2",
        "--inner_steps",
        "4",
        "--rounds",
        "2",
        "--batch",
        "2",
        "--worker_timeout",
        "5",
        "--output_dir",
        str(out),
    ]
    result = subprocess.run(command, capture_output=True, text=True, timeout=900, cwd=REPO)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    results = json.loads((out / "distributed_costs.json").read_text())
    assert results["float32"]["payload_bytes"] == 2 * results["bfloat16"]["payload_bytes"]
    for dtype in ("bfloat16", "float32"):
        costs = results[dtype]
        assert costs["ring_model_bytes"] == 2 * (2 - 1) * costs["payload_bytes"]
        assert costs["outer_step_after_barrier_seconds"] > 0 and costs["outer_step_seconds"] > 0
        if costs["measured_bytes_per_round"] is not None:
            assert 0.5 < costs["measured_bytes_per_round"] / costs["ring_model_bytes"] < 2
    # 2 instances merge once, after round 1; the library timed it and counted its bytes.
    (merge,) = results["merges"]
    assert merge["round"] == 1 and merge["seconds"] > 0 and merge["modelled_bytes"] > 0
    assert results["checkpoint_save_seconds"] > 0
    for kind in ("exits", "hangs"):
        lost = results[f"lost_worker_{kind}"]
        assert lost["noticed_after_seconds"] is not None and lost["barrier_wait_seconds"] >= 0
        assert "1" in lost["message"]  # names the lost rank
