"""`make gpu-check`: everything that needs CUDA, in one run of about 12 minutes on one H100, summed up in one table.

The library is developed on CPU machines; this is what to run whenever a GPU is at hand. Steps, in order (each runs
even if an earlier one failed; its outcome is a row of the table):

| step | what it runs | reported |
|---|---|---|
| `cuda tests` | `pytest -m cuda` (fp16 with a real GradScaler and an overflow step, `max_batch_size="auto"`) | passed / failed |
| `4 workers, gloo, fp16` | `convergence --device cuda --fp16 --methods diloco`: 4 workers share the GPU over gloo | tokens/s, final ppl, peak memory |
| `1 worker, gloo, fp16` | the same with one worker (same per-worker batch) | tokens/s, final ppl, peak memory |
| `4 workers / 1 worker` | tokens/s of the two runs above, same backend and batch (the paper's claim: several workers sharing a GPU train faster) | ratio |
| `1 worker, nccl, fp16, auto` | one worker over NCCL with `max_batch_size="auto"` | found max batch, peak memory, tokens/s |
| `overhead` | `overhead --device cuda --fp16 --quick`: AdLoCo's throughput against the plain Trainer on the GPU | throughput ratio |
| `4 workers, gloo, fp16, comm` | `convergence --methods diloco_overlap_int4 adloco`: the int4 ring with error feedback on a thread with its own CUDA stream, the overlapped outer step, merges by all-reduce, merged-model evaluation | tokens/s, final ppl, per method |

    make gpu-check                                     # from the repository root; exits 1 when a step failed
    python -m recipes.benchmarks.gpu_check --skip overhead

On a CUDA image whose torch is not the pinned 2.13.0 (the built-in corpus is made of its source), export the corpus
where the pins are installed and point the GPU machine at it; `make gpu-check` would reinstall torch, so call the
module with the image's own Python there (its transformers and accelerate serve when in the supported range,
`adloco_hf/common/versions.py`):

    python -m adloco_hf.data.corpus_export .corpus                                # on a machine with the pins
    ADLOCO_SOURCE_CORPUS=$PWD/.corpus python -m recipes.benchmarks.gpu_check     # on the GPU machine

Outputs in `--output_dir` (default `outputs/benchmarks/gpu_check`): `results.json`, `table.md`, and each step's
folder and log. Without a visible CUDA device it runs nothing and exits 2 with a message.
"""

import argparse
import json
import os
import re
import subprocess
import sys
import time

from recipes.benchmarks._common import REPO, human_bytes, ratio, table, write_json


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


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--output_dir", default="outputs/benchmarks/gpu_check")
    parser.add_argument("--skip", nargs="*", default=[], choices=STEPS, help="Steps to leave out.")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print("gpu-check: no CUDA device is visible (torch.cuda.is_available() is False); nothing was run.")
        return 2
    os.chdir(REPO)
    output_dir = os.path.abspath(args.output_dir)
    os.makedirs(output_dir, exist_ok=True)
    device = f"{torch.cuda.get_device_name()} ({human_bytes(torch.cuda.get_device_properties(0).total_memory)})"
    print(f"gpu-check on {device}, torch {torch.__version__}, CUDA {torch.version.cuda}", flush=True)
    outcomes = {}
    for step, command in step_commands(output_dir).items():
        if step in args.skip:
            continue
        print(f"--- {step}: {' '.join(command)}", flush=True)
        start = time.perf_counter()
        proc = subprocess.run(command, cwd=REPO, capture_output=True, text=True)
        output = proc.stdout + proc.stderr
        with open(os.path.join(output_dir, re.sub(r"\W+", "_", step) + ".log"), "w", encoding="utf-8") as f:
            f.write(output)
        outcomes[step] = {"code": proc.returncode, "seconds": time.perf_counter() - start, "output": output[-20000:]}
        print(output[-1500:], flush=True)
        print(f"--- {step}: exit {proc.returncode} in {outcomes[step]['seconds']:.0f}s", flush=True)
    rows = summarise(outcomes, output_dir)
    report = f"gpu-check on {device}\n\n" + table(rows, ["step", "ok", "result"])
    with open(os.path.join(output_dir, "table.md"), "w", encoding="utf-8") as f:
        f.write(report + "\n")
    write_json(os.path.join(output_dir, "results.json"), {"device": device, "rows": rows, "steps": outcomes})
    print(report)
    return 0 if all(row["ok"] == "ok" for row in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
