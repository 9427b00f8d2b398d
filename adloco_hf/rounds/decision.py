"""One round's decision, as pure functions over typed records: no process group, no Trainer, no model.

At the end of every round each worker contributes a `WorkerReport` to one all-gather; every rank then calls
`decide_round` on the same reports and so takes the same decisions: each instance's next batch request (the
batch-size test on the pooled gradient statistics), whether a merge is due and which, and the `RoundLine` that
`adloco_rounds.jsonl` records for every instance. `AdLoCoState` is the run's running totals, the typed view users
read as `trainer.adloco_state`.
"""

import math
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from ..batch.controller import ControllerRules, next_request
from ..batch.lr_scaling import lr_factor
from ..batch.size_tests import GradientStatistics, PooledStatistics, pool_statistics
from ..batch.switch_mode import plan_batch
from ..common.formats import format_bytes
from ..instances.health import merge_warnings, skipped_rounds_failure
from ..instances.merges import MergeResult
from ..instances.table import Instance, MergePlan, merge_is_due, plan_merge
from ..outer.step import ring_all_reduce_bytes


__all__ = [
    "AdLoCoState",
    "MergeResult",
    "RoundResult",
    "RoundDecision",
    "RoundLine",
    "RoundRules",
    "RunTotals",
    "WorkerReport",
    "decide_round",
    "merge_record",
    "round_logs",
    "round_message",
    "run_summary",
]


@dataclass(frozen=True)
class WorkerReport:
    """What one worker tells every other at the end of a round (one row of the round-end all-gather)."""

    instance: int
    stats: GradientStatistics
    loss_sum: float
    loss_steps: int
    samples: int
    tokens: float
    pseudo_grad_norm: float
    payload_bytes: int
    comm_seconds: float
    outer_seconds: float
    skipped: bool
    preempt: bool = False  # this worker got SIGTERM/SIGINT, or agreed to stop at this round's end
    local_sq_norm: float = math.nan  # ‖Δ_w‖² of this worker's own pseudo-gradient (nan: not measured)

    _SCALARS = (
        "loss_sum",
        "loss_steps",
        "samples",
        "tokens",
        "pseudo_grad_norm",
        "payload_bytes",
        "comm_seconds",
        "outer_seconds",
        "skipped",
        "preempt",
        "local_sq_norm",
    )

    def to_row(self) -> list[float]:
        """The flat row of floats the all-gather carries."""
        return [float(self.instance), *self.stats.as_list(), *(float(getattr(self, k)) for k in self._SCALARS)]

    @classmethod
    def from_row(cls, row: list[float]) -> "WorkerReport":
        width = len(GradientStatistics.FIELDS)
        stats = GradientStatistics.from_list(row[1 : 1 + width])
        values = dict(zip(cls._SCALARS, row[1 + width :]))
        return cls(
            instance=int(row[0]),
            stats=stats,
            loss_sum=values["loss_sum"],
            loss_steps=int(values["loss_steps"]),
            samples=int(values["samples"]),
            tokens=values["tokens"],
            pseudo_grad_norm=values["pseudo_grad_norm"],
            payload_bytes=int(values["payload_bytes"]),
            comm_seconds=values["comm_seconds"],
            outer_seconds=values["outer_seconds"],
            skipped=bool(values["skipped"]),
            preempt=bool(values["preempt"]),
            local_sq_norm=values["local_sq_norm"],
        )


