"""`overhead` (`recipes/benchmarks/overhead/`): each comparison's summary of paired repeats and its report, the
shards the stream reads, the loader processes' figure (fast, no training), and the benchmark end to end (slow)."""

import json
import os
import shutil
import subprocess
import sys

import datasets
import pytest
from helpers import REPO

from recipes.benchmarks import overhead
from recipes.benchmarks.overhead import loader_processes, streaming


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


def run(repeat, variant, tps):
    return {"repeat": repeat, "variant": variant, "tokens_per_second": tps}


def test_the_streaming_ratio_pairs_the_variants_within_each_repeat():
    runs = [
        run(0, "materialised", 100.0), run(0, "streamed", 90.0),
        run(1, "streamed", 110.0), run(1, "materialised", 100.0),
        run(2, "materialised", 200.0), run(2, "streamed", 196.0),
        run(3, "materialised", 1.0),  # incomplete: left out
    ]  # fmt: skip
    summary = streaming.summarize(runs)
    assert summary["repeats"] == 3
    assert summary["throughput_ratio"] == pytest.approx(0.98)  # median of 0.9, 1.1, 0.98, not of the pooled tokens/s
    assert summary["throughput_ratio_spread"]["min"] == pytest.approx(0.9)
    assert summary["tokens_per_second"] == {"materialised": 100.0, "streamed": 110.0}
    assert summary["holds"] is True
    missed = streaming.summarize([run(0, "materialised", 100.0), run(0, "streamed", 94.0)])
    report = streaming.format_report({**missed, "stream_tokens_per_second": 1e5})
    assert missed["holds"] is False and "criterion >= 0.95: MISSED" in report
    assert "the stream alone (tokenise + pack, no training): 100,000 tokens/s" in report
    with pytest.raises(ValueError, match="no repeat ran every variant"):
        streaming.summarize([run(0, "streamed", 1.0)])


def test_the_shards_hold_the_train_documents_in_order_once(tmp_path):
    texts = datasets.Dataset.from_dict(
        {"text": [f"doc {i}" for i in range(37)], "split": ["eval" if i % 9 == 0 else "train" for i in range(37)]}
    )
    files = overhead.write_shards(texts, str(tmp_path), num_shards=4)
    assert [os.path.basename(f) for f in files] == [f"c4-train.{i:05d}-of-00004.json" for i in range(4)]
    rows = [[json.loads(line) for line in open(f)] for f in files]
    assert [len(r) for r in rows] == [8, 8, 8, 8]  # 32 train documents, contiguous slices
    assert [row["text"] for r in rows for row in r] == [f"doc {i}" for i in range(37) if i % 9]
    assert set(rows[0][0]) == {"text", "timestamp", "url"}  # C4's schema
    stamp = os.stat(files[0]).st_mtime_ns
    assert overhead.write_shards(texts, str(tmp_path), num_shards=4) == files
    assert os.stat(files[0]).st_mtime_ns == stamp  # cached: not written again


def test_the_loader_processes_ratio_pairs_each_kind_within_each_repeat():
    runs = [run(0, "map", 100.0), run(0, "map_loader", 90.0), run(0, "stream", 80.0), run(0, "stream_loader", 88.0)]
    runs += [run(1, "map", 200.0), run(1, "map_loader", 190.0), run(1, "stream", 50.0), run(1, "stream_loader", 45.0)]
    runs.append(run(2, "map", 1.0))  # incomplete: left out
    summary = loader_processes.summarize(runs, {"loader_processes": 2})
    assert summary["repeats"] == 2 and summary["loader_processes"] == 2
    map_, stream = summary["kinds"]["map"], summary["kinds"]["stream"]
    assert map_["without"]["values"] == [100.0, 200.0] and map_["with"]["values"] == [90.0, 190.0]
    assert map_["ratio"]["values"] == pytest.approx([0.9, 0.95])
    assert stream["ratio"]["values"] == pytest.approx([1.1, 0.9])
    assert stream["ratio"]["median"] == pytest.approx(1.0) and stream["ratio"]["min"] == pytest.approx(0.9)
    assert "with 2 loader processes" in loader_processes.format_report(summary)


def test_the_loader_processes_figure_is_drawn_from_its_results_file(tmp_path):
    """`--plot_only` draws the committed loader_processes results' figure without running anything."""
    results_file = tmp_path / "loader.json"
    shutil.copy(os.path.join(REPO, "docs", "results", "loader_processes_cpu.json"), results_file)
    overhead.main(["--plot_only", str(results_file)])
    figure = tmp_path / "loader.png"
    assert figure.exists() and figure.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


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
    assert {r["variant"] for r in results["runs"]} == set(overhead.VARIANTS)
    assert all(r["tokens_per_second"] > 0 for r in results["runs"])
