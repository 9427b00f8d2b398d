"""`Worker`: this process's part of AdLoCo, and the one way through a round.

A worker trains its own copy of its instance's model; the Trainer runs the inner steps and calls the worker at four
points:

1. `start` (training begins, `start.py`): instance table, process groups, shared or per-instance initial weights,
   φ, the batch plan; or the state a checkpoint saved (`load_state_dict` before, applied here: `resume.py`).
2. `plan_step` / `finish_step` (every inner step, `steps.py`): how the step is cut into micro-batches (switch mode)
   and where its gradient statistics come from, then the step's loss, samples and tokens.
3. `end_round` (every `inner_steps` steps, `round_end.py`): outer step inside the instance, one all-gather of every
   worker's `WorkerReport`, `rounds.decide_round` (the same on every rank), the merge if one is due, the next batch
   plan, the round's lines in `adloco_rounds.jsonl`.
4. `finish` (end of training): the surviving instances averaged into one model on every worker.

The worker never sees the Trainer: it is handed the model, inner optimizer, scheduler, sampler and scaler. What
differs between DDP and FSDP inside a worker is its `replica` (`replica.py`), chosen once here.
"""

import time
from typing import Any

import torch

from ..batch.grad_stats import GradientStatisticsCollector
from ..batch.switch_mode import BatchPlan
from ..checkpoint.folders import resume_hint
from ..common.distributed import WorkerMonitor, get_rank, get_world_size
from ..common.layout import WorkerLayout
from ..common.logs import get_logger
from ..config.arguments import AdLoCoConfig
from ..instances import merges as merging
from ..instances.health import final_merge_warnings
from ..instances.table import Instance, instance_of
from ..outer.step import GlobalModel, ring_all_reduce_bytes
from ..reporting.run_log import RunLog
from ..rounds.log_lines import run_summary
from ..rounds.rules import RoundRules
from ..rounds.state import AdLoCoState, RunTotals
from ..rounds.tally import RoundTally
from .ddp import DDPReplica
from .fsdp import FSDPReplica
from .groups import WorkerGroups
from .preemption import Preemption
from .replica import ReplicaParallel
from .resume import WorkerResume
from .round_end import RoundEnd
from .settings import WorkerSettings
from .start import WorkerStart
from .steps import InnerSteps


__all__ = ["Worker"]

logger = get_logger(__name__)  # prints like the Trainer's lines, at its log_level (common/logs.py)