@dataclass(frozen=True)
class RoundRules:
    """The settings a round's decision depends on (taken from `AdLoCoConfig` and the resolved micro-batch limit)."""

    batch_size_test: str
    eta: float
    theta: float
    nu: float
    max_batch_size: int
    switch_threshold: float
    request_cap: int | None
    merge_every: int
    merge_policy: str
    lr_batch_scaling: str = "none"
    reference_batch_size: int = 1
    max_skipped_rounds: int | None = None  # None: never stop for skipped rounds
    # The request's controller (`batch_controller`) and the merge's batch rule; the defaults are the paper's.
    batch_size_smoothing: float = 0.0
    nonpositive_signal: str = "clamp"
    batch_size_shrink: bool = False
    shrink_hysteresis: float = 0.5
    batch_size_floor: int = 1
    batch_size_target: str = "test"
    noise_scale_multiple: float = 1.0
    merge_batch_rule: str = "paper"
    # How many inner steps the next round has (`inner_steps_rule`): fixed, or doubled up to max_inner_steps while the
    # workers' pseudo-gradients agree (outer noise ≤ outer_noise_theta²).
    inner_steps_rule: str = "fixed"
    max_inner_steps: int | None = None
    outer_noise_theta: float = 0.5
    processes_per_worker: int = 1  # G: requests are per worker and multiples of G, each process draws 1/G

    @property
    def controller(self) -> ControllerRules:
        return ControllerRules(
            test=self.batch_size_test,
            eta=self.eta,
            theta=self.theta,
            nu=self.nu,
            cap=self.request_cap,
            smoothing=self.batch_size_smoothing,
            nonpositive_signal=self.nonpositive_signal,
            shrink=self.batch_size_shrink,
            shrink_hysteresis=self.shrink_hysteresis,
            floor=self.batch_size_floor,
            target=self.batch_size_target,
            noise_scale_multiple=self.noise_scale_multiple,
        )

    @classmethod
    def from_args(cls, args, *, max_batch_size: int, shard_size: int | None) -> "RoundRules":
        """From an `AdLoCoConfig`; a request is capped by `batch_size_cap` and by a worker's data shard (None for a
        stream, which has no shard to exhaust: then only `batch_size_cap` caps it, or nothing). `shard_size` and
        `max_batch_size` are a process's; with G processes per worker the worker's shard is G of them."""
        g = getattr(args, "processes_per_worker", 1)
        caps = [
            cap for cap in (args.batch_size_cap, None if shard_size is None else g * shard_size) if cap is not None
        ]
        cap = min(caps) if caps else None
        return cls(
            batch_size_test=args.batch_size_test,
            eta=args.eta,
            theta=args.theta,
            nu=args.nu,
            max_batch_size=max_batch_size,
            switch_threshold=args.switch_threshold,
            request_cap=cap,
            merge_every=args.merge_every,
            merge_policy=args.merge_policy,
            lr_batch_scaling=args.lr_batch_scaling,
            reference_batch_size=args.per_device_train_batch_size,
            max_skipped_rounds=args.max_skipped_rounds,
            batch_size_smoothing=args.batch_size_smoothing,
            nonpositive_signal=args.nonpositive_signal,
            batch_size_shrink=args.batch_size_shrink,
            shrink_hysteresis=args.shrink_hysteresis,
            batch_size_floor=args.batch_size_floor or g * args.per_device_train_batch_size,
            batch_size_target=args.batch_size_target,
            noise_scale_multiple=args.noise_scale_multiple,
            merge_batch_rule=args.merge_batch_rule,
            inner_steps_rule=args.inner_steps_rule,
            max_inner_steps=args.max_inner_steps,
            outer_noise_theta=args.outer_noise_theta,
            processes_per_worker=g,
        )


