"""What an evaluation reads: of this process's worker ([`EvaluationView`]) and of the settings
([`EvaluationSettings`]). `evaluate.py` reads nothing else of either, so it does not depend on the `Worker`'s
internals: `EvaluationView.from_worker` is the one place that looks at the worker.
"""

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..common.distributed import WorkerMonitor
from ..common.layout import WorkerLayout
from ..instances.table import Instance, instance_of
from ..outer.step import GlobalModel
from ..reporting.run_log import RunLog
from ..rounds.state import AdLoCoState


if TYPE_CHECKING:
    from ..worker.core import Worker

__all__ = ["EvaluationSettings", "EvaluationView"]


@dataclass(frozen=True)
class EvaluationSettings:
    """AdLoCo's settings of an evaluation, read from `AdLoCoConfig` once (by `AdLoCoTrainer.__init__`). The
    Trainer's own (`eval_batch_size`, `include_for_metrics`, ...) are read from its args where the Trainer reads
    them."""

    eval_merged_model: bool  # while several instances train, also evaluate the model of their final merge

    @classmethod
    def from_args(cls, args) -> "EvaluationSettings":
        """From an `AdLoCoConfig`."""
        return cls(eval_merged_model=bool(args.eval_merged_model))


@dataclass(frozen=True)
class EvaluationView:
    """This process's worker as an evaluation sees it, taken when the evaluation starts (nothing in it changes while
    one runs): the instance table, where this process sits, the global weights, and the few calls it makes.

    Built by [`EvaluationView.from_worker`].
    """

    instances: list[Instance]  # the instance table (empty before training starts)
    final_merged: bool  # the instances are merged into the final model already
    layout: WorkerLayout  # which process belongs to which worker
    worker_id: int
    local_rank: int
    sharded: bool  # worker_parallelism="fsdp": a forward is collective over the worker's processes
    global_model: GlobalModel | None  # φ of this worker's instance (None before training starts)
    state: AdLoCoState  # where the run stands, for the lines of `adloco_eval.jsonl`
    monitor: WorkerMonitor  # collectives bounded by worker_timeout, naming a lost worker
    run_log: RunLog
    group: Callable[[Sequence[int]], Any]  # the process group over these global ranks (collective when new)
    all_workers_group: Callable[[], Any]  # this local rank of every worker (collective when new)
    reshard: Callable[[], None]  # FSDP: every unit back to its shards; nothing otherwise
    resume_hint: Callable[[], str]  # what to do after a lost worker

    @property
    def instance(self) -> Instance:
        """The instance this worker trains."""
        return instance_of(self.instances, self.worker_id)

    @property
    def num_workers(self) -> int:
        return self.layout.num_workers

    @classmethod
    def from_worker(cls, worker: "Worker") -> "EvaluationView":
        """The view of `worker` now."""
        return cls(
            instances=list(worker.instances),
            final_merged=worker.final_merged,
            layout=worker.layout,
            worker_id=worker.worker_id,
            local_rank=worker.local_rank,
            sharded=worker.fsdp,
            global_model=worker.global_model,
            state=worker.state,
            monitor=worker.monitor,
            run_log=worker.run_log,
            group=worker.groups.get,
            all_workers_group=lambda: worker.all_workers_group,
            reshard=worker.reshard,
            resume_hint=worker.resume_hint,
        )
