"""`make gpu-bench` (recipes/benchmarks/gpu_bench/): its pure parts, and the whole benchmark at tiny scale on the
CPU, resumed, with its generated table."""

import json
import os
import subprocess
import sys

import pytest
from helpers import REPO

from recipes.benchmarks import gpu_bench
from recipes.benchmarks.gpu_bench import report as gpu_report
from recipes.benchmarks.gpu_bench.device import device_slug, flops_per_token, mfu, peak_flops


def test_peaks_slugs_and_mfu():
    assert peak_flops("NVIDIA H100 80GB HBM3") == 989.4e12
    assert peak_flops("NVIDIA H100 PCIe") == 756e12  # the PCIe card before the SXM entry's "H100"
    assert peak_flops("NVIDIA H200") == peak_flops("NVIDIA GH200 480GB") == 989.4e12
    assert peak_flops("NVIDIA A100-SXM4-80GB") == 312e12 and peak_flops("cpu") is None
    assert device_slug("NVIDIA H100 80GB HBM3") == "nvidia-h100-80gb-hbm3"
    assert mfu(1000.0, 6e9, 1e13) == pytest.approx(0.6)
    assert mfu(None, 6e9, 1e13) is None and mfu(1000.0, 6e9, None) is None


def test_flops_per_token_counts_the_matrix_products_of_the_model():
    from adloco_hf.presets import build_model

    model = build_model("tiny", vocab_size=512, seed=0)
    flops = flops_per_token(model.config, 128)
    # Brute force: every 2-D weight but the input embedding takes part in a matrix product.
    matmul = sum(p.numel() for n, p in model.named_parameters() if p.dim() == 2 and "embed_tokens" not in n)
    assert flops["matmul_parameters"] == matmul
    config = model.config
    assert flops["flops"] == 6 * matmul + 12 * config.num_hidden_layers * config.hidden_size * 128


def test_a_later_run_continues_the_newest_unfinished_folder_of_its_device(tmp_path):
    older, newer = tmp_path / "gpu-a-2026-01-02", tmp_path / "gpu-a-2026-02-01"
    for folder in (older, newer):
        folder.mkdir()
    assert gpu_bench.choose_folder(str(tmp_path), "gpu-a", "2026-03-01") == str(newer)
    for step in gpu_bench.STEPS:  # the newer one finished: the older one still lacks its steps
        (newer / f"{step.name}.json").write_text("{}")
    assert gpu_bench.choose_folder(str(tmp_path), "gpu-a", "2026-03-01") == str(older)
    assert gpu_bench.choose_folder(str(tmp_path), "gpu-b", "2026-03-01") == str(tmp_path / "gpu-b-2026-03-01")
    assert gpu_bench.fits(gpu_bench.STEPS[0], 0.0, None)
    assert not gpu_bench.fits(gpu_bench.Step("x", "m", 5.0), 4.0, 8.5) and gpu_bench.fits(
        gpu_bench.Step("x", "m", 4.0), 4.0, 8.5
    )


def test_a_stopped_step_takes_its_process_group_with_it():
    """The step limit (or gpu_bench itself stopped): SIGTERM to the step's process group, SIGKILL after the grace."""
    import signal

    ignoring = "signal.signal(signal.SIGTERM, signal.SIG_IGN); "
    for code, grace in (("", 10.0), (ignoring, 0.5)):
        program = f"import signal, time; {code}print('ready', flush=True); time.sleep(60)"
        process = subprocess.Popen([sys.executable, "-c", program], start_new_session=True, stdout=subprocess.PIPE)
        assert process.stdout.readline().strip() == b"ready"
        gpu_bench.stop(process, grace=grace)
        assert process.poll() is not None
        assert process.returncode == (-signal.SIGTERM if grace > 1 else -signal.SIGKILL)


def test_time_to_target_interpolates_each_method_to_diloco_s_final_perplexity(tmp_path):
    def run(points):
        evals = [{"seconds": s, "tokens": 100 * s, "eval_ppl": p} for s, p in points]
        return {"evals": evals, "final_eval_ppl": points[-1][1], "wall_seconds": points[-1][0], "tokens": 100,
                "stopped_by_time_at": 10}  # fmt: skip

    runs = {"diloco": run([(0, 400), (10, 200), (20, 100)]), "adloco": run([(0, 400), (5, 200), (10, 50)]),
            "trainer": run([(0, 400), (20, 300)])}  # fmt: skip
    for method, result in runs.items():
        (tmp_path / f"target-{method}-seed1.json").write_text(json.dumps(result))
    reach = gpu_report.time_to_target(str(tmp_path), 1)
    assert reach["target_ppl"] == 100
    assert reach["methods"]["diloco"]["seconds"] == pytest.approx(20)
    # AdLoCo crosses 100 between 200 (5 s) and 50 (10 s): half way in log-perplexity, 7.5 s.
    assert reach["methods"]["adloco"]["seconds"] == pytest.approx(7.5)
    assert reach["methods"]["adloco"]["vs_diloco"] == pytest.approx(0.375)
    assert reach["methods"]["trainer"]["seconds"] is None  # never got there
    assert gpu_report.time_to_target(str(tmp_path), 2) is None


TINY_STEPS = [s.name for s in gpu_bench.STEPS if s.name not in ("throughput-300m",) and not s.name.endswith("seed2")]


