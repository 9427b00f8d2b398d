"""One round's decision, as pure functions over typed records: no process group, no Trainer, no model.

At the end of every round each worker contributes a `WorkerReport` to one all-gather; every rank then calls
`decide_round` on the same reports and so takes the same decisions: each instance's next batch request (the
batch-size test on the pooled gradient statistics), whether a merge is due and which, the next round's inner steps,
and the `RoundLine` that `adloco_rounds.jsonl` records for every instance.
"""

import math
from dataclasses import dataclass, field, replace

from ..batch.controller import next_request
from ..batch.goodput import GoodputChoice, GoodputModel, choose_request
from ..batch.size_tests import PooledStatistics, pool_statistics
from ..batch.startup_profile import StartupProfile
from ..batch.throughput import StepTimeModel, ThroughputProfile
from ..batch.worker_split import plan_worker_split, resize_split
from ..instances.health import merge_warnings, skipped_rounds_failure
from ..instances.table import Instance, MergePlan, merge_is_due, plan_merge
from ..outer.step import ring_all_reduce_bytes
from .plan import WorkerPlan, plan_instance, plan_round, process_plan
from .rows import RoundLine, WorkerReport
from .rules import RoundRules


__all__ = [
    "RoundDecision",
    "decide_round",
    "goodput_choice",
    "next_round_inner_steps",
    "outer_noise",
    "plan_shares",
    "used_per_worker",
    "worker_sample_seconds",
]


