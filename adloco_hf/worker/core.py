"""`Worker`: this process's part of AdLoCo, and the one way through a round.

A worker trains its own copy of its instance's model; the Trainer runs the inner steps and calls the worker at four
points:

1. `start` (training begins): instance table, process groups, shared or per-instance initial weights, φ, the batch
   plan; or the state a checkpoint saved (`load_state_dict` before, applied here).
2. `plan_step` / `finish_step` (every inner step): how the step is cut into micro-batches (switch mode) and where its
   gradient statistics come from, then the step's loss, samples and tokens.
3. `end_round` (every `inner_steps` steps): outer step inside the instance, one all-gather of every worker's
   `WorkerReport`, `rounds.decide_round` (the same on every rank), the merge if one is due, the next batch plan, the
   round's lines in `adloco_rounds.jsonl`.
4. `finish` (end of training): the surviving instances averaged into one model on every worker.

The worker never sees the Trainer: it is handed the model, inner optimizer, scheduler, sampler and scaler.
"""

import time
from collections.abc import Callable
from dataclasses import asdict
from typing import Any

import torch
import torch.distributed as dist
from transformers import set_seed

from ..batch.grad_stats import GradientStatisticsCollector, adam_root_preconditioner, check_adam_moments
from ..batch.lr_scaling import (
    ADAM_RULES,
    adam_hyperparameters,
    apply_adam_scaling,
    apply_lr_factor,
    check_adam_optimizer,
    check_scheduler,
    lr_factor,
)
from ..batch.size_tests import GradientStatistics
from ..batch.switch_mode import BatchPlan, Statistics, StepPlan, plan_batch, plan_step
from ..checkpoint.folders import remove_stale_staging, resume_hint
from ..common.console import get_logger
from ..common.distributed import (
    ProcessGroupCache,
    WorkerMonitor,
    broadcast_tensors,
    check_models_match,
    destroy_process_groups_at_exit,
    get_rank,
    get_world_size,
)
from ..common.layout import WorkerLayout
from ..common.rng import get_rng_state, set_rng_state
from ..config.arguments import AdLoCoConfig
from ..instances import merges as merging
from ..instances.health import SkippedRoundsError, final_merge_warnings
from ..instances.merges import MergeResult
from ..instances.table import Instance, MergePlan, initial_instances, instance_of
from ..outer.step import GlobalModel
from ..outputs.run_log import RunLog
from ..rounds.decision import (
    AdLoCoState,
    RoundResult,
    RoundRules,
    RunTotals,
    WorkerReport,
    decide_round,
    round_message,
    run_summary,
)
from ..rounds.tally import RoundTally
from ..sampling.stream_sampler import check_sampler_kind
from . import fsdp as worker_fsdp
from .initialise import initialise_weights, resolve_max_batch_size
from .preemption import Preemption


__all__ = ["Worker"]

logger = get_logger(__name__)  # prints like the Trainer's lines, at its log_level (console.py)

INNER_PRODUCT_TESTS = ("inner_product", "augmented_inner_product")


