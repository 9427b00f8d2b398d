"""`recipes/benchmarks/goodput_report/`: issue 25's targets from links' and convergence's results (no training)."""

import json
import math

import pytest

from recipes.benchmarks import goodput_report as report


def test_time_to_a_perplexity_interpolates_log_perplexity_between_evaluations():
    curve = [(0.0, 1000.0), (10.0, 100.0), (20.0, 10.0)]
    assert report.time_to(curve, 100.0) == 10.0
    assert report.time_to(curve, math.sqrt(1000.0 * 100.0)) == pytest.approx(5.0)
    assert report.time_to(curve, 5.0) is None  # never reached
    assert report.time_to(curve, 2000.0) == 0.0


def run(final, wall, curve=None):
    return {"final_eval_ppl": final, "wall_seconds": wall, "curve": curve or []}


def test_the_wall_ratio_takes_the_best_fixed_batchs_final_perplexity_and_time():
    runs = {
        "diloco_b4": run(50.0, 100.0),
        "diloco_b8": run(55.0, 60.0),
        "diloco_b16": run(70.0, 40.0),
        "adloco_goodput": run(45.0, 120.0, [[0.0, 0, 1000.0], [40.0, 1, 100.0], [80.0, 2, 40.0]]),
    }
    figures = report.wall_ratio(runs, lambda r: [(s, p) for s, _, p in r["curve"]])
    assert figures["best_fixed"] == "diloco_b4" and figures["target_ppl"] == 50.0
    # From 100 at 40 s to 40 at 80 s: 50 at 40 + 40 × log(100/50) / log(100/40) s.
    expected = 40.0 + 40.0 * math.log(2.0) / math.log(2.5)
    assert figures["goodput_seconds_to_target"] == pytest.approx(expected)
    assert figures["ratio"] == pytest.approx(expected / 100.0)
    slow = dict(runs, adloco_goodput=run(60.0, 200.0, [[0.0, 0, 1000.0], [200.0, 1, 60.0]]))
    assert report.wall_ratio(slow, lambda r: [(s, p) for s, _, p in r["curve"]])["ratio"] is None
    assert report.wall_ratio({"diloco_b4": run(50.0, 100.0)}, lambda r: []) is None


def test_merges_are_counted_in_bf16_model_times_of_the_link(tmp_path):
    rounds = tmp_path / "adloco_rounds.jsonl"
    lines = [
        {"outer_step": 1, "merged_from": [], "merge_seconds": 0.0},
        {"outer_step": 2, "merged_from": [1], "merge_seconds": 0.2},
        {"outer_step": 4, "merged_from": [3], "merge_seconds": 0.5},
    ]
    rounds.write_text("".join(json.dumps(line) + "\n" for line in lines))
    entry = {"bandwidth_bits_per_second": 1e8, "timings": {"rounds_file": str(rounds)}}
    model_seconds = 2 * 10**6 * 8 / 1e8  # one bf16 copy of 1 M parameters at 100 Mbit/s
    assert report.merge_times(entry, 10**6) == pytest.approx([0.2 / model_seconds, 0.5 / model_seconds])
    assert report.merge_times({"timings": {}}, 10**6) == []


def test_convergence_gives_the_ratio_at_equal_tokens_and_the_time_without_a_link_limit():
    def seed_run(final, wall, evals, curve):
        return {"final_eval_ppl": final, "wall_seconds": wall, "evals": evals, "curve": curve}

    b4 = seed_run(50.0, 100.0, [{"seconds": 100.0, "eval_ppl": 50.0}], [[0, 1000.0], [1000, 50.0]])
    goodput = seed_run(
        45.0,
        90.0,
        [{"seconds": 45.0, "eval_ppl": 60.0}, {"seconds": 90.0, "eval_ppl": 45.0}],
        [[0, 1000.0], [800, 60.0], [1500, 45.0]],
    )
    results = {
        "seeds": [42],
        "initial_eval_ppl": {"42": 1000.0},
        "methods": {"diloco_b4": {"seed_results": {"42": b4}}, "adloco_goodput": {"seed_results": {"42": goodput}}},
    }
    (row,) = report.convergence_figures(results)
    assert row["tokens"] == 1000
    at_1000 = math.exp(math.log(60.0) + (200 / 700) * (math.log(45.0) - math.log(60.0)))
    assert row["ppl_vs_b4"] == pytest.approx(at_1000 / 50.0)
    assert row["wall"]["ratio"] == pytest.approx((45.0 + 45.0 * math.log(60.0 / 50.0) / math.log(60.0 / 45.0)) / 100.0)
    assert report.verdict([0.9, 1.1], 1.05) == "holds" and report.verdict([1.0, None], 1.05) == "MISSED"


