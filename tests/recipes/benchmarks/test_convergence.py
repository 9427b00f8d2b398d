"""`convergence` (`recipes/benchmarks/convergence/`): the comparison at equal tokens, the ratios paired by seed, the
seeds' means and curves, the to-target figures, the report, the plot (fast); and the benchmark end to end."""

import json
import math
import os
import subprocess
import sys

import pytest
from helpers import REPO

from recipes.benchmarks import convergence
from recipes.benchmarks.convergence import report as conv_report
from recipes.benchmarks.toolkit import stats
from recipes.benchmarks.toolkit.methods import METHODS
from recipes.benchmarks.toolkit.settings import shared_settings


def _method(tokens, curve, comm_bytes, measured=None, wall=10.0):
    return {
        "final_eval_ppl": curve[-1][1],
        "tokens": tokens,
        "comm_rounds": 3,
        "comm_bytes": comm_bytes,
        "measured_bytes_sent": measured if measured is not None else comm_bytes,
        "wall_seconds": wall,
        "curve": curve,
        "curve_bytes": [[comm_bytes * t / tokens, p] for t, p in curve],
        "batch_sizes": [[0, 4]],
    }


def test_compare_interpolates_at_the_smallest_final_tokens_and_checks_targets():
    methods = {
        "ddp": _method(1000, [[0, 1000.0], [500, 100.0], [1000, 50.0]], 1_000_000, wall=20.0),
        "diloco": _method(1000, [[0, 1000.0], [500, 200.0], [1000, 80.0]], 20_000),
        # Overshoots the budget: compared at 1000 tokens, between its last two points.
        "adloco": _method(1200, [[0, 1000.0], [600, 150.0], [1200, 40.0]], 12_000),
        "adloco_no_merge": {"error": "exit 1"},
    }
    summary = convergence.compare(methods)
    assert summary["equal_tokens"] == 1000
    adloco = methods["adloco"]
    expected = math.exp(math.log(150.0) + (1000 - 600) / 600 * (math.log(40.0) - math.log(150.0)))
    assert adloco["ppl_at_equal_tokens"] == pytest.approx(expected)
    assert adloco["ppl_vs_ddp"] == pytest.approx(expected / 50.0)
    assert adloco["ppl_vs_diloco"] == pytest.approx(expected / 80.0)
    assert adloco["bytes_vs_diloco"] == pytest.approx(0.6)
    assert adloco["bytes_vs_ddp"] == pytest.approx(0.012)
    assert methods["diloco"]["wall_vs_ddp"] == pytest.approx(0.5)
    targets = summary["targets"]
    assert targets["adloco bytes / diloco bytes"]["holds"] is True
    assert targets["adloco bytes / ddp bytes"]["holds"] is True
    assert targets["adloco ppl / ddp ppl at equal tokens"]["holds"] is (expected / 50.0 <= 1.05)
    report = convergence.format_report({"methods": methods, **summary})
    assert "adloco_no_merge" in report and "exit 1" in report
    assert "holds" in report


def test_compare_without_references_leaves_ratios_empty():
    methods = {"adloco": _method(1000, [[0, 100.0], [1000, 10.0]], 10)}
    summary = convergence.compare(methods)
    assert methods["adloco"]["ppl_vs_ddp"] is None
    assert summary["targets"] == {}
    assert convergence.compare({"x": {"error": "exit 124"}}) == {}


