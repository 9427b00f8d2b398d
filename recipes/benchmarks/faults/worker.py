"""The worker every fault family launches, and how: the benchmark worker (`WORKER_MODULE`) with a spec of kind
"faults" (`toolkit/worker/fault_run.py`: a tiny Llama, AdLoCo from the spec, its steps and round phases recorded for
a watcher outside, its faults injected by name), one process per rank, one torch thread each."""

import json
import os

from adloco_hf.testing import run_workers
from recipes.benchmarks.toolkit.paths import REPO
from recipes.benchmarks.toolkit.runs import WORKER_MODULE
from recipes.benchmarks.toolkit.worker import FAULTS


__all__ = ["WORKER_MODULE", "run_launch", "write_spec"]


def write_spec(spec: dict) -> str:
    """`spec` as a fault run's (kind `FAULTS`) in `{probe_dir}/spec.json`, the folder made: the workers' argument
    (`launch_command(WORKER_MODULE, path, ..., module=True)`). Each launch has a probe folder of its own; the
    machines of one network run share one."""
    os.makedirs(spec["probe_dir"], exist_ok=True)
    path = os.path.join(spec["probe_dir"], "spec.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump({"kind": FAULTS, **spec}, f, indent=1)
    return path


def run_launch(command: list[str], *, timeout: float, **options):
    """One launch of `WORKER_MODULE` (`adloco_hf.testing.run_workers`, from the repository root): its completed
    process; `options` go to `run_workers` (env, log_path, check)."""
    return run_workers(command, timeout=timeout, cwd=REPO, pythonpath=[REPO], threads=1, **options)