def test_the_report_puts_links_and_convergence_targets_side_by_side(tmp_path):
    curve = [[0.0, 0, 1000.0], [50.0, 1, 60.0], [100.0, 2, 40.0]]
    links = {
        "settings": {"seed": 42},
        "bandwidths": {
            bandwidth: {
                "diloco_b4": run(50.0, 100.0, curve),
                "diloco_b8": run(55.0, 80.0, curve),
                "adloco_goodput": run(45.0, 90.0, [[0.0, 0, 1000.0], [scale * 40.0, 1, 50.0]]),
            }
            for bandwidth, scale in (("10mbit", 1.0), ("100mbit", 2.0))
        },
    }
    path = tmp_path / "links.json"
    path.write_text(json.dumps(links))
    out = report.main(["--links", str(path), "--output_dir", str(tmp_path / "out")])
    targets = {t["target"]: t for t in out["adloco_goodput"]["targets"]}
    assert targets["wall 10mbit <= 0.8"]["value"] == "0.400" and targets["wall 10mbit <= 0.8"]["verdict"] == "holds"
    assert targets["wall 100mbit <= 1.0"]["value"] == "0.800"
    assert "diloco_goodput" not in out  # it did not run
    written = " ".join((tmp_path / "out" / "table.md").read_text().split())
    assert "| links | 42 | 10mbit | diloco_b4 | 50.0 | 100.0 | 40.0 | 0.400 | 45.0 | 90.0 | 0.900 |" in written
    assert out["adloco_goodput"]["rows"][0]["final / best fixed"] == pytest.approx(45.0 / 50.0)
    assert (tmp_path / "out" / "goodput.png").stat().st_size > 0
    # With the norm test beside it: the final perplexities paired by seed and setting.
    for runs in links["bandwidths"].values():
        runs["adloco_norm"] = run(60.0, 90.0, [[0.0, 0, 1000.0], [80.0, 1, 60.0]])
    path.write_text(json.dumps(links))
    out = report.main(["--links", str(path), "--output_dir", str(tmp_path / "out2")])
    paired = out["adloco_goodput"]["vs_norm_test"]
    assert paired["10mbit"]["ratios"] == pytest.approx([45.0 / 60.0]) and paired["10mbit"]["seeds"] == [42]
    assert set(paired) == {"10mbit", "100mbit"} and "vs_norm_test" not in out["adloco_norm"]


def test_merge_bytes_become_the_busiest_links_model_times():
    numel = 1000
    compact = (3 + 4 / 256) * numel  # one member's payload
    lines = [
        {"outer_step": 1, "merged_from": []},
        {"outer_step": 2, "merged_from": [1], "merge_bytes": 2 * compact},  # a ring of 2: each sends 1 payload
        {"outer_step": 6, "merged_from": [2], "merge_bytes": 6 * compact},  # a ring of 4: each sends 1.5 payloads
    ]
    times = report.merge_link_model_times(lines, numel, "compact")
    assert times == pytest.approx([compact / (2 * numel), 1.5 * compact / (2 * numel)])  # 1.51 and 2.26
    # float32 merges of 4 members: 1.5 × 8 bytes a parameter, 6 bf16 model-times.
    assert report.merge_link_model_times([dict(lines[2], merge_bytes=6 * 8 * numel)], numel, "float32") == [6.0]
