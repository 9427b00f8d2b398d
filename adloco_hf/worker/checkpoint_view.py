"""`CheckpointView`: what saving and loading a checkpoint read of a worker, and the two calls they make.

`trainer/staged_save.py` and `trainer/checkpoint_load.py` take this view instead of the `Worker` (as the evaluation
takes `evaluation.view.EvaluationView`), so they depend on a few named values, not on the worker's parts.
"""

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..common.distributed import WorkerMonitor


__all__ = ["CheckpointView"]


@dataclass(frozen=True)
class CheckpointView:
    """A worker as checkpoints see it (built by `Worker.checkpoint_view`).

    Attributes:
        monitor: bounds every wait of a save by `worker_timeout` and names a missing worker.
        resume_hint: what to do after a lost worker.
        state_dict: this worker's resume state, for `adloco/rank-R.pt`.
        load_state_dict: keeps a checkpoint's state until training starts.
        max_batch_size: a process's largest micro-batch as resolved (None before training with "auto").
        sharded: `worker_parallelism="fsdp"`: each process holds shards (no elastic resume yet).
        num_workers: the workers of this launch.
        processes_per_worker: G.
        num_instances: the instances a new run starts with.
        on_cpu: the run trains on CPU (its launch hints name the CPU launch).
    """

    monitor: WorkerMonitor
    resume_hint: Callable[[], str]
    state_dict: Callable[[], dict[str, Any]]
    load_state_dict: Callable[[dict[str, Any]], None]
    max_batch_size: Callable[[], int | None]
    sharded: bool
    num_workers: int
    processes_per_worker: int
    num_instances: int
    on_cpu: bool