class Worker:
    """This process's AdLoCo state: its instance, φ and outer optimizer, batch plan, statistics and run totals.

    With `processes_per_worker` = G > 1 a worker is G consecutive processes training one replica through DDP
    (`worker_layout.py`): each of them holds a `Worker` with the same worker id, the same instance table, φ and outer
    momentum; local rank l all-reduces slice l of the pseudo-gradient with local rank l of the instance's other
    workers, and merges run over each local rank's own ranks on identical data. With
    `worker_parallelism="fsdp"` the G processes shard the replica instead (`worker_fsdp.py`): φ, the outer momentum
    and the pseudo-gradient of local rank l are those of its shard l, all-reduced with the same shard of the other
    workers; models are written after gathering the full tensors inside the worker.

    Args:
        args: the run's [`AdLoCoConfig`].
    """

    def __init__(self, args: AdLoCoConfig):
        self.args = args
        self.rank = get_rank()
        self.world_size = get_world_size()
        self.processes_per_worker = int(getattr(args, "processes_per_worker", 1) or 1)
        self.layout = WorkerLayout(self.world_size, self.processes_per_worker)
        self.worker_id = self.layout.worker_of(self.rank)  # == rank with one process per worker
        self.local_rank = self.layout.local_rank(self.rank)
        self.num_workers = self.layout.num_workers
        # worker_parallelism="fsdp": the worker's processes shard one replica (FSDP2, `worker_fsdp.py`); AdLoCo's
        # φ, momentum and pseudo-gradient are then this process's shard's.
        self.fsdp = self.processes_per_worker > 1 and getattr(args, "worker_parallelism", "ddp") == "fsdp"
        self._intra_group = None
        self.groups = ProcessGroupCache(timeout=args.worker_timeout)
        # An overlapped outer step's all-reduce is in flight while the next round runs (evaluation gathers, the
        # round's reports): it gets groups of its own, so the two never share one, even when an instance is the world.
        self.outer_groups = (
            ProcessGroupCache(timeout=args.worker_timeout, own_world_group=True) if args.outer_overlap else self.groups
        )
        self.run_log = RunLog(args.output_dir)
        self.monitor = WorkerMonitor(args.worker_timeout, connect=False)  # plain barriers until `start` connects one
        self.instances: list[Instance] = []
        self.global_model: GlobalModel | None = None
        self.collector: GradientStatisticsCollector | None = None
        self.max_batch_size: int | None = None
        self.plan: BatchPlan | None = None
        self.outer_step = 0
        self.last_synced_step = 0
        self.inner_steps = args.inner_steps  # this round's H (grows with inner_steps_rule="outer_noise")
        self.final_merged = False
        self.totals = RunTotals()
        self._tally = RoundTally()
        self._pending: dict[str, Any] | None = None  # a checkpoint's state, applied by `start`
        self.preemption: Preemption | None = None
        self._rng_to_restore: dict[str, Any] | None = None
        self._train_start = time.time()
        self._base_lrs: list[float] = []  # the scheduler's rates before lr_batch_scaling
        self._base_adam: list[dict] = []  # the groups' betas, eps, weight_decay before 'sqrt_adam'
        self._model = self._optimizer = self._scheduler = self._sampler = self._scaler = None
        self.max_steps = 0  # the Trainer's, set by `start`: the last round may end early

    # ---- start ----
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
        probe_step: Callable[[int], None],
    ) -> None:
        """Set up (or restore) this worker's AdLoCo state when training begins (collective: every rank)."""
        self._model, self._optimizer, self._scheduler = model, optimizer, lr_scheduler
        self._sampler, self._scaler, self.max_steps = sampler, scaler, max_steps
        destroy_process_groups_at_exit()
        self.monitor = WorkerMonitor(self.args.worker_timeout)
        self.monitor.check("start of training")
        self.preemption = Preemption(self.args.preemption_grace_seconds, self.monitor.someone_ahead)
        self.preemption.install()
        if self.rank == 0:
            remove_stale_staging(self.args.output_dir)
        check_models_match(model, self.args.device)
        self.collector = GradientStatisticsCollector(
            model.parameters(), inner_products=self.args.batch_size_test in INNER_PRODUCT_TESTS
        )
        if self.fsdp:
            self.collector.sum_group = self.intra_group  # two halves from the synced shards (grad_stats.py)
        if self.args.lr_batch_scaling != "none":
            check_scheduler(lr_scheduler)
        if self.args.noise_preconditioner == "adam":
            check_adam_moments(optimizer)
        if self.args.lr_batch_scaling in ADAM_RULES:
            check_adam_optimizer(optimizer)
            self._base_adam = adam_hyperparameters(optimizer)
        self._base_lrs = list(getattr(lr_scheduler, "base_lrs", []))
        resume = self._pending
        if resume is None:
            self.instances = initial_instances(
                self.num_workers,
                self.args.num_instances,
                self.processes_per_worker * self.args.per_device_train_batch_size,
            )
            self._refresh_groups()
            inst = self.instance
            if self.fsdp:  # every local rank holds its own shard: each sends its shard between workers
                group = self.groups.get(self._cross(inst.workers)) if len(inst.workers) > 1 else None
                self._initialise_shards(model, inst, group)
            else:
                # Between workers the weights travel once, local rank 0 to local rank 0, then inside each worker.
                lead = self.local_rank == 0
                group = self.groups.get(self._cross(inst.workers)) if len(inst.workers) > 1 and lead else None
                several = self.processes_per_worker > 1
                initialise_weights(
                    model,
                    self.args.instance_init,
                    instance=inst,
                    rank=self.worker_id,
                    seed=self.args.seed,
                    group=group,
                    src=self.layout.rank(inst.first_worker, 0),
                    intra_group=self.intra_group,
                    intra_src=self.layout.rank(self.worker_id, 0),
                    shared_group=self.all_workers_group if several and lead else None,
                )
        else:
            self.instances = [Instance.from_row(row) for row in resume["instances"]]
            self._refresh_groups()
        self.global_model = GlobalModel.from_args(self._part(), self.args)
        if self.fsdp:
            self.global_model.shard_over(self.intra_group)
        else:
            self.global_model.split_over(self.intra_group, self.processes_per_worker, self.local_rank)
        if resume is None:
            if self.fsdp and self.args.max_batch_size == "auto" and self.args.device.type == "cuda":
                raise ValueError(
                    "max_batch_size='auto' probes batches until one runs out of memory, which a sharded forward "
                    "(worker_parallelism='fsdp', collective inside the worker) cannot survive on one process alone: "
                    "set max_batch_size to the largest micro-batch per process, or worker_parallelism='ddp'."
                )
            self.max_batch_size = resolve_max_batch_size(self.args, self._trainable(), probe_step)
            self._train_start = time.time()
        else:
            self._restore(resume)
        self._apply_plan()
        if self.rank == 0:
            self.run_log.start(
                resumed_outer_step=None if resume is None else self.outer_step,
                resumed_global_step=None if resume is None else global_step,
            )
            if resume is not None and resume.get("elastic") is not None:
                self._log_elastic(resume["elastic"], global_step)
            workers = f"{self.num_workers} workers" + (
                f" of {self.processes_per_worker} processes" if self.processes_per_worker > 1 else ""
            )
            logger.info(
                f"AdLoCo: {workers}, {len(self.instances)} instances, {self.args.inner_steps} inner "
                f"steps per round, initial batch {self.args.per_device_train_batch_size} per worker, max micro-batch "
                f"{self.max_batch_size}, batch-size test {self.args.batch_size_test}"
            )

    def _trainable(self) -> list[torch.nn.Parameter]:
        return [p for p in self._model.parameters() if p.requires_grad]

    def _part(self) -> list[torch.Tensor]:
        """What AdLoCo's φ mirrors on this process: the trainable parameters, or with FSDP their local shards
        (aliases of the sharded parameters' storage)."""
        if self.fsdp:
            worker_fsdp.reshard(self._model)
            return worker_fsdp.local_shards(self._trainable())
        return self._trainable()

    def reshard(self) -> None:
        """FSDP: every unit back to its shards (after an evaluation's forward the root stays unsharded), so that
        writes to the shards are the ones the next forward gathers. Nothing otherwise."""
        if self.fsdp and self._model is not None:
            worker_fsdp.reshard(self._model)

    def shard(self, model: torch.nn.Module) -> None:
        """worker_parallelism="fsdp": shard `model` over this worker's processes (collective on every rank: the intra
        groups are made here; before the optimizer exists)."""
        if self.fsdp:
            worker_fsdp.shard_model(model, self.intra_group)

    def full_values(self, flat: torch.Tensor) -> list[torch.Tensor]:
        """The trainable parameters' values held in `flat` (a φ of this process), full-shaped. With FSDP collective
        over the worker's processes (each contributes its shard); otherwise views of `flat`."""
        if not self.fsdp:
            return self.global_model.views_of(flat)
        return worker_fsdp.full_values(self._trainable(), self.global_model.views_of(flat))

    def full_state_dict(self) -> dict[str, torch.Tensor] | None:
        """With FSDP the model's full state dict (collective over the worker's processes); None otherwise."""
        if not self.fsdp:
            return None
        worker_fsdp.reshard(self._model)
        return worker_fsdp.full_state_dict(self._model)

    def full_save_state(self, flat: torch.Tensor) -> dict[str, torch.Tensor]:
        """With FSDP: the full state dict (CPU, the model's dtypes) whose trainable parameters hold `flat`, this
        process's shard of a φ; what `save_model_folder` writes. Collective over the worker's processes."""
        base = self.full_state_dict()
        names = [n for n, p in self._model.named_parameters() if p.requires_grad]
        for name, value in zip(names, self.full_values(flat)):
            base[name] = value.to(base[name].dtype).contiguous()
        return base

    @torch.no_grad()
    def _initialise_shards(self, model: torch.nn.Module, inst: Instance, group) -> None:
        """`initialise_weights` for a sharded model: the same, shard by shard over this local rank's groups."""
        shards = worker_fsdp.local_shards(list(model.state_dict().values()))
        tensors = list({t.data_ptr(): t for t in shards if t.numel()}.values())  # tied weights once
        if self.args.instance_init == "shared":
            broadcast_tensors(tensors, src=self.layout.rank(0, self.local_rank), group=self.all_workers_group)
            return
        if self.worker_id == inst.first_worker:
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(self.args.seed + inst.id)
                fresh = type(model)(model.config).state_dict()
            worker_fsdp.load_full_state_dict(model, fresh)
        if len(inst.workers) > 1:
            broadcast_tensors(tensors, src=self.layout.rank(inst.first_worker, self.local_rank), group=group)

    def _refresh_groups(self) -> None:
        # Every rank creates the groups of every instance, in id order: new_group is collective. With G processes per
        # worker: each local rank's group over the instance's workers, the instance's processes (evaluation), and
        # each local rank's group over all workers (final merge, merged-model evaluation).
        g = self.processes_per_worker
        for inst in sorted(self.instances, key=lambda x: x.id):
            for local in range(g):
                ranks = self.layout.cross_ranks(inst.workers, local)
                self.groups.get(ranks)
                self.outer_groups.get(ranks)
            if g > 1:
                self.groups.get(self.layout.ranks_of_workers(inst.workers))
        if g > 1:
            for local in range(g):
                self.groups.get(self.layout.cross_ranks(range(self.num_workers), local))

    def _cross(self, workers) -> tuple[int, ...]:
        """The global ranks of this local rank in `workers` (the workers themselves with one process per worker)."""
        return self.layout.cross_ranks(workers, self.local_rank)

    @property
    def intra_group(self):
        """The process group of this worker's processes (None with one process per worker). Made on first use, with
        every worker's, in worker order on every rank (new_group is collective)."""
        if self.processes_per_worker == 1:
            return None
        if self._intra_group is None:
            for ranks in self.layout.intra_groups():
                self.groups.get(ranks)
            self._intra_group = self.groups.get(self.layout.ranks_of(self.worker_id))
        return self._intra_group

    @property
    def all_workers_group(self):
        """This local rank of every worker (the world with one process per worker)."""
        return self.groups.get(self.layout.cross_ranks(range(self.num_workers), self.local_rank))

    @property
    def instance(self) -> Instance:
        """The instance this worker trains now."""
        return instance_of(self.instances, self.worker_id)

    @property
    def rules(self) -> RoundRules:
        """The settings of every round's decision; a request never exceeds this worker's data shard either."""
        return RoundRules.from_args(self.args, max_batch_size=self.max_batch_size, shard_size=self._sampler.shard_size)

    def _apply_plan(self) -> None:
        """The batch of this worker's next round: to the sampler, and to the learning rate if it follows the batch."""
        # A worker's request is split evenly over its processes (a multiple of processes_per_worker).
        request = self.instance.batch_size // self.processes_per_worker
        self.plan = plan_batch(request, self.max_batch_size, self.args.switch_threshold)
        self._sampler.batch_size = self.plan.batch_size
        if self.args.lr_batch_scaling != "none":
            factor = lr_factor(self.args.lr_batch_scaling, self.plan.batch_size, self.args.per_device_train_batch_size)
            apply_lr_factor(self._optimizer, self._scheduler, self._base_lrs, factor)
        if self.args.lr_batch_scaling in ADAM_RULES:
            initial = self.args.per_device_train_batch_size
            apply_adam_scaling(self._optimizer, self._base_adam, self.plan.batch_size, initial)

    # ---- inner steps ----
    def is_round_end(self, step: int) -> bool:
        """Whether the round ends after `step` inner steps: at every multiple of the round's H (which divides
        `max_inner_steps`, and so every save and evaluation step), or at max_steps (the last round may be short)."""
        return step % self.inner_steps == 0 or step >= self.max_steps

    def steps_to_round_end(self, step: int) -> int:
        """Inner steps from `step` to the end of its round (0 at a round's end)."""
        if step == self.last_synced_step:
            return 0
        next_end = min(-(-step // self.inner_steps) * self.inner_steps, self.max_steps)
        return next_end - step

    def plan_step(self, step: int, batch: int) -> StepPlan:
        """How to run the inner step about to start (0-based `step`) on a batch of `batch` samples."""
        if self._rng_to_restore is not None:
            set_rng_state(self._rng_to_restore)  # the first step after a resume draws what the saved run would have
            self._rng_to_restore = None
        return plan_step(
            batch,
            self.plan,
            measure=self.args.batch_size_test != "none" and self.collector is not None,
            last_of_round=self.is_round_end(step + 1),
            next_last_of_round=self.is_round_end(step + 2),
            has_previous=self.collector is not None and self.collector.has_previous,
        )

    def local_gradient_step(self, step: int) -> bool:
        """Whether the inner step about to start (0-based `step`) must keep this process's own gradient until
        `sync_gradients` (processes_per_worker > 1): the steps whose gradient statistics or remembered gradient are
        read. Decided from the step and the plan only, identical on the worker's processes (a process that synced
        while another did not would hang DDP)."""
        if self.processes_per_worker == 1 or self.args.batch_size_test == "none" or self.collector is None:
            return False
        if self.fsdp:
            return False  # FSDP's statistics are read from the synced shards (two halves), never local gradients
        one_sample = self.plan.batch_size == 1 and not self.plan.accumulates
        return self.is_round_end(step + 1) or (one_sample and self.is_round_end(step + 2))

    @torch.no_grad()
    def sync_gradients(self) -> None:
        """The worker's mean gradient from its processes' own (after a `local_gradient_step`): one all-reduce over
        the intra group, the mean DDP would have computed. Every process of the worker ends with the same `.grad`."""
        grads = [p.grad for p in self._trainable() if p.grad is not None]
        if not grads:
            return
        flat = torch.cat([g.reshape(-1).to(torch.float32) for g in grads])
        dist.all_reduce(flat, group=self.intra_group)
        flat.div_(self.processes_per_worker)
        offset = 0
        for g in grads:
            g.copy_(flat[offset : offset + g.numel()].view_as(g))
            offset += g.numel()

    def start_statistics(self, chunk_weights: list[float]) -> None:
        """The step's chunks are about to run as statistics groups with these weights (summing to 1)."""
        self.collector.start(chunk_weights, self._root_preconditioner())

    def _root_preconditioner(self) -> list[torch.Tensor] | None:
        """√P of `noise_preconditioner="adam"` now (None: the Euclidean metric, or no second moments yet)."""
        if self.args.noise_preconditioner != "adam":
            return None
        return adam_root_preconditioner(self._optimizer, self.collector.params)

    def begin_chunk(self, index: int) -> None:
        self.collector.begin_chunk(index)

    def finish_step(self, plan: StepPlan, loss: torch.Tensor, samples: int, tokens: torch.Tensor | int) -> None:
        """Close a step: its statistics (if it measured any), and its loss, samples and tokens for the round."""
        if plan.statistics is not Statistics.NONE or plan.remember_gradient:
            scale = self._loss_scale()
            root = self._root_preconditioner() if plan.statistics is not Statistics.NONE else None
            if plan.statistics is Statistics.SPLIT and self.collector.active:
                # FSDP: each half's gradient is the mean over the worker's processes, a group of G × its samples.
                measured = samples * self.processes_per_worker if self.fsdp else samples
                self._tally.stats = self.collector.finish(samples=measured, loss_scale=scale)
            elif plan.statistics is Statistics.PREVIOUS:
                self._tally.stats = self.collector.finish_with_previous(loss_scale=scale, root_preconditioner=root)
            if plan.statistics is not Statistics.NONE and self.args.noise_preconditioner == "adam" and root is None:
                self._tally.stats = None  # before Adam's first step there is no metric to measure in
            if plan.remember_gradient:
                self.collector.remember(loss_scale=scale)
        self._tally.add_step(loss, samples, tokens)

    @property
    def round_statistics(self) -> GradientStatistics | None:
        """The gradient statistics this worker measured in the current round (None until its statistics step)."""
        return self._tally.stats

    def _loss_scale(self) -> float:
        scaler = self._scaler
        return float(scaler.get_scale()) if scaler is not None and scaler.is_enabled() else 1.0

    # ---- end of a round ----
    def end_round(self, global_step: int) -> RoundResult:
        """Outer step, decisions from the all-gathered reports, merge if due, logs (every rank, same order)."""
        where = f"round {self.outer_step + 1} (step {global_step})"
        self.monitor.check(where, self.resume_hint)
        if self.fsdp:
            worker_fsdp.reshard(self._model)  # φ is written into the sharded parameters
        self.outer_step += 1
        inst = self.instance
        started = time.perf_counter()
        group = self.outer_groups.get(self._cross(inst.workers))
        result = self.global_model.outer_step(group=group, num_workers=len(inst.workers))
        if result.skipped or not result.local_finite:
            self._clean_inner_optimizer()
        tally = self._tally
        # FSDP: the worker's processes measured the same statistics (sums over the shards): local rank 0 reports them.
        stats = None if self.fsdp and self.local_rank > 0 else tally.stats
        report = WorkerReport(
            instance=inst.id,
            stats=stats or GradientStatistics.missing(),
            loss_sum=float(tally.loss_sum),
            loss_steps=tally.loss_steps,
            samples=tally.samples,
            tokens=float(tally.tokens),
            pseudo_grad_norm=result.pseudo_grad_norm,
            payload_bytes=result.payload_bytes,
            comm_seconds=result.seconds,
            outer_seconds=time.perf_counter() - started,
            skipped=result.skipped,
            preempt=self.preemption.requested,
            local_sq_norm=result.local_sq_norm,
        )
        rows = self.monitor.gather_rows(report.to_row(), f"{where}, reports", self.resume_hint)
        reports = [WorkerReport.from_row(row) for row in rows]
        decision = decide_round(
            self.instances,
            reports,
            outer_step=self.outer_step,
            global_step=global_step,
            rules=self.rules,
            inner_steps=self.inner_steps,
        )
        merge = None
        if decision.merge is not None:
            merge = self._merge(decision.merge)
            survivor = decision.lines[merge.plan.survivor]
            survivor.comm_bytes += merge.bytes
            survivor.merge_bytes = merge.bytes
            survivor.merge_seconds = merge.seconds
        self.instances = decision.instances
        if merge is not None:
            self._refresh_groups()
        lines = [decision.lines[i] for i in sorted(decision.lines)]
        for line in lines:
            line.inner_steps = global_step - self.last_synced_step
        self.totals.tokens += int(sum(r.tokens for r in reports))
        self.totals.comm_bytes += sum(line.comm_bytes for line in lines)
        self.totals.skipped_rounds += sum(1 for line in lines if line.skipped)
        elapsed = self._elapsed()
        for line in lines:
            line.num_instances, line.total_tokens, line.elapsed_seconds = (
                len(self.instances),
                self.totals.tokens,
                elapsed,
            )
        self._apply_plan()
        self._tally = RoundTally()
        self.last_synced_step = global_step
        if decision.next_inner_steps != self.inner_steps and decision.next_inner_steps is not None:
            if self.rank == 0:
                logger.info(
                    "inner steps per round: %d -> %d (the workers' pseudo-gradients agree: outer noise %s)",
                    self.inner_steps,
                    decision.next_inner_steps,
                    ", ".join(f"{line.outer_noise:.3g}" for line in lines if line.outer_noise is not None),
                )
            self.inner_steps = decision.next_inner_steps
        if self.rank == 0:
            self.run_log.write_rounds([line.to_json() for line in lines])
            message = round_message(lines, len(self.instances), None if merge is None else merge.plan)
            (logger.warning if any(line.skipped for line in lines) else logger.info)(message)
            for warning in decision.warnings:  # a merged instance that made no progress
                logger.warning(warning)
        if decision.failure is not None:  # every rank decides it alike, so all of them stop here
            raise SkippedRoundsError(f"{decision.failure} {self.resume_hint()}")
        preempted = any(r.preempt for r in reports)
        return RoundResult(lines=lines, merge=merge, preempted=preempted)

    def resume_hint(self) -> str:
        """What to do after a lost worker: named only when it happens (it lists the output folder)."""
        return resume_hint(self.args.output_dir)

    def _clean_inner_optimizer(self) -> None:
        """After a skipped round, non-finite inner-optimizer moments would poison every later step: zero them."""
        for values in self._optimizer.state.values():
            for value in values.values():
                if torch.is_tensor(value) and value.is_floating_point():
                    torch.nan_to_num_(value, nan=0.0, posinf=0.0, neginf=0.0)

    def _merge(self, plan: MergePlan) -> MergeResult:
        # Overlapped outer steps: every worker applies its instance's average in flight first, so that the workers
        # of each instance hold the same φ (all ranks merge in the same round, so all of them settle here).
        self.global_model.settle()
        workers_before = self.instance.workers
        result, changed_instance = merging.merge_at_round_end(
            plan,
            f"merge at round {self.outer_step}",
            rank=self.worker_id,
            global_model=self.global_model,
            # FSDP: the optimizer's shards travel as plain tensors (point-to-point merges send them to joiners)
            inner_optimizer=worker_fsdp.LocalOptimizerState(self._optimizer) if self.fsdp else self._optimizer,
            with_momentum=self.args.outer_momentum > 0,
            save=self.args.save_merges,
            monitor=self.monitor,
            hint=self.resume_hint,
            transport=self.args.merge_transport,
            groups=self.groups,  # every rank creates the merge's groups here, in the same order
            layout=self.layout,
            local_rank=self.local_rank,
            global_rank=self.rank,
            gather=self.full_save_state if self.fsdp else None,
        )
        if changed_instance:
            self.collector.forget()  # its kept gradient belongs to the old instance's weights
        if instance_of(plan.after, self.worker_id).workers != workers_before or changed_instance:
            self.global_model.reduce.reset_error_feedback()  # the residual belonged to the old ring
        self.totals.merges += 1
        return result

    # ---- end of training ----
    def finish(self) -> None:
        """Turn the surviving instances into one model on every worker (collective; idempotent)."""
        if self.final_merged:
            return
        if self.rank == 0:
            for warning in final_merge_warnings(self.instances):
                logger.warning(warning)
        if self.fsdp:
            worker_fsdp.reshard(self._model)  # φ is written into the sharded parameters
        with self.monitor.watch("final merge", self.resume_hint):
            self.global_model.settle()  # overlapped: the last round's average, so every instance's workers agree
            group = self.monitor.message_group
            several = self.processes_per_worker > 1
            sent = merging.final_merge(
                self.instances,
                rank=self.worker_id,
                global_model=self.global_model,
                group=group,
                layout=self.layout if several else None,
                local_rank=self.local_rank,
                broadcast_group=self.all_workers_group if several else None,
            )
        rows = self.monitor.gather_rows([sent], "final merge", self.resume_hint)
        self.totals.comm_bytes += int(sum(r[0] for r in rows))
        self.final_merged = True

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

    # ---- checkpoints ----
    def state_dict(self) -> dict[str, Any]:
        """This worker's resume state: instance table, φ and momentum, inner optimizer, sampler, scaler, totals."""
        elapsed = self._elapsed()
        return {
            "world_size": self.world_size,
            "rank": self.rank,
            "processes_per_worker": self.processes_per_worker,
            "outer_step": self.outer_step,
            "last_synced_step": self.last_synced_step,
            "inner_steps": self.inner_steps,
            "instances": [i.to_row() for i in self.instances],
            "max_batch_size": self.max_batch_size,
            "base_lrs": self._base_lrs,
            "base_adam": self._base_adam,
            "global_model": self.global_model.state_dict(),
            "inner_optimizer": self._inner_optimizer_state(),
            "sampler": self._sampler.state_dict(),
            "scaler": None if self._scaler is None else self._scaler.state_dict(),
            "totals": {**asdict(self.totals), "elapsed": elapsed},
            "rng": get_rng_state(),
            "round": self._tally.state_dict(self._part(), self.collector),
        }

    def _inner_optimizer_state(self) -> dict[str, Any]:
        """The inner optimizer's state dict; with FSDP this process's shards as plain tensors."""
        state = self._optimizer.state_dict()
        return worker_fsdp.local_optimizer_state(state) if self.fsdp else state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Keep a checkpoint's state until `start` (models and optimizers are set up in between). The trainer has
        checked that the checkpoint has one state per worker (`checkpoint.check_rank_states`); one written by another
        number of workers comes re-split for this rank (`elastic.elastic_rank_state`)."""
        self._pending = state

    def _restore(self, state: dict[str, Any]) -> None:
        check_sampler_kind(state["sampler"], self._sampler)  # a stream's position cannot restore a map-style run
        saved_g = int(state.get("processes_per_worker", 1))
        if saved_g != self.processes_per_worker:
            raise ValueError(
                f"the checkpoint was written with processes_per_worker={saved_g}, this run has "
                f"processes_per_worker={self.processes_per_worker}: resume with processes_per_worker={saved_g}"
            )
        self.outer_step = int(state["outer_step"])
        self.last_synced_step = int(state["last_synced_step"])
        self.inner_steps = int(state.get("inner_steps", self.args.inner_steps))  # older checkpoints: fixed H
        self.max_batch_size = int(state["max_batch_size"])
        # The scheduler was loaded from rank 0's files, scaled for rank 0's batch: start again from the unscaled rates.
        self._base_lrs = list(state.get("base_lrs") or self._base_lrs)
        self._base_adam = [dict(group) for group in state.get("base_adam") or self._base_adam]  # likewise
        self.totals = RunTotals(**state["totals"])
        self._train_start = time.time()
        self.global_model.load_state_dict(state["global_model"])
        self.global_model.copy_to_params()
        inner = state["inner_optimizer"]
        if self.fsdp:
            inner = worker_fsdp.sharded_optimizer_state(inner, self._optimizer)
        self._optimizer.load_state_dict(inner)
        self._sampler.load_state_dict(state["sampler"])
        if self._scaler is not None and state["scaler"] is not None:
            self._scaler.load_state_dict(state["scaler"])
        if state.get("round") is not None:
            self._tally = RoundTally.restore(state["round"], self._part(), self.collector)
        self._rng_to_restore = state.get("rng")  # right before the first inner step, see `rng.py`
        if state.get("elastic") is not None:
            self._settle_elastic()
        self._pending = None

    def _settle_elastic(self) -> None:
        """After an elastic resume (`elastic.py`) every worker of an instance holds the same φ (overlapped: the
        average in flight applied, the offset dropped), the compression residual of the old ring is dropped, and a
        new rank gets random generators of its own (seeded by seed, rank and step), not the shared initial ones."""
        self.global_model.settle()
        self.global_model.reduce.reset_error_feedback()
        if self._rng_to_restore is None:
            set_seed(hash((self.args.seed, self.rank, self.last_synced_step)) % 2**32)
            self._rng_to_restore = get_rng_state()

    def _log_elastic(self, elastic: dict[str, Any], global_step: int) -> None:
        """Rank 0: the elastic resume in the log (WARNING) and as a line of `adloco_resumes.jsonl`."""
        logger.warning(
            f"elastic resume: {elastic['checkpoint']} was written by {elastic['from_workers']} workers, this run has "
            f"{elastic['to_workers']}; " + "; ".join(elastic["lines"])
        )
        keys = ("checkpoint", "from_workers", "to_workers", "workers_before", "workers_after", "optimizer_sources")
        line = {"global_step": global_step, "outer_step": self.outer_step, **{key: elastic[key] for key in keys}}
        line["data"] = "map-style: every sample of the passes started is drawn exactly once by old and new workers"
        self.run_log.record_resume(line)
