"""`Worker`: this process's part of AdLoCo, made of parts that own their state.

A worker trains its own copy of its instance's model. The Trainer hands it what it trains with when training
begins, then each inner step whole, then the end of each step:

1. `start` (training begins, `start.py`): the parts are made, and either the instance table, the initial weights
   and φ are set up, or a checkpoint's state is restored (`load_state_dict` before, applied here:
   `saved_state.py`); the first round's plan is applied.
2. `train_step` (every inner step, `inner_steps.py`): the step cut as the round's plan says (switch mode), its
   gradient statistics, loss, samples and tokens; the Trainer's forward/backward is handed in ([`StepPasses`]).
3. `after_step` (every inner step's end): Streaming DiLoCo's fragment syncs, a preemption's agreed stop, and every
   `inner_steps` steps the round's end (`round_end.py`): the outer step inside the instance, one all-gather of every
   worker's report, `rounds.decide_round` (the same on every rank: next requests, a merge, every worker's plan for
   the next round), the merge, the plan applied, the round's lines in `adloco_rounds.jsonl`.
4. `finish` (end of training): the surviving instances averaged into one model on every worker (`merging.py`).

The worker never sees the Trainer. Its parts: the rounds' state ([`RoundState`]), the inner steps
([`InnerSteps`]: the step's plan, statistics, tally and timings), the plan follower ([`PlanFollower`]: sampler and
learning rate), the outer step ([`OuterSync`]: φ and its syncs), the merges ([`WorkerMerges`]) and the round's end
([`RoundEnd`]); the process groups ([`WorkerGroups`]) and the replica ([`ReplicaParallel`]: DDP or FSDP inside a
worker) are handed in ready-built.
"""

from typing import Any

import torch

from ..checkpoint.folders import remove_stale_staging, resume_hint
from ..common.clock import Clock
from ..common.distributed import WorkerMonitor, destroy_process_groups_at_exit, get_rank, get_world_size
from ..common.job_store import bound_store_calls
from ..common.layout import WorkerLayout
from ..instances.table import Instance
from ..outer.step import GlobalModel
from ..reporting.run_log import RunLog
from ..rounds.log_lines import run_summary
from ..rounds.plan import WorkerPlan
from ..rounds.rules import RoundRules, RoundRulesCache
from ..rounds.state import AdLoCoState, RoundResult, RunTotals, StepEnd
from . import saved_state
from .checkpoint_view import CheckpointView
from .groups import WorkerGroups
from .inner_steps import StepPasses
from .preemption import Preemption
from .replicas.ddp import DDPReplica
from .replicas.fsdp import FSDPReplica
from .replicas.replica import ReplicaParallel
from .round_state import RoundState
from .settings import WorkerSettings
from .start import RoundParts, log_start, start_parts
from .training import TrainingObjects


__all__ = ["Worker"]