class Worker(WorkerStart, InnerSteps, RoundEnd, WorkerResume):
    """This process's AdLoCo state: its instance, φ and outer optimizer, batch plan, statistics and run totals.

    With `processes_per_worker` = G > 1 a worker is G consecutive processes training one replica
    (`common/layout.py`): each of them holds a `Worker` with the same worker id, the same instance table, φ and outer
    momentum, and its `replica` says how they share the model: copies trained through DDP (`ddp.py`), or shards
    (`worker_parallelism="fsdp"`, `fsdp.py`). Local rank l talks with local rank l of the instance's other workers
    (all-reduce, merges), over the groups of `process_groups`.

    Args:
        args: the run's [`AdLoCoConfig`]; what the worker reads of it is read once, into `settings`
            ([`WorkerSettings`]).
    """

    def __init__(self, args: AdLoCoConfig):
        self.args = args  # read only by the builders: `WorkerSettings` here, `RoundRules` when its inputs change
        self.settings = settings = WorkerSettings.from_args(args)
        self.world_size = get_world_size()
        self.processes_per_worker = settings.processes_per_worker
        self.layout = WorkerLayout(self.world_size, self.processes_per_worker)
        self.process_groups = WorkerGroups(
            self.layout, get_rank(), timeout=settings.worker_timeout, outer_overlap=settings.outer.background
        )
        self.rank = self.process_groups.rank
        self.worker_id = self.process_groups.worker_id  # == rank with one process per worker
        self.local_rank = self.process_groups.local_rank
        self.num_workers = self.layout.num_workers
        replica = FSDPReplica if settings.sharded else DDPReplica
        self.replica: ReplicaParallel = replica(settings, self.process_groups)
        self.run_log = RunLog(settings.output_dir)
        self.monitor = WorkerMonitor(settings.worker_timeout, connect=False)  # plain barriers until `start` connects
        self.instances: list[Instance] = []
        self.global_model: GlobalModel | None = None
        self.collector: GradientStatisticsCollector | None = None
        self.max_batch_size: int | None = None
        self.plan: BatchPlan | None = None
        self.outer_step = 0
        self.last_synced_step = 0
        self.inner_steps = settings.inner_steps  # this round's H (grows with inner_steps_rule="outer_noise")
        self.final_merged = False
        self.totals = RunTotals()
        self._tally = RoundTally()
        self._speed_started: float | None = None  # perf_counter() at the current inner step's start (its speed)
        self._rules: RoundRules | None = None
        self._rules_inputs: tuple[int | None, int | None] | None = (
            None  # (max_batch_size, shard_size) it was built for
        )
        self._pending: dict[str, Any] | None = None  # a checkpoint's state, applied by `start`
        self.preemption: Preemption | None = None
        self._rng_to_restore: dict[str, Any] | None = None
        self._train_start = time.time()
        self._base_lrs: list[float] = []  # the scheduler's rates before lr_batch_scaling
        self._base_adam: list[dict] = []  # the groups' betas, eps, weight_decay before 'sqrt_adam'
        self._model = self._optimizer = self._scheduler = self._sampler = self._scaler = None
        self.max_steps = 0  # the Trainer's, set by `start`: the last round may end early
        # The step timings of batch_size_target="goodput" (`steps.py`): the clock, and where the current step is.
        self.clock = time.perf_counter
        self._step_started: float | None = None
        self._passes_done: float | None = None

    # ---- where this process sits, and its groups ----
    @property
    def fsdp(self) -> bool:
        """worker_parallelism="fsdp": the worker's processes shard one replica; φ, the outer momentum and the
        pseudo-gradient are then this process's shard's."""
        return self.replica.sharded

    @property
    def groups(self):
        """Every process group, created collectively and kept for the run ([`ProcessGroupCache`])."""
        return self.process_groups.cache

    @property
    def outer_groups(self):
        """The outer all-reduce's groups: its own with `outer_overlap` (it runs beside the next round)."""
        return self.process_groups.outer

    @property
    def intra_group(self):
        """The process group of this worker's processes (None with one process per worker)."""
        return self.process_groups.intra

    @property
    def all_workers_group(self):
        """This local rank of every worker (the world with one process per worker)."""
        return self.process_groups.all_workers

    @property
    def instance(self) -> Instance:
        """The instance this worker trains now."""
        return instance_of(self.instances, self.worker_id)

    @property
    def rules(self) -> RoundRules:
        """The settings of every round's decision; a request never exceeds this worker's data shard either."""
        self._update_rules()
        return self._rules

    def _update_rules(self) -> None:
        """Build `rules` from the settings, the largest micro-batch and the sampler's shard (known once `start` has
        resolved or restored `max_batch_size` and holds the sampler), again only if one of the two changed since."""
        inputs = (self.max_batch_size, self._sampler.shard_size)
        if self._rules is None or inputs != self._rules_inputs:
            self._rules = RoundRules.from_args(self.args, max_batch_size=inputs[0], shard_size=inputs[1])
            self._rules_inputs = inputs

    # ---- the replica: DDP or FSDP inside the worker ----
    def _trainable(self) -> list[torch.nn.Parameter]:
        return [p for p in self._model.parameters() if p.requires_grad]

    def _part(self) -> list[torch.Tensor]:
        """What AdLoCo's φ mirrors on this process: the trainable parameters, or with FSDP their local shards."""
        return self.replica.part(self._model)

    def shard(self, model: torch.nn.Module) -> None:
        """worker_parallelism="fsdp": shard `model` over this worker's processes (collective on every rank: the intra
        groups are made here; before the optimizer exists). Nothing otherwise."""
        self.replica.shard(model)

    def reshard(self) -> None:
        """FSDP: every unit back to its shards (after an evaluation's forward the root stays unsharded), so that
        writes to the shards are the ones the next forward gathers. Nothing otherwise."""
        if self._model is not None:
            self.replica.reshard(self._model)

    def full_values(self, flat: torch.Tensor) -> list[torch.Tensor]:
        """The trainable parameters' values held in `flat` (a φ of this process), full-shaped. With FSDP collective
        over the worker's processes (each contributes its shard); otherwise views of `flat`."""
        return self.replica.full_values(self._trainable(), self.global_model.views_of(flat))

    def full_state_dict(self) -> dict[str, torch.Tensor] | None:
        """With FSDP the model's full state dict (collective over the worker's processes); None otherwise."""
        return self.replica.full_state_dict(self._model)

    def full_save_state(self, flat: torch.Tensor) -> dict[str, torch.Tensor]:
        """With FSDP: the full state dict (CPU, the model's dtypes) whose trainable parameters hold `flat`, this
        process's shard of a φ; what `save_model_folder` writes. Collective over the worker's processes."""
        return self.replica.full_save_state(self._model, self.global_model.views_of(flat))

    # ---- end of training ----
    def finish(self) -> None:
        """Turn the surviving instances into one model on every worker (collective; idempotent)."""
        if self.final_merged:
            return
        if self.rank == 0:
            for warning in final_merge_warnings(self.instances):
                logger.warning(warning)
        self.replica.reshard(self._model)  # φ is written into the sharded parameters
        with self.monitor.watch("final merge", self.resume_hint):
            flushed, _ = self._flush_fragments(self.last_synced_step)
            self.global_model.settle()  # overlapped: the last round's average, so every instance's workers agree
            several = self.processes_per_worker > 1
            sent = merging.final_merge(
                self.instances,
                rank=self.worker_id,
                global_model=self.global_model,
                group=self.monitor.message_group,
                layout=self.layout if several else None,
                local_rank=self.local_rank,
                broadcast_group=self.all_workers_group if several else None,
            )
        rows = self.monitor.gather_rows([sent + flushed], "final merge", self.resume_hint)
        self.totals.comm_bytes += int(sum(r[0] for r in rows))
        self.final_merged = True

    def _flush_fragments(self, step: int):
        """Streaming DiLoCo: every fragment that trained on since it was sent is synced once more, so that φ holds
        every step's work (`StreamingSync.flush`; before a merge and at the end of training). Returns its ring bytes,
        counted once per instance (on its first worker's processes), and its `FragmentTally`; (0, None) without
        fragments."""
        streaming = self.global_model.streaming
        if streaming is None:
            return 0, None
        inst = self.instance
        group = self.outer_groups.get(self.process_groups.cross(inst.workers))
        done = streaming.flush(step, group=group, num_workers=len(inst.workers))
        first = self.worker_id == inst.first_worker
        return (ring_all_reduce_bytes(done.payload_bytes, len(inst.workers)) if first else 0), done

    # ---- where the run stands ----
    def resume_hint(self) -> str:
        """What to do after a lost worker: named only when it happens (it lists the output folder)."""
        return resume_hint(self.settings.output_dir)

    def _elapsed(self) -> float:
        """Training seconds across resumes."""
        return self.totals.elapsed + time.time() - self._train_start

    @property
    def state(self) -> AdLoCoState:
        """Where the run stands (see [`AdLoCoState`])."""
        return AdLoCoState(
            rounds=self.outer_step,
            last_round_step=self.last_synced_step,
            tokens=self.totals.tokens,
            comm_bytes=self.totals.comm_bytes,
            merges=self.totals.merges,
            skipped_rounds=self.totals.skipped_rounds,
            elapsed_seconds=self._elapsed(),
            num_instances=len(self.instances),
            batch_sizes={i.id: i.batch_size for i in self.instances},
            workers={i.id: i.workers for i in self.instances},
            final_merged=self.final_merged,
        )

    def summary(self) -> dict[str, Any]:
        """The run in a few numbers, for model cards."""
        return run_summary(self.state, self.world_size, self.processes_per_worker)