@dataclass(frozen=True)
class RoundDecision:
    """What every rank decided from the same reports: the round's lines, the table after it, the merge if due, and
    every worker's plan for the next round (worker id → [`WorkerPlan`]), planned from that table."""

    lines: dict[int, RoundLine]
    instances: list[Instance]
    merge: MergePlan | None
    plans: dict[int, WorkerPlan] = field(default_factory=dict)
    warnings: list[str] = field(
        default_factory=list
    )  # merges of instances that made no progress (`instances/health.py`)
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
    ran = plan_instance(inst, rules)  # what every worker of the instance ran this round
    requested = process_plan(inst.batch_size // g, rules)  # the request as switch mode ran it (shares aside)
    steps = sum(m.loss_steps for m in members)
    # Local rank l of every worker all-reduces slice l: the ring bytes of the first worker's G processes' payloads.
    first = members[:g]
    seconds = worker_sample_seconds(members, g)
    return RoundLine(
        outer_step=outer_step,
        global_step=global_step,
        instance=inst.id,
        workers=list(inst.workers),
        batch_size=inst.batch_size,
        next_batch_size=next_batch,
        micro_batch_size=requested.micro_batch_size,
        accumulation_steps=requested.accumulation_steps,
        lr_factor=ran[inst.first_worker].lr_factor,
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
        worker_batch_sizes=[ran[w].share for w in inst.workers],
        worker_sample_seconds=[s if math.isfinite(s) else None for s in seconds],
    )


def decide_round(
    instances: list[Instance],
    reports: list[WorkerReport],
    *,
    outer_step: int,
    global_step: int,
    rules: RoundRules,
    inner_steps: int | None = None,
    startup: StartupProfile | None = None,
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
        startup: the run's startup profile (`batch/startup_profile.py`): with `goodput_timing="startup"` the goodput
            rule's step and round costs, for the whole run; None: the rule reads the costs measured on the rounds.

    A skipped round (a non-finite pseudo-gradient on any worker of the instance) keeps the instance's request and
    counts towards its rounds skipped in a row; more than `rules.max_skipped_rounds` of them is the decision's
    `failure`. A merge, when due, is planned on the table with the new requests; `merged_from` is set on the
    survivor's line, and a merged instance that made no progress gets a warning (`instances/health.py`).
    """
    lines, decided = {}, []
    controller = rules.controller
    g = rules.processes_per_worker
    goodput = controller.target == "goodput"
    for inst in instances:
        members = [reports[w * g + local] for w in inst.workers for local in range(g)]
        pooled = pool_statistics([m.stats for m in members])
        next_batch, estimate, choice = inst.batch_size, inst.noise, None
        throughput, times = _costs(inst, members, rules, startup) if goodput else (None, None)
        steps = inner_steps or max(m.loss_steps for m in members)
        if not any(m.skipped for m in members):
            estimate = inst.noise.update(pooled, controller.smoothing)
            if goodput:
                choice = goodput_choice(inst, estimate.noise_scale, times, rules, inner_steps=steps)
                next_batch = inst.batch_size if choice is None else choice.request
            else:
                next_batch = next_request(
                    controller, pooled, estimate, current=inst.batch_size, num_workers=len(inst.workers)
                )
            next_batch = g * math.ceil(next_batch / g)  # each of the worker's processes draws 1/G of it
        line = _line(inst, members, pooled, next_batch, outer_step=outer_step, global_step=global_step, rules=rules)
        scale = estimate.noise_scale
        line.noise_scale = scale if math.isfinite(scale) else None
        if goodput:
            line.step_model = None if times is None else times.as_list()
            if choice is not None:
                line.goodput, line.goodput_kept = choice.goodput, choice.kept
        decided.append(inst.after_round(next_batch, skipped=line.skipped, noise=estimate, throughput=throughput))
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
            cap=controller.cap,
        )
        warnings = merge_warnings(merge, outer_step=outer_step)
        decided = list(merge.after)
        lines[merge.survivor].merged_from = [merge.merged]
        lines[merge.merged].merged_into = merge.survivor
        # The next round runs the requests the merge left (`merge_batch_rule`, over the redistributed workers), not
        # the ones the instances asked for: the lines say both, named apart.
        for inst in decided:
            line = lines[inst.id]
            if inst.batch_size != line.next_batch_size:
                line.asked_batch_size, line.next_batch_size = line.next_batch_size, inst.batch_size
    if rules.split.rule == "speed":
        decided = plan_shares(decided, reports, rules)
    next_inner_steps = (
        None if inner_steps is None else next_round_inner_steps(list(lines.values()), inner_steps, rules)
    )
    return RoundDecision(
        lines=lines,
        instances=decided,
        merge=merge,
        plans=plan_round(decided, rules),
        warnings=warnings,
        failure=failure,
        next_inner_steps=next_inner_steps,
    )


def used_per_worker(batch_size: int, rules: RoundRules) -> int:
    """The samples a worker of an instance requesting `batch_size` per worker trains per inner step, as switch mode
    runs it (capped at `max_batch_size` per process between it and `switch_threshold` × it)."""
    return rules.processes_per_worker * process_plan(batch_size // rules.processes_per_worker, rules).batch_size


def worker_sample_seconds(members: list[WorkerReport], processes_per_worker: int) -> list[float]:
    """Each worker's seconds per sample over the round, from its processes' reports (in worker order, G each): its
    slowest process's inner-step seconds (DDP keeps them in step) over the samples all of them trained. NaN for a
    worker that trained nothing (or measured no time)."""
    g = processes_per_worker
    out = []
    for start in range(0, len(members), g):
        processes = members[start : start + g]
        seconds, samples = max(m.step_seconds for m in processes), sum(m.samples for m in processes)
        out.append(seconds / samples if samples > 0 and seconds > 0 else math.nan)
    return out


def plan_shares(instances: list[Instance], reports: list[WorkerReport], rules: RoundRules) -> list[Instance]:
    """`worker_batch_split="speed"`: every instance's split of its next total among its workers (after a merge,
    among the workers it has now), from the seconds per sample each worker measured this round
    (`batch/worker_split.py`), kept (resized when the request moved) unless a new one ends a round sooner by more
    than `split_hysteresis`. An equal split is stored as no shares, so a run whose workers keep equal speeds
    holds the same instance table, and takes the same steps, as one with `worker_batch_split="equal"`."""
    g = rules.processes_per_worker
    seconds = worker_sample_seconds(reports, g)  # every worker, in worker order
    planned = []
    for inst in instances:
        used = used_per_worker(inst.batch_size, rules)
        split = rules.split
        total, minimum = used * len(inst.workers), min(split.min_share, used)
        limit = None if split.share_limit is None else max(split.share_limit, used)
        current = inst.split(used)
        if inst.shares and sum(inst.shares) != total:  # the request moved: the split so far, at the new total
            current = resize_split(inst.shares, total, unit=g, minimum=minimum, limit=limit) or current
        shares = plan_worker_split(
            total,
            [seconds[w] for w in inst.workers],
            current,
            hysteresis=split.hysteresis,
            unit=g,
            minimum=minimum,
            limit=limit,
        )
        planned.append(replace(inst, shares=() if len(set(shares)) == 1 else shares))
    return planned


def _measured_costs(profile: ThroughputProfile, members: list[WorkerReport], smoothing: float) -> ThroughputProfile:
    """The instance's step-cost averages with this round's timings. The outer step's seconds are the fastest
    process's: the others' include the wait for the last one to arrive at the all-reduce."""
    outer = [m.outer_seconds for m in members if math.isfinite(m.outer_seconds)]
    return profile.update([m.timing for m in members], min(outer) if outer else math.nan, smoothing)


def _costs(
    inst: Instance, members: list[WorkerReport], rules: RoundRules, startup: StartupProfile | None
) -> tuple[ThroughputProfile, StepTimeModel | None]:
    """The instance's cost averages after this round, and the step and round costs its next request is chosen from:
    the startup profile's for its number of workers (`goodput_timing="startup"`: nothing measured on the rounds
    enters a decision, so a run is repeatable from its seed), else the averages of the rounds' timings."""
    controller = rules.controller
    if controller.goodput_timing == "startup" and startup is not None:
        return inst.throughput, startup.step_model(len(inst.workers))
    throughput = _measured_costs(inst.throughput, members, controller.smoothing)
    return throughput, throughput.model()


def goodput_choice(
    inst: Instance, scale: float, times: StepTimeModel | None, rules: RoundRules, *, inner_steps: int
) -> GoodputChoice | None:
    """`batch_size_target="goodput"`: the next request of `inst` (`batch/goodput.py`) for the noise scale `scale`
    and the step and round costs `times`, or None (keep it) while there is no positive noise scale or no timing."""
    if times is None or not (math.isfinite(scale) and scale > 0) or inner_steps < 1:
        return None
    g, controller = rules.processes_per_worker, rules.controller
    model = GoodputModel(
        times=times,
        noise_scale=scale,
        inner_steps=inner_steps,
        workers=len(inst.workers),
        processes=g,
        switch=rules.switch,
        reference=g * rules.reference_batch_size,
    )
    low = g * math.ceil(controller.floor / g)
    high = max(low, g * (controller.cap // g)) if controller.cap is not None else low
    if controller.derived_cap:  # no batch_size_cap: past its own bound no request can win (`request_bound`)
        bound = model.request_bound(low, current=inst.batch_size)  # >= low and >= the current request
        high = bound if controller.cap is None else max(low, min(high, bound))
    choice = choose_request(
        model, current=inst.batch_size, low=low, high=high, hysteresis=controller.goodput_hysteresis
    )
    return choice if math.isfinite(choice.goodput) and math.isfinite(choice.kept) else None


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