class Worker:
    """This process's AdLoCo state and its one way through a round (module docstring).

    With `processes_per_worker` = G > 1 a worker is G consecutive processes training one replica
    (`common/layout.py`): each of them holds a `Worker` with the same worker id, the same instance table, φ and outer
    momentum, and its `replica` says how they share the model: copies trained through DDP (`ddp.py`), or shards
    (`worker_parallelism="fsdp"`, `fsdp.py`). Local rank l talks with local rank l of the instance's other workers
    (all-reduce, merges), over the groups of `process_groups`.

    Args:
        settings: what the worker reads of the run's config ([`WorkerSettings`]).
        process_groups: where this process sits among the workers, and its process groups.
        replica: how the worker's processes hold its replica.
        rules: the settings of each round's decision ([`RoundRulesCache`]).

    [`Worker.from_args`] makes one from an `AdLoCoConfig` (what `AdLoCoTrainer` does).
    """

    def __init__(
        self,
        settings: WorkerSettings,
        process_groups: WorkerGroups,
        replica: ReplicaParallel,
        rules: RoundRulesCache,
    ):
        self.settings = settings
        self.process_groups = process_groups
        self.replica = replica
        self.rules_cache = rules
        self.run_log = RunLog(settings.output_dir)
        self.monitor = WorkerMonitor(settings.worker_timeout, connect=False)  # plain barriers until `start` connects
        # from this process's first store call on (common/job_store.py)
        bound_store_calls(settings.worker_timeout, settings.peer_timeout)
        self.preemption: Preemption | None = None
        # The clock of the step timings (`common/clock.py`): a benchmark may install a virtual one before training.
        self.clock = Clock(settings.device, synchronize=settings.steps.time_steps)
        self.rounds = RoundState(inner_steps=settings.start.rounds.inner_steps)
        self.parts: RoundParts | None = None  # made by `start`
        self._pending: dict[str, Any] | None = None  # a checkpoint's state, applied by `start`

    @classmethod
    def from_args(cls, args) -> "Worker":
        """The worker of this process for a run of `args` (an `AdLoCoConfig`): its settings, its place among the
        workers of the launch and its groups, and its replica (DDP or FSDP inside a worker)."""
        settings = WorkerSettings.from_args(args)
        layout = WorkerLayout(get_world_size(), settings.processes_per_worker)
        groups = WorkerGroups(
            layout, get_rank(), timeout=settings.worker_timeout, outer_overlap=settings.outer.background
        )
        replica = (FSDPReplica if settings.sharded else DDPReplica)(settings, groups)
        return cls(settings, groups, replica, RoundRulesCache(args, settings.start.rounds))

    # ---- the Trainer's calls ----
    def start(
        self,
        *,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        lr_scheduler,
        sampler,
        scaler,
        max_steps: int,
        global_step: int,
        probe_step,
        startup_probe=None,
    ) -> None:
        """Set up (or restore) this worker's AdLoCo state when training begins (collective: every rank).
        `startup_probe`: the Trainer's passes on examples training does not draw, for the goodput rule's startup
        profile (`batch/profiling.py`; None: no profile)."""
        self._connect()
        if self.parts is not None:  # a second train(): the new parts replace the first's
            self.parts.steps.detach()
        self.rounds.max_steps = max_steps
        resume = self._pending
        self.parts = start_parts(
            settings=self.settings,
            groups=self.process_groups,
            replica=self.replica,
            monitor=self.monitor,
            preemption=self.preemption,
            run_log=self.run_log,
            rounds=self.rounds,
            training=TrainingObjects(model, optimizer, lr_scheduler, sampler, scaler),
            resume=resume,
            # The sampler's shard caps a request (`rules`): read from the sampler handed in, since the parts are not
            # made yet when the startup profile asks for the rules.
            rules=lambda: self.rules_cache.get(
                max_batch_size=self.rounds.max_batch_size, shard_size=sampler.shard_size
            ),
            clock=self.clock,
            hint=self.resume_hint,
            probe_step=probe_step,
            startup_probe=startup_probe,
        )
        self._pending = None
        self.parts.round_end.apply(self.parts.first_plan)
        if self.rank == 0:
            log_start(self.settings, self.process_groups, self.rounds, self.rules, self.run_log, resume, global_step)

    def _connect(self) -> None:
        """The workers' monitor (a lost worker ends the run with a resume hint) and the preemption handlers."""
        destroy_process_groups_at_exit()
        self.monitor = WorkerMonitor(self.settings.worker_timeout)
        self.monitor.check("start of training")
        self.preemption = Preemption(
            self.settings.preemption_grace_seconds, self.monitor.someone_ahead, peer_timeout=self.settings.peer_timeout
        )
        self.preemption.install()
        if self.rank == 0:
            remove_stale_staging(self.settings.output_dir)

    def train_step(self, step: int, inputs: dict[str, Any], passes: StepPasses) -> torch.Tensor:
        """Run inner step `step` (0-based) on `inputs` as the round's plan says; returns its loss."""
        return self.parts.steps.run(step, inputs, passes)

    def after_step(self, step: int) -> StepEnd:
        """The end of inner step `step` (1-based: the Trainer's global step after it), on every rank: the step's
        timing, Streaming DiLoCo's fragment due, a preemption's stop, and the round's end when the step ends one."""
        parts, rounds = self.parts, self.rounds
        parts.steps.step_ended()
        parts.outer.after_step(
            step, self.instance, offset=step - rounds.last_synced_step, inner_steps=rounds.inner_steps
        )
        round_end = rounds.is_round_end(step) and step != rounds.last_synced_step
        stop = self.preemption.after_step(step, steps_to_round_end=rounds.steps_to_round_end(step))
        result = self.end_round(step) if round_end else None
        return StepEnd(round=result, stop=stop or (result is not None and result.preempted))

    def end_round(self, global_step: int) -> RoundResult:
        """End the round at `global_step` (also a round cut short: training stopped inside it)."""
        return self.parts.round_end.run(global_step)

    def finish(self) -> None:
        """Turn the surviving instances into one model on every worker (collective; idempotent)."""
        self.parts.merges.final(self.rounds)

    # ---- checkpoints ----
    def state_dict(self) -> dict[str, Any]:
        """This worker's resume state (`saved_state.py`)."""
        parts = self.parts
        return saved_state.state_dict(
            groups=self.process_groups,
            rounds=self.rounds,
            training=parts.training,
            replica=self.replica,
            outer=parts.outer,
            follower=parts.round_end.follower,
            steps=parts.steps,
        )

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Keep a checkpoint's state until `start` (models and optimizers are set up in between). The trainer has
        checked that the checkpoint has one state per worker (`checkpoint.check_rank_states`); one written by another
        number of workers comes re-split for this rank (`elastic.elastic_rank_state`)."""
        self._pending = state

    def checkpoint_view(self) -> CheckpointView:
        """What saving and loading a checkpoint read of this worker (`checkpoint_view.py`)."""
        return CheckpointView(
            monitor=self.monitor,
            resume_hint=self.resume_hint,
            state_dict=self.state_dict,
            load_state_dict=self.load_state_dict,
            max_batch_size=lambda: self.rounds.max_batch_size,
            sharded=self.fsdp,
            num_workers=self.num_workers,
            processes_per_worker=self.processes_per_worker,
            num_instances=self.settings.start.num_instances,
            on_cpu=self.settings.device.type == "cpu",
        )

    # ---- the round's plan and rules ----
    @property
    def rules(self) -> RoundRules:
        """The settings of every round's decision; a request never exceeds this worker's data shard either."""
        return self.rules_cache.get(
            max_batch_size=self.rounds.max_batch_size, shard_size=self.parts.training.sampler.shard_size
        )

    @property
    def plan(self) -> WorkerPlan | None:
        """This worker's plan for the current round."""
        return self.rounds.plan

    def is_round_end(self, step: int) -> bool:
        """Whether the round ends after `step` inner steps."""
        return self.rounds.is_round_end(step)

    # ---- where this process sits ----
    @property
    def rank(self) -> int:
        return self.process_groups.rank

    @property
    def worker_id(self) -> int:
        """This process's worker (the global rank with one process per worker)."""
        return self.process_groups.worker_id

    @property
    def local_rank(self) -> int:
        return self.process_groups.local_rank

    @property
    def layout(self) -> WorkerLayout:
        return self.process_groups.layout

    @property
    def num_workers(self) -> int:
        return self.layout.num_workers

    @property
    def world_size(self) -> int:
        return self.layout.world_size

    @property
    def processes_per_worker(self) -> int:
        return self.process_groups.processes_per_worker

    @property
    def groups(self):
        """Every process group, created collectively and kept for the run ([`ProcessGroupCache`])."""
        return self.process_groups.cache

    @property
    def intra_group(self):
        """The process group of this worker's processes (None with one process per worker)."""
        return self.process_groups.intra

    @property
    def all_workers_group(self):
        """This local rank of every worker (the world with one process per worker)."""
        return self.process_groups.all_workers

    # ---- the run ----
    @property
    def instances(self) -> list[Instance]:
        return self.rounds.instances

    @property
    def instance(self) -> Instance:
        """The instance this worker trains now."""
        return self.rounds.instance_of(self.worker_id)

    @property
    def global_model(self) -> GlobalModel | None:
        """φ of this worker's instance (None before training starts)."""
        return None if self.parts is None else self.parts.outer.global_model

    @property
    def max_batch_size(self) -> int | None:
        """A process's largest micro-batch (None before training starts with `max_batch_size="auto"`)."""
        return self.rounds.max_batch_size

    @property
    def final_merged(self) -> bool:
        return self.rounds.final_merged

    @property
    def last_synced_step(self) -> int:
        return self.rounds.last_synced_step

    @property
    def totals(self) -> RunTotals:
        return self.rounds.totals

    @property
    def state(self) -> AdLoCoState:
        """Where the run stands (see [`AdLoCoState`])."""
        return self.rounds.snapshot()

    def summary(self) -> dict[str, Any]:
        """The run in a few numbers, for model cards."""
        return run_summary(self.state, self.world_size, self.processes_per_worker)

    def resume_hint(self) -> str:
        """What to do after a lost worker: named only when it happens (it lists the output folder)."""
        return resume_hint(self.settings.output_dir)

    # ---- the replica: DDP or FSDP inside the worker ----
    @property
    def fsdp(self) -> bool:
        """worker_parallelism="fsdp": the worker's processes shard one replica; φ, the outer momentum and the
        pseudo-gradient are then this process's shard's."""
        return self.replica.sharded

    def shard(self, model: torch.nn.Module) -> None:
        """worker_parallelism="fsdp": shard `model` over this worker's processes (collective on every rank: the intra
        groups are made here; before the optimizer exists). Nothing otherwise."""
        self.replica.shard(model)

    def reshard(self) -> None:
        """FSDP: every unit back to its shards (after an evaluation's forward the root stays unsharded), so that
        writes to the shards are the ones the next forward gathers. Nothing otherwise."""
        if self.parts is not None:
            self.replica.reshard(self.parts.training.model)

    def full_values(self, flat: torch.Tensor) -> list[torch.Tensor]:
        """The trainable parameters' values held in `flat` (a φ of this process), full-shaped. With FSDP collective
        over the worker's processes (each contributes its shard); otherwise views of `flat`."""
        return self.replica.full_values(self.parts.training.trainable(), self.global_model.views_of(flat))

    def full_state_dict(self) -> dict[str, torch.Tensor] | None:
        """With FSDP the model's full state dict (collective over the worker's processes); None otherwise."""
        return self.replica.full_state_dict(self.parts.training.model)

    def full_save_state(self, flat: torch.Tensor) -> dict[str, torch.Tensor]:
        """With FSDP: the full state dict (CPU, the model's dtypes) whose trainable parameters hold `flat`, this
        process's shard of a φ; what `save_model_folder` writes. Collective over the worker's processes."""
        return self.replica.full_save_state(self.parts.training.model, self.global_model.views_of(flat))
