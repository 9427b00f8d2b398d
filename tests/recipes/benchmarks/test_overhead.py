"""`overhead` (`recipes/benchmarks/overhead/`): its summary of paired repeats (fast), and the benchmark end to end
(slow)."""

import json
import os
import subprocess
import sys

import pytest
from helpers import REPO

from recipes.benchmarks import overhead


def _run(variant, repeat, tps, step, round_end, end_of_round):
    return {
        "variant": variant,
        "repeat": repeat,
        "tokens_per_second": tps,
        "tokens_per_cpu_second": tps,
        "ordinary_steps": [step] * 24,
        "round_end_steps": [round_end],
        "end_of_round": [end_of_round],
    }


def test_overhead_summary_pairs_repeats_and_scales_to_round_time():
    runs = []
    for repeat, scale in enumerate([1.0, 2.0, 1.0]):  # repeat 1 ran on a twice slower machine: the ratio holds
        runs += [
            _run("trainer", repeat, 1000.0 / scale, 0.1 * scale, 0.1 * scale, 0.0),
            # The round-end step is 2 ms slower with or without statistics (e.g. its position): not the statistics'.
            _run("adloco", repeat, 980.0 / scale, 0.1 * scale, 0.102 * scale, 0.01 * scale),
            _run("adloco_stats", repeat, 970.0 / scale, 0.1 * scale, 0.152 * scale, 0.01 * scale),
        ]
    runs.append(_run("trainer", 3, 5000.0, 0.1, 0.1, 0.0))  # an incomplete repeat is left out
    summary = overhead.summarize(runs, {"inner_steps": 25})
    assert summary["repeats"] == 3
    assert summary["throughput_ratio"] == pytest.approx(0.98)
    assert summary["throughput_ratio_spread"]["max"] == pytest.approx(0.98)
    assert summary["throughput_ratio_with_stats"] == pytest.approx(0.97)
    # Pooled medians: 2 of 3 repeats ran at scale 1.
    assert summary["stats_step_extra_seconds"] == pytest.approx(0.05)
    assert summary["stats_step_extra_within_run_seconds"] == pytest.approx(0.052)
    assert summary["outer_step_seconds"] == pytest.approx(0.01)
    assert summary["throughput_ratio_from_step_medians"] == pytest.approx(25 * 0.1 / (24 * 0.1 + 0.102 + 0.01))
    assert set(summary["stats_overhead"]) == {"25", "50", "200"}
    assert summary["stats_overhead"]["50"] == pytest.approx(0.05 / (50 * 0.1 + 0.01))
    assert summary["stats_overhead"]["200"] == pytest.approx(0.05 / (200 * 0.1 + 0.01))
    assert summary["outer_overhead"]["200"] == pytest.approx(0.01 / (200 * 0.1 + 0.01))
    assert "throughput_ratio" in overhead.format_report(summary)
    with pytest.raises(ValueError):
        overhead.summarize([_run("trainer", 0, 1.0, 0.1, 0.1, 0.0)], {"inner_steps": 25})


@pytest.mark.slow
def test_overhead_script_end_to_end(tmp_path):
    out = tmp_path / "overhead"
    command = [
        sys.executable,
        "-m",
        "recipes.benchmarks.overhead",
        "--quick",
        "--inner_steps",
        "5",
        "--rounds",
        "3",
        "--warmup",
        "2",
        "--repeats",
        "2",
        "--output_dir",
        str(out),
        "--cache_dir",
        os.path.join(REPO, "outputs", "cache"),
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    result = subprocess.run(command, capture_output=True, text=True, timeout=600, env=env, cwd=REPO)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    results = json.loads((out / "results.json").read_text())
    assert 0.2 < results["throughput_ratio"] < 5
    assert 0.2 < results["throughput_ratio_with_stats"] < 5
    assert results["throughput_ratio_spread"]["n"] == 2
    assert set(results["stats_overhead"]) >= {"50", "200"}
    for value in results["stats_overhead"].values():
        assert 0 <= value < 1
    assert results["stats_overhead"]["200"] <= results["stats_overhead"]["50"]
    assert results["outer_step_seconds"] >= 0
    assert {run["variant"] for run in results["runs"]} == set(overhead.VARIANTS)
    assert all(run["tokens_per_second"] > 0 for run in results["runs"])