@dataclass
class RoundLine:
    """One line of `adloco_rounds.jsonl`: one instance in one round (the DESIGN §4 keys and a few more)."""

    outer_step: int
    global_step: int
    instance: int
    workers: list[int]
    batch_size: int
    next_batch_size: int
    micro_batch_size: int
    accumulation_steps: int
    lr_factor: float
    samples: int
    tokens: int
    train_loss: float
    grad_variance: float
    grad_sq_norm: float
    grad_ip_variance: float
    grad_orth_variance: float
    stats_dof: float
    pseudo_grad_norm: float
    comm_bytes: int
    comm_seconds: float
    outer_seconds: float
    merged_from: list[int] = field(default_factory=list)
    skipped: bool = False
    skipped_in_a_row: int = 0  # this round included, while it is skipped
    merge_bytes: int | None = None  # the merge's bytes, on the survivor's line only
    merge_seconds: float = 0.0
    noise_scale: float | None = None  # tr Σ / ‖∇F‖² from the controller's averages (None while ‖∇F‖² ≤ 0)
    inner_steps: int = 0  # the inner steps this round ran (H; the first round after H doubled may run fewer)
    outer_noise: float | None = None  # the workers' pseudo-gradients' variance / (M ‖Δ̄‖²) (None: one worker, overlap)
    num_instances: int = 0
    total_tokens: int = 0
    elapsed_seconds: float = 0.0
    # G > 1 only (left out of the file for G = 1): the processes of each worker; `micro_batch_size` is a process's.
    processes_per_worker: int = 1
    processes: list[int] | None = None
    # G > 1: the bytes each local rank of a worker contributes to the all-reduce between workers (its slice of the
    # pseudo-gradient, about 1/G of the payload each: a node's G links share the traffic); `comm_bytes` is their
    # ring total.
    process_payload_bytes: list[int] | None = None

    @property
    def batch_size_used(self) -> int:
        """Samples each worker of the instance used per inner step this round: the request `batch_size`, or
        `max_batch_size` (of each of its G processes) where switch mode capped it (a request above it but within
        `switch_threshold` × it)."""
        return self.batch_size if self.accumulation_steps > 1 else self.processes_per_worker * self.micro_batch_size

    def to_json(self) -> dict[str, Any]:
        line = asdict(self)
        if line["merge_bytes"] is None:
            del line["merge_bytes"]
        if self.processes_per_worker == 1:
            del line["processes_per_worker"], line["processes"], line["process_payload_bytes"]
        return line


@dataclass(frozen=True)
class RoundDecision:
    """What every rank decided from the same reports: the round's lines, the table after it and the merge, if due."""

    lines: dict[int, RoundLine]
    instances: list[Instance]
    merge: MergePlan | None
    warnings: list[str] = field(default_factory=list)  # merges of instances that made no progress (`health.py`)
    failure: str | None = None  # why the run stops: an instance skipped more than max_skipped_rounds in a row
    next_inner_steps: int | None = None  # the next round's inner steps (None: unchanged)


