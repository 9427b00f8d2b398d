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
from ..batch.size_tests import pool_statistics
from ..batch.startup_profile import StartupProfile
from ..batch.throughput import StepTimeModel, ThroughputProfile
from ..batch.worker_split import plan_worker_split, resize_split
from ..instances.health import merge_warnings, skipped_rounds_failure
from ..instances.table import Instance, MergePlan, merge_is_due, plan_merge
from .lines import InstanceOutcome, finish_lines, outer_noise, round_line, worker_sample_seconds
from .plan import RoundPlan, WorkerPlan, plan_round, process_plan
from .rows import RoundLine, WorkerReport
from .rules import RoundRules


__all__ = [
    "RoundDecision",
    "decide_round",
    "finish_lines",
    "goodput_choice",
    "next_round_inner_steps",
    "outer_noise",
    "plan_shares",
    "used_per_worker",
    "worker_sample_seconds",
]


@dataclass(frozen=True)
class RoundDecision:
    """What every rank decided from the same reports: the round's lines (as far as the reports tell them; the worker
    finishes them with `finish_lines` once the merge is carried out) and the next round's [`RoundPlan`]."""

    lines: dict[int, RoundLine]
    plan: RoundPlan
    warnings: list[str] = field(
        default_factory=list
    )  # merges of instances that made no progress (`instances/health.py`)
    failure: str | None = None  # why the run stops: an instance skipped more than max_skipped_rounds in a row

    @property
    def instances(self) -> list[Instance]:
        """The table after the round: the next round's."""
        return list(self.plan.instances)

    @property
    def merge(self) -> MergePlan | None:
        return self.plan.merge

    @property
    def plans(self) -> dict[int, WorkerPlan]:
        """Every worker's plan for the next round."""
        return dict(self.plan.workers)

    @property
    def next_inner_steps(self) -> int | None:
        return self.plan.inner_steps


def _outcome(
    inst: Instance, members: list[WorkerReport], rules: RoundRules, startup: StartupProfile | None, inner_steps: int
) -> InstanceOutcome:
    """`inst` after its round: the next request its rule asks for (kept in a skipped round), and its averages."""
    controller, g = rules.controller, rules.processes_per_worker
    goodput = controller.target == "goodput"
    pooled = pool_statistics([m.stats for m in members])
    next_batch, estimate, choice = inst.batch_size, inst.noise, None
    throughput, times = _costs(inst, members, rules, startup) if goodput else (None, None)
    skipped = any(m.skipped for m in members)
    if not skipped:
        estimate = inst.noise.update(pooled, controller.smoothing)
        if goodput:
            choice = goodput_choice(inst, estimate.noise_scale, times, rules, inner_steps=inner_steps)
            next_batch = inst.batch_size if choice is None else choice.request
        else:
            next_batch = next_request(
                controller, pooled, estimate, current=inst.batch_size, num_workers=len(inst.workers)
            )
        next_batch = g * math.ceil(next_batch / g)  # each of the worker's processes draws 1/G of it
    after = inst.after_round(next_batch, skipped=skipped, noise=estimate, throughput=throughput)
    return InstanceOutcome(members, pooled, after, estimate.noise_scale, times, choice)


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
    """Every instance's next request and round line, the merge if one is due, and the next round's plan (pure; the
    same on every rank): with `first_plan`, the only maker of a [`RoundPlan`].

    Args:
        instances: the table during the round that just ended.
        reports: one per global rank, in rank order (G per worker: worker w's are ranks w·G … w·G + G − 1, and their
            statistics pool with the other processes', G groups per worker).
        outer_step: the 1-based number of the round that just ended.
        global_step: the Trainer's step at its end.
        rules: the settings the decision depends on.
        inner_steps: the round's inner steps H (for its lines and the next round's H; None: not tracked).
        startup: the run's startup profile (`batch/startup_profile.py`): with `goodput_timing="startup"` the goodput
            rule's step and round costs, for the whole run; None: the rule reads the costs measured on the rounds.

    A skipped round (a non-finite pseudo-gradient on any worker of the instance) keeps the instance's request and
    counts towards its rounds skipped in a row; more than `rules.max_skipped_rounds` of them is the decision's
    `failure`. A merge, when due, is planned on the table with the new requests; `merged_from` is set on the
    survivor's line, and a merged instance that made no progress gets a warning (`instances/health.py`).
    """
    g = rules.processes_per_worker
    outcomes = {}
    for inst in instances:
        members = [reports[w * g + local] for w in inst.workers for local in range(g)]
        steps = inner_steps or max(m.loss_steps for m in members)
        outcomes[inst.id] = _outcome(inst, members, rules, startup, steps)
    decided = [outcomes[inst.id].after for inst in instances]
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
            used = {inst.id: used_per_worker(inst.batch_size, rules) for inst in instances}
            planning = [replace(d, demand=float(used[d.id] * len(d.workers))) for d in decided]
        merge = plan_merge(
            planning,
            policy=rules.merge_policy,
            num_workers=len(reports) // g,
            batch_rule=rules.merge_batch_rule,
            processes_per_worker=g,
            cap=rules.controller.cap,
        )
        warnings = merge_warnings(merge, outer_step=outer_step)
        decided = list(merge.after)
    next_batch = {inst.id: inst.batch_size for inst in decided}
    lines = {
        inst.id: round_line(
            inst,
            outcomes[inst.id],
            next_batch=next_batch.get(inst.id, outcomes[inst.id].after.batch_size),
            merge=merge,
            outer_step=outer_step,
            global_step=global_step,
            rules=rules,
        )
        for inst in instances
    }
    if rules.split.rule == "speed":
        decided = plan_shares(decided, reports, rules)
    plan = RoundPlan(
        instances=tuple(decided),
        workers=plan_round(decided, rules),
        inner_steps=None if inner_steps is None else next_round_inner_steps(list(lines.values()), inner_steps, rules),
        merge=merge,
    )
    return RoundDecision(lines=lines, plan=plan, warnings=warnings, failure=failure)


def used_per_worker(batch_size: int, rules: RoundRules) -> int:
    """The samples a worker of an instance requesting `batch_size` per worker trains per inner step, as switch mode
    runs it (capped at `max_batch_size` per process between it and `switch_threshold` × it)."""
    return rules.processes_per_worker * process_plan(batch_size // rules.processes_per_worker, rules).batch_size


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
    if not controller.shrink:  # requests only grow unless `batch_size_shrink` (docs/algorithm.md#goodput)
        capped = inst.batch_size if controller.cap is None else min(inst.batch_size, controller.cap)
        low = max(low, g * (capped // g))
    high = max(low, g * (controller.cap // g)) if controller.cap is not None else low
    if controller.derived_cap:  # no batch_size_cap: past its own bound no request can win (`request_bound`)
        bound = model.request_bound(low, current=inst.batch_size)  # >= low and >= the current request
        high = bound if controller.cap is None else max(low, min(high, bound))
    choice = choose_request(
        model, current=inst.batch_size, low=low, high=high, hysteresis=controller.goodput_hysteresis
    )
    return choice if math.isfinite(choice.goodput) and math.isfinite(choice.kept) else None


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
