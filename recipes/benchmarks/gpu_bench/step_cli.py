"""The command line a step module shares (`python -m recipes.benchmarks.gpu_bench.MODULE --step NAME --results_dir
DIR [--tiny]`): what `cli.run_step` starts in a process of its own, and stops at the step limit."""

import argparse
import os
import signal
import sys
from collections.abc import Callable

from recipes.benchmarks.gpu_bench.data import plot_rows
from recipes.benchmarks.gpu_bench.device import write_step
from recipes.benchmarks.toolkit.paths import REPO


__all__ = ["finish_step", "step_entry", "step_main", "step_parser", "stop_on_sigterm"]


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


def step_main(run: Callable[[str, str, str, bool], str], args: argparse.Namespace) -> None:
    """Run the step `args` names as `cli.run_step` starts it: stopped by SIGTERM at the step limit."""
    stop_on_sigterm()
    print(f"wrote {run(args.step, os.path.abspath(args.results_dir), os.path.abspath(args.cache_dir), args.tiny)}")


def finish_step(step: str, results_dir: str, settings: dict, result: dict, started: float, device: dict) -> str:
    """The step's figure and results file (its settings without this machine's cache path); returns the file."""
    plot_rows(step, result, os.path.join(results_dir, f"{step}.png"))
    settings.pop("cache_dir", None)
    return write_step(results_dir, step, {"device": device, "settings": settings, **result}, started)


def step_entry(run: Callable[[str, str, str, bool], str], steps: tuple[str, ...], description: str):
    """`parse_args(argv)` and `main(argv)` of a step module without options of its own."""

    def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
        return step_parser(steps, description).parse_args(argv)

    def main(argv: list[str] | None = None) -> None:
        step_main(run, parse_args(argv))

    return parse_args, main