def _line(
    inst: Instance,
    members: list[WorkerReport],
    pooled: PooledStatistics,
    next_batch: int,
    *,
    outer_step: int,
    global_step: int,
    rules: RoundRules,
) -> RoundLine:
    g = rules.processes_per_worker
    plan = plan_batch(inst.batch_size // g, rules.max_batch_size, rules.switch_threshold)
    steps = sum(m.loss_steps for m in members)
    # Local rank l of every worker all-reduces slice l: the ring bytes of the first worker's G processes' payloads.
    first = members[:g]
    return RoundLine(
        outer_step=outer_step,
        global_step=global_step,
        instance=inst.id,
        workers=list(inst.workers),
        batch_size=inst.batch_size,
        next_batch_size=next_batch,
        micro_batch_size=plan.micro_batch_size,
        accumulation_steps=plan.accumulation_steps,
        lr_factor=lr_factor(rules.lr_batch_scaling, plan.batch_size, rules.reference_batch_size),
        samples=int(sum(m.samples for m in members)),
        tokens=int(sum(m.tokens for m in members)),
        train_loss=sum(m.loss_sum for m in members) / steps if steps else math.nan,
        grad_variance=pooled.variance,
        grad_sq_norm=pooled.grad_sq_norm,
        grad_ip_variance=pooled.ip_variance,
        grad_orth_variance=pooled.orth_variance,
        stats_dof=pooled.dof,
        pseudo_grad_norm=members[0].pseudo_grad_norm,
        comm_bytes=sum(ring_all_reduce_bytes(m.payload_bytes, len(inst.workers)) for m in first),
        comm_seconds=max(m.comm_seconds for m in members),
        outer_seconds=max(m.outer_seconds for m in members),
        skipped=any(m.skipped for m in members),
        processes_per_worker=g,
        processes=[w * g + local for w in inst.workers for local in range(g)] if g > 1 else None,
        process_payload_bytes=[m.payload_bytes for m in first] if g > 1 else None,
    )


def decide_round(
    instances: list[Instance],
    reports: list[WorkerReport],
    *,
    outer_step: int,
    global_step: int,
    rules: RoundRules,
    inner_steps: int | None = None,
) -> RoundDecision:
    """Every instance's next request and round line, and the merge if one is due (pure; the same on every rank).

    Args:
        instances: the table during the round that just ended.
        reports: one per global rank, in rank order (G per worker: worker w's are ranks w·G … w·G + G − 1, and their
            statistics pool with the other processes', G groups per worker).
        outer_step: the 1-based number of the round that just ended.
        global_step: the Trainer's step at its end.
        rules: the settings the decision depends on.
        inner_steps: the round's inner steps H (for its lines and `next_inner_steps`; None: not tracked).

    A skipped round (a non-finite pseudo-gradient on any worker of the instance) keeps the instance's request and
    counts towards its rounds skipped in a row; more than `rules.max_skipped_rounds` of them is the decision's
    `failure`. A merge, when due, is planned on the table with the new requests; `merged_from` is set on the
    survivor's line, and a merged instance that made no progress gets a warning (`health.py`).
    """
    lines, decided = {}, []
    controller = rules.controller
    g = rules.processes_per_worker
    for inst in instances:
        members = [reports[w * g + local] for w in inst.workers for local in range(g)]
        pooled = pool_statistics([m.stats for m in members])
        next_batch, estimate = inst.batch_size, inst.noise
        if not any(m.skipped for m in members):
            estimate = inst.noise.update(pooled, controller.smoothing)
            next_batch = next_request(
                controller, pooled, estimate, current=inst.batch_size, num_workers=len(inst.workers)
            )
            next_batch = g * math.ceil(next_batch / g)  # each of the worker's processes draws 1/G of it
        line = _line(inst, members, pooled, next_batch, outer_step=outer_step, global_step=global_step, rules=rules)
        scale = estimate.noise_scale
        line.noise_scale = scale if math.isfinite(scale) else None
        decided.append(inst.after_round(next_batch, skipped=line.skipped, noise=estimate))
        line.skipped_in_a_row = decided[-1].skipped_in_a_row
        # One ‖Δ_w‖² per worker (its G processes hold the same Δ).
        line.outer_noise = outer_noise([m.local_sq_norm for m in members[::g]], line.pseudo_grad_norm)
        lines[inst.id] = line
    # Per worker (a non-finite loss on any of its processes makes its sum non-finite).
    losses = {w: sum(reports[w * g + local].loss_sum for local in range(g)) for w in range(len(reports) // g)}
    failure = skipped_rounds_failure(
        decided, losses, outer_step=outer_step, global_step=global_step, max_skipped_rounds=rules.max_skipped_rounds
    )
    merge, warnings = None, []
    if merge_is_due(outer_step, rules.merge_every, len(decided)):
        planning = decided
        if rules.merge_batch_rule == "preserve_total":
            # Demand and merge weights count the samples each instance processed per inner step this round (switch
            # mode may have run fewer than requested), not next round's requests.
            planning = [replace(d, demand=float(lines[d.id].batch_size_used * len(d.workers))) for d in decided]
        merge = plan_merge(
            planning,
            policy=rules.merge_policy,
            num_workers=len(reports) // g,
            batch_rule=rules.merge_batch_rule,
            processes_per_worker=g,
        )
        warnings = merge_warnings(merge, outer_step=outer_step)
        decided = list(merge.after)
        lines[merge.survivor].merged_from = [merge.merged]
    next_inner_steps = (
        None if inner_steps is None else next_round_inner_steps(list(lines.values()), inner_steps, rules)
    )
    return RoundDecision(
        lines=lines,
        instances=decided,
        merge=merge,
        warnings=warnings,
        failure=failure,
        next_inner_steps=next_inner_steps,
    )


def outer_noise(local_sq_norms: list[float], mean_norm: float) -> float | None:
    """The relative noise of an instance's averaged pseudo-gradient, from its M workers' own squared norms ‖Δ_w‖²
    and the norm of their average Δ̄: the unbiased variance across workers, Σ_w ‖Δ_w − Δ̄‖² / (M − 1)
    = M (mean ‖Δ_w‖² − ‖Δ̄‖²) / (M − 1), over M ‖Δ̄‖². Small: the workers agree, a round could run longer. None with
    one worker, without the workers' norms (overlapped outer steps) or a zero or non-finite average."""
    m = len(local_sq_norms)
    mean_sq = mean_norm**2
    if m < 2 or not all(math.isfinite(x) for x in local_sq_norms) or not math.isfinite(mean_sq) or mean_sq <= 0:
        return None
    return (sum(local_sq_norms) / m - mean_sq) / ((m - 1) * mean_sq)


def next_round_inner_steps(lines: list[RoundLine], inner_steps: int, rules: RoundRules) -> int:
    """`inner_steps_rule="outer_noise"`: the next round runs twice the inner steps (up to `max_inner_steps`) when
    the workers' pseudo-gradients agreed this round: the workers-weighted mean of the instances' outer noise is at
    most `outer_noise_theta²`; otherwise, or with a skipped round or no measurement, the same. H never shrinks."""
    if rules.inner_steps_rule != "outer_noise" or rules.max_inner_steps is None:
        return inner_steps
    measured = [(len(line.workers), line.outer_noise) for line in lines if line.outer_noise is not None]
    if not measured or any(line.skipped for line in lines):
        return inner_steps
    noise = sum(m * value for m, value in measured) / sum(m for m, _ in measured)
    if noise <= rules.outer_noise_theta**2:
        return min(2 * inner_steps, rules.max_inner_steps)
    return inner_steps


@dataclass
class RunTotals:
    """Running totals of a worker's run, saved in its checkpoints (the keys of the `totals` entry)."""

    tokens: int = 0
    comm_bytes: int = 0
    skipped_rounds: int = 0
    merges: int = 0
    elapsed: float = 0.0


@dataclass(frozen=True)
class AdLoCoState:
    """Where an AdLoCo run stands (`trainer.adloco_state`), the same on every worker after each round.

    Attributes:
        rounds: completed rounds (outer steps).
        last_round_step: the Trainer's global step at which the last round ended (0 before the first).
        tokens: tokens trained by all workers together.
        comm_bytes: bytes sent by all workers together (outer steps, merges, the final merge).
        merges: merges so far.
        skipped_rounds: instance-rounds skipped for a non-finite pseudo-gradient.
        elapsed_seconds: training time, across resumes.
        num_instances: instances training now.
        batch_sizes: instance id → per-worker request for the next round.
        workers: instance id → its workers' global ranks.
        final_merged: whether the instances have been merged into the final model.
    """

    rounds: int
    last_round_step: int
    tokens: int
    comm_bytes: int
    merges: int
    skipped_rounds: int
    elapsed_seconds: float
    num_instances: int
    batch_sizes: dict[int, int]
    workers: dict[int, tuple[int, ...]]
    final_merged: bool = False


@dataclass(frozen=True)
class RoundResult:
    """What a round's end did: one line per instance that trained in it, and the merge, if any."""

    lines: list[RoundLine]
    merge: MergeResult | None = None
    preempted: bool = False  # some worker got SIGTERM/SIGINT: every worker stops after this round


def run_summary(state: AdLoCoState, world_size: int, processes_per_worker: int = 1) -> dict[str, Any]:
    """The run in a few numbers, for model cards (`world_size`: the processes of the launch)."""
    summary = {
        "rounds": state.rounds,
        "inner steps": state.last_round_step,
        "workers": world_size // processes_per_worker,
        "instances at the end": state.num_instances,
        "final per-worker batch sizes": dict(state.batch_sizes),
        "merges": state.merges,
        "tokens": state.tokens,
        "bytes communicated": state.comm_bytes,
        "skipped rounds": state.skipped_rounds,
    }
    if processes_per_worker > 1:
        summary["processes per worker"] = processes_per_worker
    return summary


def round_message(lines: list[RoundLine], num_instances: int, merge: MergePlan | None) -> str:
    """The one log line of a round, e.g. `round 3 (step 60) | instances 2 | batch i0=4→6 | loss 5.1 | sent 3.8 MiB`."""
    batches = ", ".join(f"i{line.instance}={line.batch_size}→{line.next_batch_size}" for line in lines)
    losses = [line.train_loss for line in lines if line.train_loss is not None]
    message = (
        f"round {lines[0].outer_step} (step {lines[0].global_step}) | instances {num_instances} | "
        f"batch {batches} | loss {min(losses) if losses else float('nan'):.4f} | "
        f"sent {format_bytes(sum(line.comm_bytes for line in lines))}"
    )
    if merge is not None:
        message += f" | merged {merge.merged}→{merge.survivor} (weights {merge.weights[0]:.2f}/{merge.weights[1]:.2f})"
    skipped = [line for line in lines if line.skipped]
    if skipped:
        in_a_row = ", ".join(f"i{line.instance}: {line.skipped_in_a_row} in a row" for line in skipped)
        message += f" | SKIPPED (non-finite) {[line.instance for line in skipped]} ({in_a_row})"
    return message


def round_logs(lines: list[RoundLine], state: AdLoCoState, instances: list[Instance]) -> dict[str, float]:
    """The `adloco/*` values a round adds to the Trainer's logs (TensorBoard, W&B, ...).

    `adloco/batch_size` is the mean per-worker request for the next round, over all workers; per instance,
    `batch_size_used` is what each of its workers ran in this round and `next_batch_size` its request for the next.
    """
    world_size = sum(len(i.workers) for i in instances)
    demand = {inst.id: inst.demand for inst in instances}
    logs = {
        "adloco/round": state.rounds,
        "adloco/num_instances": state.num_instances,
        "adloco/batch_size": sum(i.batch_size * len(i.workers) for i in instances) / world_size,
        "adloco/comm_bytes": state.comm_bytes,
        "adloco/tokens": state.tokens,
        "adloco/skipped_rounds": state.skipped_rounds,
    }
    variances = [(line.grad_variance, demand.get(line.instance, 0.0)) for line in lines]
    finite = [(v, d) for v, d in variances if v is not None and math.isfinite(v)]
    if finite and sum(d for _, d in finite) > 0:
        logs["adloco/grad_variance"] = sum(v * d for v, d in finite) / sum(d for _, d in finite)
    for line in lines:
        prefix = f"adloco/instance_{line.instance}"
        logs[f"{prefix}/batch_size_used"] = line.batch_size_used
        logs[f"{prefix}/next_batch_size"] = line.next_batch_size
        if line.train_loss is not None and math.isfinite(line.train_loss):
            logs[f"{prefix}/train_loss"] = line.train_loss
        if line.outer_noise is not None:
            logs[f"{prefix}/outer_noise"] = line.outer_noise
    return logs


def merge_record(plan: MergePlan, outer_step: int) -> dict[str, Any]:
    """`adloco_merge.json` of a merge folder (DESIGN §4): instances, demands and weights in the same order."""
    return {
        "outer_step": outer_step,
        "instances": [plan.survivor, plan.merged],
        "demands": list(plan.demands),
        "weights": list(plan.weights),
        "survivor": plan.survivor,
    }