def test_a_variant_is_compared_with_its_base_method_too():
    methods = {
        "diloco": _method(1000, [[0, 1000.0], [1000, 80.0]], 20_000, wall=10.0),
        "adloco": _method(1000, [[0, 1000.0], [1000, 100.0]], 12_000, wall=10.0),
        "adloco_int8": _method(1000, [[0, 1000.0], [1000, 101.0]], 6_000, wall=8.0),
        "diloco_int4": _method(1000, [[0, 1000.0], [1000, 88.0]], 5_000, wall=12.0),
    }
    summary = convergence.compare(methods)
    int8, int4 = methods["adloco_int8"], methods["diloco_int4"]
    assert int8["ppl_vs_adloco"] == pytest.approx(1.01) and int8["ppl_vs_diloco"] == pytest.approx(101 / 80)
    assert int8["bytes_vs_adloco"] == pytest.approx(0.5) and int8["wall_vs_adloco"] == pytest.approx(0.8)
    assert int4["ppl_vs_diloco"] == pytest.approx(1.1) and int4["bytes_vs_diloco"] == pytest.approx(0.25)
    assert "ppl_vs_adloco" not in int4 and "ppl_vs_adloco" not in methods["adloco"]
    report = convergence.format_report({"methods": methods, **summary})
    assert (
        "adloco_int8 vs adloco: ppl at equal tokens 1.010 (1 seed), bytes (model) 0.500x, bytes (measured) 0.500x, "
        "wall 0.800x"
    ) in report
    assert "diloco_int4 vs diloco: ppl at equal tokens 1.100 (1 seed), bytes (model) 0.250x" in report
    assert "adloco vs" not in report and "diloco vs" not in report
    rows = [line for line in report.splitlines() if line.startswith("| adloco_int8 ")]
    assert len(rows) == 1 and rows[0].count("(1 seed)") == 1  # its ppl/diloco cell (no ddp ran: ppl/ddp is -)


def test_plot_writes_a_png(tmp_path):
    pytest.importorskip("matplotlib")
    settings = shared_settings(convergence.parse_args(["--quick"]))
    methods = {
        "ddp": _method(1000, [[0, 1000.0], [1000, 50.0]], 1_000_000),
        "adloco": _method(1000, [[0, 1000.0], [1000, 60.0]], 10_000),
        "broken": {"error": "exit 1"},
    }
    path = convergence.plot({"methods": methods, "settings": settings}, str(tmp_path / "c.png"))
    assert os.path.getsize(path) > 1000