@pytest.mark.multiprocess
def test_the_tiny_benchmark_runs_every_step_resumes_and_writes_its_table(tmp_path):
    """The benchmark at tiny scale on the CPU (launches of 2 workers), every step's code: MicroLlama's throughput
    step and the second seed are the same code as the 50 M step and the first seed, left out to save time."""
    folder, doc = tmp_path / "results" / "cpu-2026-01-01", tmp_path / "gpu.md"
    doc.write_text("# GPU\n\nText before the generated section stays.\n")
    command = [sys.executable, "-m", "recipes.benchmarks.gpu_bench", "--tiny", "--results_dir", str(folder),
               "--doc", str(doc), "--cache_dir", str(tmp_path / "cache"), "--steps", *TINY_STEPS]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    first = subprocess.run(command, capture_output=True, text=True, timeout=600, cwd=REPO, env=env)
    assert first.returncode == 0, first.stdout[-6000:] + first.stderr[-3000:]
    for step in TINY_STEPS:
        assert (folder / f"{step}.json").exists() and (folder / f"{step}.png").stat().st_size > 1000, step
    results = {step: json.loads((folder / f"{step}.json").read_text()) for step in TINY_STEPS}

    rows = results["throughput-50m"]["rows"]
    assert [(r["variant"], r["compiled"]) for r in rows] == [
        (v, c) for c in (False, True) for v in ("trainer", "adloco", "adloco_stats")
    ]
    for row in rows:
        assert row["tokens_per_second"] > 0 and row["ratio_to_trainer"] > 0
        assert row["compiled_is_used"] == row["compiled"]
        assert row["graphs"] >= 1 if row["compiled"] else row["graphs"] == 0
        assert row["graph_breaks"] == 0
    stats = next(r for r in rows if r["variant"] == "adloco_stats" and r["compiled"])
    assert all(line["grad_variance"] is not None for line in stats["rounds"])
    grow = results["growing-batch"]
    settings = grow["settings"]
    # The request grows (how far in 8 tiny rounds depends on the compiled kernels' rounding: 15 or 16 seen).
    sizes = grow["grown"]["sizes"]
    assert sizes[0] == settings["start"] and settings["start"] < grow["grown"]["final_batch"] <= settings["cap"]
    assert len(sizes) >= 3
    assert grow["fixed"]["graphs"] == 1 and grow["grown"]["graphs"] >= 2 and grow["ratio_to_fixed"] > 0

    runs = results["workers"]["runs"]
    assert [r["world_size"] for r in runs] == [2, 1, 2, 2]
    assert all(r["tokens_per_second"] > 0 and r["tokens"] > 0 for r in runs)
    for method in ("diloco", "adloco", "trainer"):
        target = results[f"target-{method}-seed1"]
        assert target["stopped_by_time_at"] is not None  # the time budget ended it, not the data
        assert target["world_size"] == (1 if method == "trainer" else 2)
        seconds = [p["seconds"] for p in target["evals"] if p["seconds"] is not None]
        assert len(seconds) >= 2 and seconds == sorted(seconds)

    text = doc.read_text()
    assert text.startswith("# GPU\n\nText before the generated section stays.\n")
    section = text.split(gpu_report.BEGIN)[1].split(gpu_report.END)[0]
    for title in (
        "(a) Throughput",
        "(b) Growing batch",
        "(c) Time to target, seed 1",
        "(d) 2 workers",
        "(e) Communication",
        "Targets",
    ):
        assert title in section, title
    for link in [part.split(")")[0] for part in section.split("](")[1:]]:
        assert (tmp_path / link).exists(), link
    assert (folder / "README.md").exists()
    assert len(json.loads((folder / "runs.json").read_text())) == len(TINY_STEPS)

    # A second run finds every step done: it runs none and rewrites only the tables.
    stamps = {step: (folder / f"{step}.json").stat().st_mtime_ns for step in TINY_STEPS}
    second = subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=REPO, env=env)
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
    assert f"{len(TINY_STEPS)} of {len(TINY_STEPS)} steps done" in second.stdout
    assert {step: (folder / f"{step}.json").stat().st_mtime_ns for step in TINY_STEPS} == stamps
    assert len(json.loads((folder / "runs.json").read_text())) == len(TINY_STEPS)
    # A step whose results are missing runs again, alone, here in its own process (as every step does on a GPU).
    os.remove(folder / "target-trainer-seed1.json")
    third = subprocess.run([*command, "--isolate"], capture_output=True, text=True, timeout=300, cwd=REPO, env=env)
    assert third.returncode == 0, third.stdout[-3000:] + third.stderr[-3000:]
    assert f"{len(TINY_STEPS) - 1} of {len(TINY_STEPS)} steps done" in third.stdout
    assert (
        "--- target-trainer-seed1: recipes" not in third.stdout
        and "gpu_bench.workers --step target-trainer-seed1" in third.stdout
    )
    runs = json.loads((folder / "runs.json").read_text())
    assert [run["step"] for run in runs[len(TINY_STEPS) :]] == ["target-trainer-seed1"] and runs[-1]["done"]
    assert {step: (folder / f"{step}.json").stat().st_mtime_ns for step in TINY_STEPS[:-1]} == {
        step: stamps[step] for step in TINY_STEPS[:-1]
    }
    text = doc.read_text()  # the trainer's new run changed its numbers in the table
    # --table regenerates the section from the files alone.
    doc.write_text(text.replace(section, "\nstale\n"))
    table = [
        sys.executable,
        "-m",
        "recipes.benchmarks.gpu_bench",
        "--table",
        "--results_dir",
        str(folder),
        "--doc",
        str(doc),
    ]
    assert subprocess.run(table, capture_output=True, text=True, timeout=120, cwd=REPO).returncode == 0
    assert doc.read_text() == text
