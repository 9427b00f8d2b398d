"""The command line a step module shares (`python -m recipes.benchmarks.gpu_bench.MODULE --step NAME --results_dir
DIR [--tiny]`): what `cli.run_step` starts in a process of its own, and stops at the step limit."""

import argparse
import os
import signal
import sys

from recipes.benchmarks.toolkit.paths import REPO


__all__ = ["step_parser", "stop_on_sigterm"]


def step_parser(steps: tuple[str, ...], description: str) -> argparse.ArgumentParser:
    """`--step` (one of `steps`), `--results_dir`, `--cache_dir` and `--tiny`; a module adds its own options."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--step", choices=steps, required=True)
    parser.add_argument("--results_dir", required=True)
    parser.add_argument("--cache_dir", default=os.path.join(REPO, "outputs", "cache"))
    parser.add_argument("--tiny", action="store_true")
    return parser


def stop_on_sigterm() -> None:
    """Stopped by gpu_bench (its step limit): SystemExit, so that run_workers stops the launched workers first."""
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
