"""The benchmarks' own arithmetic (fast) and one end-to-end run of each script (slow).

Benchmarks are not tests of the library: these only check that what they report is computed right.
"""

import importlib.util
import json
import math
import os
import subprocess
import sys

import pytest


REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCHMARKS = os.path.join(REPO, "recipes", "benchmarks")
sys.path.insert(0, BENCHMARKS)

import _common  # noqa: E402


def _load(name: str):
    spec = importlib.util.spec_from_file_location(f"benchmarks_{name}", os.path.join(BENCHMARKS, f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


convergence = _load("convergence")
overhead = _load("overhead")

# Captured from `ss -tinpH` during a 4-worker gloo run (trimmed), plus three edge cases: a socket shared by two
# processes, a socket that has sent nothing (no bytes_sent field) and a socket without a `users:` field.
SS_SAMPLE = """\
ESTAB 0      0               127.0.0.1:43789          127.0.0.1:49812 users:(("python3",pid=10587,fd=16))
\t bbr wscale:10,10 rto:208 rtt:6.88/11.867 ato:40 mss:32768 pmtu:65535 rcvmss:536 advmss:65483 cwnd:23 bytes_sent:1036 bytes_acked:1036 bytes_received:1044 segs_out:35 segs_in:40 data_segs_out:21
ESTAB 0      0               127.0.0.1:43560          127.0.0.1:44613 users:(("python3",pid=10588,fd=22))
\t bbr wscale:10,10 rto:204 rtt:0.082/0.046 ato:40 mss:65483 cwnd:18 ssthresh:8 bytes_sent:2591112 bytes_acked:2591113 bytes_received:2591104 segs_out:86
ESTAB 0      0               127.0.0.1:42484          127.0.0.1:36245 users:(("python3",pid=10588,fd=8))
\t bbr wscale:10,10 rto:204 rtt:0.348/0.609 ato:40 mss:65483 cwnd:12 bytes_sent:10383062 bytes_acked:10383063 bytes_received:5194640
ESTAB 0      0               127.0.0.1:44587          127.0.0.1:55178 users:(("python",pid=10795,fd=16))
\t bbr wscale:10,10 rto:204 rtt:0.013/0.006 ato:40 mss:32768 cwnd:10 bytes_received:8 segs_out:1 segs_in:3 data_segs_in:1
ESTAB 0      0               127.0.0.1:51000          127.0.0.1:52000 users:(("python",pid=20001,fd=5),("python",pid=20002,fd=5))
\t cubic wscale:7,7 rto:204 rtt:0.01/0.005 bytes_sent:500 bytes_acked:501
ESTAB 0      0               127.0.0.1:51001          127.0.0.1:52001
\t cubic wscale:7,7 rto:204 rtt:0.01/0.005 bytes_sent:777 bytes_acked:778
"""


# ---- _common ----
def test_parse_ss_bytes_sent_sums_per_process():
    totals = _common.parse_ss_bytes_sent(SS_SAMPLE)
    assert totals[10587] == 1036
    assert totals[10588] == 2591112 + 10383062  # two sockets of one process
    assert totals[10795] == 0  # open but has sent nothing
    assert totals[20001] == totals[20002] == 500  # shared socket counts for both owners
    assert sum(totals.values()) == 1036 + 2591112 + 10383062 + 500 + 500  # the owner-less socket is ignored


def test_parse_ss_bytes_sent_ignores_blank_and_empty_output():
    assert _common.parse_ss_bytes_sent("") == {}
    assert _common.parse_ss_bytes_sent("\n\n") == {}


def test_socket_bytes_sent_of_this_process_is_a_count_or_none():
    value = _common.socket_bytes_sent()
    assert value is None or value >= 0


def test_ring_all_reduce_bytes_matches_the_library():
    from adloco_hf.outer import ring_all_reduce_bytes

    for workers in (1, 2, 4, 8):
        assert _common.ring_all_reduce_bytes(1000, workers) == ring_all_reduce_bytes(1000, workers)
    assert _common.ring_all_reduce_bytes(1000, 4) == 6000
    assert _common.ring_all_reduce_bytes(1000, 1) == 0


def test_interpolate_curve_is_exact_at_points_and_log_linear_between():
    curve = [[0, 1000.0], [100, 100.0], [200, 50.0]]
    assert _common.interpolate_curve(curve, 0) == pytest.approx(1000.0)
    assert _common.interpolate_curve(curve, 100) == pytest.approx(100.0)
    assert _common.interpolate_curve(curve, 50) == pytest.approx(math.sqrt(1000.0 * 100.0))  # geometric mean
    assert _common.interpolate_curve(curve, 150) == pytest.approx(math.exp((math.log(100) + math.log(50)) / 2))
    assert _common.interpolate_curve(curve, 201) is None
    assert _common.interpolate_curve(curve, -1) is None
    assert _common.interpolate_curve([], 5) is None


def test_interpolate_curve_sorts_and_skips_bad_points():
    curve = [[200, 50.0], [0, 1000.0], [100, float("nan")], [100, 100.0], [150, None]]
    assert _common.interpolate_curve(curve, 100) == pytest.approx(100.0)
    assert _common.interpolate_curve(curve, 200) == pytest.approx(50.0)


def test_ratio_handles_missing_and_zero():
    assert _common.ratio(3.0, 2.0) == 1.5
    assert _common.ratio(None, 2.0) is None
    assert _common.ratio(2.0, None) is None
    assert _common.ratio(2.0, 0) is None
    assert _common.ratio(2.0, float("inf")) is None


def test_median_spread():
    spread = _common.median_spread([1.0, 0.9, 1.1, 1.0, 5.0])
    assert spread["median"] == 1.0
    assert spread["min"] == 0.9 and spread["max"] == 5.0
    assert spread["n"] == 5
    assert spread["iqr_half_rel"] == pytest.approx((1.1 - 1.0) / 2)  # quartiles 1.0 and 1.1: the outlier is ignored
    assert _common.median_spread([2.0])["median"] == 2.0
    with pytest.raises(ValueError):
        _common.median_spread([])


def test_table_aligns_and_marks_missing_cells():
    text = _common.table([{"a": 1.23456, "b": "x"}, {"a": 12345.0}], ["a", "b"])
    lines = text.splitlines()
    assert len(lines) == 4
    assert len({len(line) for line in lines}) == 1
    assert "1.235" in lines[2] and "12,345" in lines[3] and lines[3].rstrip("| ").endswith("-")


def test_human_bytes():
    assert _common.human_bytes(512) == "512 B"
    assert _common.human_bytes(7_769_856) == "7.8 MB"
    assert _common.human_bytes(None) == "-"


def test_write_json_round_trip(tmp_path):
    path = tmp_path / "sub" / "r.json"
    _common.write_json(str(path), {"x": [1, 2.5]})
    assert json.loads(path.read_text()) == {"x": [1, 2.5]}
    assert [p.name for p in path.parent.iterdir()] == ["r.json"]  # no temporary file left behind


# ---- convergence.py ----
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


def test_method_specs_share_everything_but_their_own_settings(tmp_path):
    args = convergence.parse_args(["--quick", "--learning_rate", "0.002", "--set", "adloco.eta=0.5"])
    settings = convergence.shared_settings(args)
    specs = {name: convergence.method_spec(name, settings, str(tmp_path)) for name in convergence.METHODS}
    for spec in specs.values():
        assert spec["train"] == specs["ddp"]["train"]
        assert spec["train"]["learning_rate"] == 0.002
        assert spec["budget_tokens"] == specs["ddp"]["budget_tokens"]
        assert spec["seed"] == specs["ddp"]["seed"]
    assert specs["diloco"]["adloco"]["num_instances"] == 1
    assert specs["diloco"]["adloco"]["batch_size_test"] == "none"
    assert specs["adloco"]["adloco"]["num_instances"] == 4
    assert specs["adloco"]["adloco"]["eta"] == 0.5
    assert specs["adloco_no_adaptive"]["adloco"]["batch_size_test"] == "none"
    assert specs["adloco_no_merge"]["adloco"]["merge_every"] == 0
    assert specs["adloco_no_switch"]["adloco"]["switch_threshold"] >= 1e6
    assert specs["adloco_paper_outer"]["adloco"]["outer_lr"] == 0.5
    assert specs["adloco_paper_outer"]["adloco"]["outer_momentum"] == 0.0
    # Each ablation differs from `adloco` in exactly the setting it names.
    for name, changed in [
        ("adloco_no_adaptive", {"batch_size_test"}),
        ("adloco_no_merge", {"merge_every"}),
        ("adloco_no_switch", {"switch_threshold"}),
        ("adloco_paper_outer", {"outer_momentum", "outer_nesterov"}),  # the shared outer lr is already 0.5
        ("adloco_sqrt_lr", {"lr_batch_scaling"}),
    ]:
        diff = {k for k in specs["adloco"]["adloco"] if specs[name]["adloco"][k] != specs["adloco"]["adloco"][k]}
        assert diff == changed, name
    assert specs["adloco_sqrt_lr"]["adloco"]["lr_batch_scaling"] == "sqrt"
    assert specs["adloco"]["adloco"]["lr_batch_scaling"] == "none"  # the paper's AdLoCo
    with pytest.raises(SystemExit):
        convergence.shared_settings(convergence.parse_args(["--set", "adloco.no_such_key=1"]))


def test_step_bounds_cover_the_budget(tmp_path):
    worker = _load("_convergence_worker")
    settings = convergence.shared_settings(
        convergence.parse_args(["--quick", "--batch_size", "12", "--max_batch_size", "8"])
    )
    settings["cache_dir"] = str(tmp_path)
    ddp = convergence.method_spec("ddp", settings, str(tmp_path))
    per_step = ddp["world_size"] * 12 * ddp["block_size"]
    ddp_steps = worker.max_steps_for(ddp)
    assert ddp_steps * per_step >= ddp["budget_tokens"] > (ddp_steps - 1) * per_step
    assert worker.common_arguments(ddp)["lr_scheduler_type"] == "constant_with_warmup"
    # An initial request above max_batch_size runs at max_batch_size (switch mode's middle band): the bound on
    # AdLoCo's steps must still reach the budget with that smaller batch, in whole rounds.
    diloco = convergence.method_spec("diloco", settings, str(tmp_path))
    assert diloco["adloco"]["max_batch_size"] == 8
    diloco_steps = worker.max_steps_for(diloco)
    smallest = diloco["world_size"] * diloco["adloco"]["max_batch_size"] * diloco["block_size"]
    assert diloco_steps * smallest >= diloco["budget_tokens"]
    assert diloco_steps % diloco["train"]["inner_steps"] == 0


def test_plot_writes_a_png(tmp_path):
    pytest.importorskip("matplotlib")
    settings = convergence.shared_settings(convergence.parse_args(["--quick"]))
    methods = {
        "ddp": _method(1000, [[0, 1000.0], [1000, 50.0]], 1_000_000),
        "adloco": _method(1000, [[0, 1000.0], [1000, 60.0]], 10_000),
        "broken": {"error": "exit 1"},
    }
    path = convergence.plot({"methods": methods, "settings": settings}, str(tmp_path / "c.png"))
    assert os.path.getsize(path) > 1000


# ---- overhead.py ----
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


# ---- end to end ----
@pytest.mark.slow
def test_overhead_script_end_to_end(tmp_path):
    out = tmp_path / "overhead"
    command = [
        sys.executable,
        os.path.join(BENCHMARKS, "overhead.py"),
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
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": REPO}
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


@pytest.mark.slow
@pytest.mark.multiprocess
def test_convergence_script_end_to_end(tmp_path):
    out = tmp_path / "convergence"
    command = [
        sys.executable,
        os.path.join(BENCHMARKS, "convergence.py"),
        "--quick",
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
        "--output_dir",
        str(out),
        "--cache_dir",
        os.path.join(REPO, "outputs", "cache"),
    ]
    result = subprocess.run(command, capture_output=True, text=True, timeout=900, cwd=REPO)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    results = json.loads((out / "results.json").read_text())
    assert set(results["methods"]) == {"ddp", "adloco"}
    for name, method in results["methods"].items():
        assert "error" not in method, (name, method)
        for key in ("final_eval_ppl", "tokens", "comm_rounds", "comm_bytes", "wall_seconds", "curve"):
            assert key in method, (name, key)
        assert method["tokens"] >= 40960
        assert 1 < method["final_eval_ppl"] < results["initial_eval_ppl"]
        assert method["curve"][0] == [0, results["initial_eval_ppl"]]
        assert all(len(point) == 2 for point in method["curve"])
    ddp, adloco = results["methods"]["ddp"], results["methods"]["adloco"]
    assert ddp["comm_rounds"] == ddp["steps"] == 40960 // (4 * 4 * 128)
    assert adloco["comm_bytes"] < ddp["comm_bytes"]
    # The 4 instances merged down to one; the last curve point is the merged model.
    assert adloco["instances"][-1][1] == 1
    assert adloco["evals"][-1]["prefix"] == "eval_merged"
    if ddp["measured_bytes_sent"] is not None:
        # Gloo's own algorithm and the store's messages differ from the ring model, by less than a factor of 2.
        assert 0.5 < ddp["measured_bytes_sent"] / ddp["comm_bytes"] < 2
    assert (out / "convergence.png").exists()
