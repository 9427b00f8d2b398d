"""What benchmarks and research scripts may read of the library beyond its public API: the supported surface.

`recipes/` imports `adloco_hf` only through the public API (`adloco_hf`, `adloco_hf.data`), the recipes' helpers
(`adloco_hf.cli`, `adloco_hf.presets`, `adloco_hf.testing`) and this module (`tests/test_layout.py` checks it), so
the folders inside the package can change without breaking a benchmark. Everything here is re-exported from where it
lives; each piece is pure (no process group, no training state) or reads a finished run's files.

A run's files (`output_dir`):
- `load_rounds`, `load_evals`: the rounds and evaluation lines; `group_by_round`; `MERGED`, the `instance` of a merged
  model's evaluation; `is_finite_number`; `summarize_run` and `format_summary` (`adloco-hf summary`), `plot_run` and
  its file name `PLOT_FILE` (`adloco-hf plot`); `checkpoints_newest_first`, and `check_checkpoint_path` (a path to
  resume from that does not exist, named with the checkpoints that do, before any data is built).

The library's own models, so that a benchmark predicts what a run sends and chooses rather than modelling it again:
- bytes and buckets of the outer step's all-reduce: `ring_all_reduce_bytes`, `OUTER_BUCKET_NUMEL`;
- switch mode: `SwitchMode` (its plans and the ranges of requests that run in the same number of passes) and its chunks,
  `split_sizes` (`plan_batch` is public: `adloco_hf.plan_batch`);
- merges: the instance table and merge plan (`Instance`, `MergePlan`, `plan_merge`) and the messages a merge sends
  (`plan_transfers`);
- the goodput rule: `GoodputModel`, `choose_request`, and its step-time model (`StepTimeModel`, `fit_pass_seconds`);
- the clock a worker's timings read, and the hook a virtual clock subclasses: `Clock` (`trainer.worker.clock = ...`);
- the timeouts: `default_peer_timeout` (what `peer_timeout=None` resolves to for a `worker_timeout`).

Formats and files the benchmarks share with the run's own output: `format_bytes`, `format_count` (the run log's units),
`atomic_write_text`. The built-in corpus's split column: `SPLIT_COLUMN`. An error a run raises:
`WorkerTimeoutError` (a worker lost mid-round).

Each name is imported on first use: a script that reads a run's files (`recipes/plot_run.py`) loads no torch.
"""

import importlib
from typing import TYPE_CHECKING


if TYPE_CHECKING:
    from .batch.goodput import GoodputModel, choose_request
    from .batch.switch_mode import SwitchMode, split_sizes
    from .batch.throughput import StepTimeModel, fit_pass_seconds
    from .checkpoint.manifest import check_checkpoint_path, checkpoints_newest_first
    from .common.clock import Clock
    from .common.distributed import WorkerTimeoutError
    from .common.files import atomic_write_text
    from .common.formats import format_bytes, format_count
    from .config.timeouts import default_peer_timeout
    from .data.python_source import SPLIT_COLUMN
    from .instances.table import Instance, MergePlan, plan_merge
    from .instances.transfers import plan_transfers
    from .outer.step import BUCKET_NUMEL as OUTER_BUCKET_NUMEL
    from .outer.step import ring_all_reduce_bytes
    from .reporting.plotting import PLOT_FILE, plot_run
    from .reporting.report import format_summary, summarize_run
    from .reporting.run_log import MERGED, PROFILE_FILE, group_by_round, is_finite_number, load_evals, load_rounds


__all__ = [
    "MERGED",
    "OUTER_BUCKET_NUMEL",
    "PLOT_FILE",
    "PROFILE_FILE",
    "SPLIT_COLUMN",
    "Clock",
    "GoodputModel",
    "Instance",
    "MergePlan",
    "StepTimeModel",
    "SwitchMode",
    "WorkerTimeoutError",
    "atomic_write_text",
    "check_checkpoint_path",
    "checkpoints_newest_first",
    "choose_request",
    "default_peer_timeout",
    "fit_pass_seconds",
    "format_bytes",
    "format_count",
    "format_summary",
    "group_by_round",
    "is_finite_number",
    "load_evals",
    "load_rounds",
    "plan_merge",
    "plan_transfers",
    "plot_run",
    "ring_all_reduce_bytes",
    "split_sizes",
    "summarize_run",
]


_EXPORTS = {  # name → (module, name there): imported on first use, so a reader of a run's files loads no torch
    "Clock": (".common.clock", "Clock"),
    "GoodputModel": (".batch.goodput", "GoodputModel"),
    "Instance": (".instances.table", "Instance"),
    "MERGED": (".reporting.run_log", "MERGED"),
    "MergePlan": (".instances.table", "MergePlan"),
    "OUTER_BUCKET_NUMEL": (".outer.step", "BUCKET_NUMEL"),
    "PLOT_FILE": (".reporting.plotting", "PLOT_FILE"),
    "PROFILE_FILE": (".reporting.run_log", "PROFILE_FILE"),
    "SPLIT_COLUMN": (".data.python_source", "SPLIT_COLUMN"),
    "StepTimeModel": (".batch.throughput", "StepTimeModel"),
    "SwitchMode": (".batch.switch_mode", "SwitchMode"),
    "WorkerTimeoutError": (".common.distributed", "WorkerTimeoutError"),
    "atomic_write_text": (".common.files", "atomic_write_text"),
    "check_checkpoint_path": (".checkpoint.manifest", "check_checkpoint_path"),
    "checkpoints_newest_first": (".checkpoint.manifest", "checkpoints_newest_first"),
    "choose_request": (".batch.goodput", "choose_request"),
    "default_peer_timeout": (".config.timeouts", "default_peer_timeout"),
    "fit_pass_seconds": (".batch.throughput", "fit_pass_seconds"),
    "format_bytes": (".common.formats", "format_bytes"),
    "format_count": (".common.formats", "format_count"),
    "format_summary": (".reporting.report", "format_summary"),
    "group_by_round": (".reporting.run_log", "group_by_round"),
    "is_finite_number": (".reporting.run_log", "is_finite_number"),
    "load_evals": (".reporting.run_log", "load_evals"),
    "load_rounds": (".reporting.run_log", "load_rounds"),
    "plan_merge": (".instances.table", "plan_merge"),
    "plan_transfers": (".instances.transfers", "plan_transfers"),
    "plot_run": (".reporting.plotting", "plot_run"),
    "ring_all_reduce_bytes": (".outer.step", "ring_all_reduce_bytes"),
    "split_sizes": (".batch.switch_mode", "split_sizes"),
    "summarize_run": (".reporting.report", "summarize_run"),
}


def __getattr__(name: str):
    if name in _EXPORTS:
        module, attribute = _EXPORTS[name]
        return getattr(importlib.import_module(module, __name__.rpartition(".")[0]), attribute)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