def _seed_run(curve, **extra):
    """A per-seed result as the worker writes it: curve [[tokens, ppl]] and one eval point per curve point."""
    evals = [
        {
            "tokens": t,
            "eval_ppl": p,
            "seconds": t / 100,
            "inner_steps": t // 10,
            "rounds": t // 100,
            "comm_bytes": 2 * t,
        }
        for t, p in curve
    ]
    run = _method(curve[-1][0], [[0, 1000.0], *curve], 2 * curve[-1][0])
    run.update(evals=evals, steps=curve[-1][0] // 10, epochs=0.5, max_worker_epochs=0.6, rounds=curve[-1][0] // 100)
    run.update(extra)
    return run


def test_the_report_says_what_a_curve_follows():
    # The report says what a curve is; the instances' mean is averaged over seeds like the curve.
    merged = convergence.aggregate(
        {
            1: _seed_run([[500, 100.0]], curve_kind="merged", curve_instances_mean=[[0, 1000.0], [500, 50.0]]),
            2: _seed_run([[500, 400.0]], curve_kind="merged", curve_instances_mean=[[0, 1000.0], [500, 200.0]]),
        }
    )
    assert merged["curve_kind"] == "merged"
    assert stats.interpolate_curve(merged["curve_instances_mean"], 500) == pytest.approx(100.0)
    older = _seed_run([[500, 100.0]])  # written before curve_kind: several instances meant their mean
    older["evals"][0]["instance_losses"] = {"0": 4.0, "1": 5.0}
    assert convergence.aggregate({1: older})["curve_kind"] == "instances_mean"
    assert convergence.aggregate({1: _seed_run([[500, 100.0]])})["curve_kind"] == "model"
    report = convergence.format_report(
        {"methods": {"adloco": merged, "ddp": convergence.aggregate({1: _seed_run([[500, 90.0]])})}}
    )
    assert "adloco: its curve is the merged model's" in report and "ddp:" not in report


def test_seeds_are_averaged_and_ratios_paired_by_seed():
    ddp = convergence.aggregate(
        {1: _seed_run([[500, 100.0], [1000, 50.0]]), 2: _seed_run([[500, 120.0], [1000, 60.0]])}
    )
    diloco = convergence.aggregate(
        {1: _seed_run([[500, 110.0], [1000, 55.0]]), 2: _seed_run([[500, 130.0], [1000, 66.0]])}
    )
    # Perplexities average geometrically, as the curves do: the mean final perplexity is the curve's last point.
    assert ddp["final_eval_ppl"] == pytest.approx(math.sqrt(50.0 * 60.0)) and ddp["final_eval_ppl_seeds"] == [
        50.0,
        60.0,
    ]
    assert ddp["final_eval_ppl_sd"] == pytest.approx(math.sqrt(50.0))
    # The mean curve averages log-perplexity: the geometric mean of the seeds.
    assert stats.interpolate_curve(ddp["curve"], 1000) == pytest.approx(math.sqrt(50.0 * 60.0))
    # Bytes repeat (rounds that send nothing): that curve is averaged evaluation by evaluation.
    by_index = convergence.mean_curve_by_index([[[0, 100.0], [0, 50.0], [10, 20.0]], [[0, 400.0], [2, 50.0]]])
    assert by_index == [[0, pytest.approx(200.0)], [1, pytest.approx(50.0)]]
    methods = {"ddp": ddp, "diloco": diloco}
    convergence.compare(methods)
    # Paired by seed: 1.1 and 1.1 -> a clear loss with no spread between seeds, although the unpaired spread of
    # the perplexities (5 and 7) is larger than the difference of the means (5.5).
    assert diloco["ppl_vs_ddp_seeds"] == [pytest.approx(1.1), pytest.approx(1.1)]
    assert diloco["ppl_vs_ddp_verdict"] == "worse"
    assert convergence.verdict([1.02, 0.97, 1.03]) == "tie"
    assert convergence.verdict([0.9, 0.92, 0.91]) == "better"
    assert convergence.verdict([0.9]) == "1 seed"
    # A seed missing on one side: fewer pairs than seeds, and the cell says so.
    diloco["ppl_vs_ddp_seeds"] = [1.1]
    assert "[n=1/2]" in conv_report.ratio_cell(diloco, "ddp")
    report = convergence.format_report({"methods": methods, **convergence.compare(methods)})
    assert "worse" in report and "±" in report


def test_a_split_by_speed_is_compared_with_equal_batches_per_round_and_with_no_slow_worker():
    names = ("diloco_slow1", "diloco_balanced", "adloco_slow1", "adloco_balanced")
    for name in names:
        assert METHODS[name]["slow_workers"] == {"workers": [3], "cores": 0.25}
    assert METHODS["diloco_balanced"]["equal_batches"] == "diloco_slow1"
    assert METHODS["adloco_balanced"]["equal_batches"] == "adloco_slow1"
    # Seed by seed: the same tokens and rounds, the balanced rounds 0.5 and 0.6 × as long as equal batches'.
    diloco = convergence.aggregate({1: _seed_run([[1000, 50.0]]), 2: _seed_run([[1000, 60.0]])})
    slow = convergence.aggregate(
        {1: _seed_run([[1000, 50.0]], wall_seconds=40.0), 2: _seed_run([[1000, 60.0]], wall_seconds=50.0)}
    )
    balanced = convergence.aggregate(
        {1: _seed_run([[1000, 50.5]], wall_seconds=20.0), 2: _seed_run([[1000, 61.2]], wall_seconds=30.0)}
    )
    assert balanced["wall_per_round"] == pytest.approx(2.5)  # (20 + 30) / 2 s over 10 rounds
    methods = {"diloco": diloco, "diloco_slow1": slow, "diloco_balanced": balanced}
    summary = convergence.compare(methods)
    assert balanced["wall_per_round_vs_diloco_slow1_seeds"] == [pytest.approx(0.5), pytest.approx(0.6)]
    assert balanced["wall_per_round_vs_diloco_slow1"] == pytest.approx(0.55)
    assert balanced["ppl_vs_diloco_seeds"] == [pytest.approx(1.01), pytest.approx(1.02)]
    targets = summary["targets"]
    assert targets["diloco_balanced wall per round / diloco_slow1"]["holds"] is True
    within = targets["diloco_balanced ppl / diloco ppl at equal tokens (within 2 %)"]
    assert within["holds"] is True and (within["low"], within["bound"]) == (0.98, 1.02)
    report = convergence.format_report({"methods": methods, **summary})
    assert "diloco_balanced vs diloco_slow1 (equal batches, the same slow worker): wall per round 0.550" in report
    assert "target 0.98 <= diloco_balanced ppl / diloco ppl at equal tokens (within 2 %) <= 1.02" in report
    # The compact record keeps the figures, the ratios and each seed's per-worker batches, round by round.
    slow["seed_results"][1]["round_log"] = [
        {"worker_batch_sizes": {"0": [4, 4, 4, 4]}, "worker_sample_seconds": {"0": [0.01, 0.01, 0.01, 0.03]}},
        {"worker_batch_sizes": {"0": [5, 5, 5, 1]}, "worker_sample_seconds": {"0": [0.01, 0.01, 0.01, 0.04]}},
    ]
    kept = convergence.summary({"methods": methods, "seeds": [1, 2], "settings": {}, **summary})
    assert kept["methods"]["diloco_balanced"]["wall_per_round_vs_diloco_slow1"] == pytest.approx(0.55)
    assert kept["methods"]["diloco_slow1"]["per_seed"][1]["worker_batch_sizes"] == {"0": [[4, 4, 4, 4], [5, 5, 5, 1]]}
    assert kept["targets"] == summary["targets"] and "seed_results" not in kept["methods"]["diloco"]
    # 5 % worse is outside the 2 %.
    balanced["seed_results"][2]["curve"][-1][1] = 66.0
    assert (
        convergence.compare(methods)["targets"]["diloco_balanced ppl / diloco ppl at equal tokens (within 2 %)"][
            "holds"
        ]
        is False
    )


def test_a_seed_that_failed_is_left_out_and_named():
    method = convergence.aggregate({1: _seed_run([[1000, 50.0]]), 2: {"error": "exit 1"}})
    assert method["seeds"] == [1] and method["failed_seeds"] == [2]
    assert method["final_eval_ppl"] == pytest.approx(50.0)
    assert convergence.aggregate({1: {"error": "exit 124"}})["error"] == "exit 124"


def test_to_target_interpolates_the_first_crossing_in_log_perplexity():
    points = [
        {"eval_ppl": 1000.0, "tokens": 0, "inner_steps": 0, "rounds": 0, "comm_bytes": 0, "seconds": 0.0},
        {"eval_ppl": 200.0, "tokens": 100, "inner_steps": 10, "rounds": 1, "comm_bytes": 40, "seconds": 5.0},
        {"eval_ppl": 50.0, "tokens": 300, "inner_steps": 30, "rounds": 3, "comm_bytes": 120, "seconds": 9.0},
        {"eval_ppl": 80.0, "tokens": 400, "inner_steps": 40, "rounds": 4, "comm_bytes": 160, "seconds": 11.0},
    ]
    # 100 lies halfway between 200 and 50 in log-perplexity.
    reached = convergence.reach(points, 100.0)
    assert reached == {
        "tokens": pytest.approx(200), "inner_steps": pytest.approx(20), "rounds": pytest.approx(2),
        "bytes": pytest.approx(80), "seconds": pytest.approx(7.0),
    }  # fmt: skip
    assert convergence.reach(points, 1000.0)["tokens"] == 0
    assert convergence.reach(points, 40.0) is None
    # Targets: reached by every run, the hardest at the worst run's best perplexity, rounded up.
    assert stats.choose_targets([50.0, 75.0]) == [98.0, 83.0, 75.0]
    assert stats.nice_ceiling(187.3) == 190 and stats.nice_ceiling(9.71) == pytest.approx(9.8)
    assert stats.choose_targets([float("nan")]) == []
    # A non-finite evaluation is no crossing.
    assert convergence.reach([dict(points[0], eval_ppl=float("nan")), *points[1:]], 100.0)["tokens"] == pytest.approx(
        200
    )


def test_to_target_over_seeds():
    methods = {
        "ddp": convergence.aggregate({1: _seed_run([[500, 100.0], [1000, 50.0]])}),
        "adloco": convergence.aggregate({1: _seed_run([[500, 80.0], [1000, 60.0]])}),
    }
    targets = convergence.to_target(methods, {1: 1000.0})
    assert targets[-1] == 60.0  # adloco's best is the worst best
    assert all(methods[m]["to_target"][f"{t:g}"]["tokens"] is not None for m in methods for t in targets)
    assert methods["adloco"]["to_target"]["60"]["tokens"] == pytest.approx(1000)
    # A seed that never reaches a target leaves that target's mean undefined (not the mean of the others).
    two = {"x": convergence.aggregate({1: _seed_run([[1000, 50.0]]), 2: _seed_run([[1000, 70.0]])})}
    convergence.to_target(two, {1: 1000.0, 2: 1000.0})
    entry = two["x"]["to_target"]["70"]
    assert entry["tokens_seeds"][0] is not None and entry["tokens"] is not None
    for point in two["x"]["seed_results"][2]["evals"]:
        point["seconds"] = None  # this seed did not time its evaluations
    convergence.to_target(two, {1: 1000.0, 2: 1000.0})
    entry = two["x"]["to_target"]["70"]
    assert entry["seconds"] is None and entry["seconds_seeds"][0] is not None and entry["tokens"] is not None


@pytest.mark.multiprocess
def test_convergence_script_end_to_end(tmp_path):
    out = tmp_path / "convergence"
    command = [
        sys.executable,
        "-m",
        "recipes.benchmarks.convergence",
        "--quick",
        "--seeds",
        "1",
        "--methods",
        "ddp",
        "adloco",
        "--budget_tokens",
        "40960",
        "--inner_steps",
        "5",
        "--eval_every_rounds",
        "2",
        "--merge_every",
        "1",
        # The small built-in corpus (tokenised in seconds on a fresh clone).
        "--set",
        'data.corpus="builtin:python-docs"',
        "--set",
        "data.eval_blocks=32",
        "--output_dir",
        str(out),
        "--cache_dir",
        os.path.join(REPO, "outputs", "cache"),
    ]
    result = subprocess.run(command, capture_output=True, text=True, timeout=900, cwd=REPO)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    results = json.loads((out / "results.json").read_text())
    assert set(results["methods"]) == {"ddp", "adloco"}
    assert results["seeds"] == [42]
    results["initial_eval_ppl"] = results["initial_eval_ppl"]["42"]
    for name, method in results["methods"].items():
        assert "error" not in method, (name, method)
        for key in ("final_eval_ppl", "tokens", "comm_rounds", "comm_bytes", "wall_seconds", "curve"):
            assert key in method, (name, key)
        assert method["tokens"] >= 40960
        assert 1 < method["final_eval_ppl"] < results["initial_eval_ppl"]
        assert method["curve"][0] == [0, results["initial_eval_ppl"]]
        assert all(len(point) == 2 for point in method["curve"])
        assert method["epochs"] <= 1 and method["to_target"], (name, method)
    ddp, adloco = results["methods"]["ddp"], results["methods"]["adloco"]
    assert ddp["comm_rounds"] == ddp["steps"] == 40960 // (4 * 4 * 128)
    adloco = adloco["seed_results"]["42"]
    assert adloco["comm_bytes"] < ddp["comm_bytes"]
    # The 4 instances merged down to one; the last curve point is the merged model.
    assert adloco["instances"][-1][1] == 1
    assert adloco["evals"][-1]["prefix"] == "eval_merged"
    if ddp["measured_bytes_sent"] is not None:
        # Gloo's own algorithm and the store's messages differ from the ring model, by less than a factor of 2.
        assert 0.5 < ddp["measured_bytes_sent"] / ddp["comm_bytes"] < 2
    assert (out / "convergence.png").exists()
