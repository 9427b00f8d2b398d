"""`make gpu-check`'s steps: the command of each (the CUDA tests, short runs of `convergence` and `overhead`), and one
row per step from their exit codes, outputs and result files."""

import json
import os
import re
import sys

from recipes.benchmarks.toolkit.results import human_bytes
from recipes.benchmarks.toolkit.stats import ratio


__all__ = [
    "COMM_METHODS",
    "RUNS",
    "SHORT",
    "STEPS",
    "TRAIN",
    "method_result",
    "pytest_counts",
    "step_commands",
    "summarise",
]

STEPS = (
    "cuda tests",
    "4 workers, gloo, fp16",
    "1 worker, gloo, fp16",
    "1 worker, nccl, fp16, auto",
    "overhead",
    "4 workers, gloo, fp16, comm",
)
# The training steps and their output folders.
RUNS = {"4 workers, gloo, fp16": "gloo4", "1 worker, gloo, fp16": "gloo1", "1 worker, nccl, fp16, auto": "nccl1"}
# The communication options of the outer step (issues 14 and 15), each a method of `convergence`.
COMM_METHODS = ("diloco_overlap_int4", "adloco")
# A short run of MicroLlama's architecture (the CUDA quick profile of `convergence`), one seed, fixed batch.
SHORT = ["--device", "cuda", "--fp16", "--quick", "--seeds", "1", "--budget_tokens", "204800"]
TRAIN = [*SHORT, "--methods", "diloco"]


def step_commands(output_dir: str) -> dict[str, list[str]]:
    """The command of every step (run from the repository root)."""
    python = sys.executable
    convergence = [python, "-m", "recipes.benchmarks.convergence", *TRAIN]
    return {
        "cuda tests": [python, "-m", "pytest", "-m", "cuda", "-q", "-rA", "tests"],
        "4 workers, gloo, fp16": [*convergence, "--output_dir", os.path.join(output_dir, "gloo4")],
        "1 worker, gloo, fp16": [
            *convergence,
            "--output_dir",
            os.path.join(output_dir, "gloo1"),
            "--set",
            "world_size=1",
        ],
        "1 worker, nccl, fp16, auto": [
            *convergence,
            "--output_dir",
            os.path.join(output_dir, "nccl1"),
            "--set",
            "world_size=1",
            "--set",
            "backend=nccl",
            "--set",
            'adloco.max_batch_size="auto"',
        ],  # fmt: skip
        "overhead": [
            python,
            "-m",
            "recipes.benchmarks.overhead",
            "--device",
            "cuda",
            "--fp16",
            "--quick",
            "--output_dir",
            os.path.join(output_dir, "overhead"),
        ],  # fmt: skip
        "4 workers, gloo, fp16, comm": [
            python,
            "-m",
            "recipes.benchmarks.convergence",
            *SHORT,
            "--methods",
            *COMM_METHODS,
            "--output_dir",
            os.path.join(output_dir, "comm"),
        ],
    }


def pytest_counts(output: str) -> dict[str, int]:
    """`{"passed": n, "failed": n, "skipped": n, "error": n}` from pytest's last summary line."""
    counts = {}
    for number, word in re.findall(r"(\d+) (passed|failed|skipped|errors?|deselected)", output):
        counts[word.rstrip("s") if word.startswith("error") else word] = int(number)
    return counts


def method_result(folder: str, name: str = "diloco") -> dict | None:
    """Method `name`'s run in a `convergence` output folder (its only seed), or None when it did not finish."""
    path = os.path.join(folder, "results.json")
    if not os.path.exists(path):
        return None
    with open(path, encoding="utf-8") as f:
        method = json.load(f)["methods"].get(name, {})
    runs = [r for r in method.get("seed_results", {}).values() if "error" not in r]
    return runs[0] if runs else None


def summarise(outcomes: dict[str, dict], output_dir: str) -> list[dict]:
    """One row per step (and the throughput comparison) from the steps' exit codes, outputs and result files."""
    rows = []
    tests = outcomes.get("cuda tests")
    if tests is not None:
        counts = pytest_counts(tests["output"])
        ok = tests["code"] == 0 and counts.get("passed", 0) > 0
        rows.append({"step": "cuda tests", "ok": ok, "result": ", ".join(f"{v} {k}" for k, v in counts.items())})
    runs = {}
    for step, folder in RUNS.items():
        if step not in outcomes:
            continue
        result = method_result(os.path.join(output_dir, folder))
        runs[step] = result
        if result is None:
            rows.append({"step": step, "ok": False, "result": f"no result (exit {outcomes[step]['code']})"})
            continue
        detail = f"{result['tokens_per_second']:,.0f} tokens/s, ppl {result['final_eval_ppl']:.1f}"
        if result.get("peak_memory_bytes") is not None:
            detail += f", peak memory {human_bytes(result['peak_memory_bytes'])} (one worker)"
        if folder == "nccl1":
            detail += f", max_batch_size auto -> {result.get('max_batch_size')}"
        rows.append({"step": step, "ok": outcomes[step]["code"] == 0, "result": detail})
    if all(runs.get(s) for s in ("4 workers, gloo, fp16", "1 worker, gloo, fp16")):
        four, one = runs["4 workers, gloo, fp16"], runs["1 worker, gloo, fp16"]
        speedup = ratio(four["tokens_per_second"], one["tokens_per_second"])
        rows.append({"step": "4 workers / 1 worker", "ok": True, "result": f"tokens/s x {speedup:.2f}"})
    if "overhead" in outcomes:
        path = os.path.join(output_dir, "overhead", "results.json")
        if os.path.exists(path):
            with open(path, encoding="utf-8") as f:
                overhead = json.load(f)
            detail = f"AdLoCo / Trainer tokens/s {overhead.get('throughput_ratio', float('nan')):.3f}"
            rows.append({"step": "overhead", "ok": outcomes["overhead"]["code"] == 0, "result": detail})
        else:
            rows.append(
                {"step": "overhead", "ok": False, "result": f"no result (exit {outcomes['overhead']['code']})"}
            )
    comm = outcomes.get("4 workers, gloo, fp16, comm")
    if comm is not None:
        for name in COMM_METHODS:
            result = method_result(os.path.join(output_dir, "comm"), name)
            if result is None:
                rows.append({"step": f"comm: {name}", "ok": False, "result": f"no result (exit {comm['code']})"})
                continue
            detail = f"{result['tokens_per_second']:,.0f} tokens/s, ppl {result['final_eval_ppl']:.1f}"
            rows.append({"step": f"comm: {name}", "ok": comm["code"] == 0, "result": detail})
    for row in rows:
        row["ok"] = "ok" if row["ok"] else "FAILED"
    return rows
