"""`python -m recipes.benchmarks.gpu_check` (`make gpu-check`): every step in order, its log, then the table."""

import argparse
import os
import re
import subprocess
import time

from recipes.benchmarks.gpu_check.steps import STEPS, step_commands, summarise
from recipes.benchmarks.toolkit.paths import REPO
from recipes.benchmarks.toolkit.results import human_bytes, table, write_json


__all__ = ["main", "parse_args"]

DESCRIPTION = (
    "`make gpu-check`: everything that needs CUDA, in one run of about 12 minutes on one H100, summed up in one table."
)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=DESCRIPTION)
    parser.add_argument("--output_dir", default="outputs/benchmarks/gpu_check")
    parser.add_argument("--skip", nargs="*", default=[], choices=STEPS, help="Steps to leave out.")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Run every step not skipped, each whatever the others did; one table, `results.json` and `table.md`."""
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
