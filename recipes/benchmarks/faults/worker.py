"""The worker every fault family launches, and how: the test suite's fault-injecting worker
(`tests/scripts/adloco_worker.py`: a tiny Llama, AdLoCo from a JSON spec, its steps and round phases recorded for a
watcher outside, its faults injected by name), one process per rank, one torch thread each."""

import os

from adloco_hf.testing import run_workers
from recipes.benchmarks.toolkit.paths import REPO


__all__ = ["WORKER", "run_launch"]

WORKER = os.path.join(REPO, "tests", "scripts", "adloco_worker.py")


def run_launch(command: list[str], *, timeout: float, **options):
    """One launch of `WORKER` (`adloco_hf.testing.run_workers`, from the repository root, with the test suite's
    helpers importable): its completed process; `options` go to `run_workers` (env, log_path, check)."""
    tests = os.path.join(REPO, "tests")
    return run_workers(command, timeout=timeout, cwd=REPO, pythonpath=[REPO, tests], threads=1, **options)
