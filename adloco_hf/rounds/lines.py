"""An instance's line of a round in `adloco_rounds.jsonl` (`RoundLine`, `rows.py`), as a value made in two steps
(pure): `round_line` builds it from the reports and the round's decision (`decision.py`), `finish_lines` completes it
with what only the worker knows once the decided merge has run (its bytes and seconds, the run's totals). No line is
changed in place.
"""

import math
from dataclasses import dataclass, replace

from ..batch.goodput import GoodputChoice
from ..batch.size_tests import PooledStatistics
from ..batch.throughput import StepTimeModel
from ..instances.merges import MergeResult
from ..instances.table import Instance, MergePlan
from ..outer.step import ring_all_reduce_bytes
from .plan import RoundPlan, plan_instance, process_plan
from .rows import RoundLine, WorkerReport
from .rules import RoundRules


__all__ = ["InstanceOutcome", "finish_lines", "outer_noise", "round_line", "worker_sample_seconds"]


@dataclass(frozen=True)
class InstanceOutcome:
    """One instance's round as the reports tell it, before the merge: its members' reports, their pooled
    statistics, the instance after the round and what the rule chose."""

    members: list[WorkerReport]
    pooled: PooledStatistics
    after: Instance
    noise_scale: float
    times: StepTimeModel | None
    choice: GoodputChoice | None


def round_line(
    inst: Instance,
    outcome: InstanceOutcome,
    *,
    next_batch: int,
    merge: MergePlan | None,
    outer_step: int,
    global_step: int,
    rules: RoundRules,
) -> RoundLine:
    """`inst`'s line of the round, with everything the reports and the decision tell (`finish_lines` adds the
    rest): `next_batch` is the request the next round runs (after the merge, if one was due)."""
    g = rules.processes_per_worker
    members, pooled, choice = outcome.members, outcome.pooled, outcome.choice
    ran = plan_instance(inst, rules)  # what every worker of the instance ran this round
    requested = process_plan(inst.batch_size // g, rules)  # the request as switch mode ran it (shares aside)
    steps = sum(m.loss_steps for m in members)
    # Local rank l of every worker all-reduces slice l: the ring bytes of the first worker's G processes' payloads.
    first = members[:g]
    seconds = worker_sample_seconds(members, g)
    asked = outcome.after.batch_size
    goodput = rules.controller.target == "goodput"
    pseudo_grad_norm = members[0].pseudo_grad_norm
    return RoundLine(
        outer_step=outer_step,
        global_step=global_step,
        instance=inst.id,
        workers=list(inst.workers),
        batch_size=inst.batch_size,
        # The next round runs the requests the merge left (`merge_batch_rule`, over the redistributed workers), not
        # the ones the instances asked for: the lines say both, named apart.
        next_batch_size=next_batch,
        asked_batch_size=asked if asked != next_batch else None,
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
        pseudo_grad_norm=pseudo_grad_norm,
        comm_bytes=sum(ring_all_reduce_bytes(m.payload_bytes, len(inst.workers)) for m in first),
        comm_seconds=max(m.comm_seconds for m in members),
        outer_seconds=max(m.outer_seconds for m in members),
        merged_from=[merge.merged] if merge is not None and merge.survivor == inst.id else [],
        merged_into=merge.survivor if merge is not None and merge.merged == inst.id else None,
        skipped=any(m.skipped for m in members),
        skipped_in_a_row=outcome.after.skipped_in_a_row,
        noise_scale=outcome.noise_scale if math.isfinite(outcome.noise_scale) else None,
        # One ‖Δ_w‖² per worker (its G processes hold the same Δ).
        outer_noise=outer_noise([m.local_sq_norm for m in members[::g]], pseudo_grad_norm),
        goodput=choice.goodput if goodput and choice is not None else None,
        goodput_kept=choice.kept if goodput and choice is not None else None,
        step_model=outcome.times.as_list() if goodput and outcome.times is not None else None,
        processes_per_worker=g,
        processes=[w * g + local for w in inst.workers for local in range(g)] if g > 1 else None,
        process_payload_bytes=[m.payload_bytes for m in first] if g > 1 else None,
        worker_batch_sizes=[ran[w].share for w in inst.workers],
        worker_sample_seconds=[s if math.isfinite(s) else None for s in seconds],
    )


def finish_lines(
    lines: dict[int, RoundLine],
    plan: RoundPlan,
    merge: MergeResult | None,
    *,
    inner_steps: int,
    tokens: int,
    elapsed_seconds: float,
) -> list[RoundLine]:
    """The round's lines in instance order, finished with what only the worker knows after the merge: the merge's
    bytes and seconds (on the survivor's line, its bytes in its traffic too), the inner steps the round ran, the
    run's tokens so far (this round's included), its seconds and the number of instances in the next round `plan`.
    The one place a line is completed; `round_line` builds it."""
    out = []
    for instance in sorted(lines):
        line = lines[instance]
        survivor = merge is not None and merge.plan.survivor == instance
        out.append(
            replace(
                line,
                comm_bytes=line.comm_bytes + (merge.bytes if survivor else 0),
                merge_bytes=merge.bytes if survivor else line.merge_bytes,
                merge_seconds=merge.seconds if survivor else line.merge_seconds,
                inner_steps=inner_steps,
                num_instances=len(plan.instances),
                total_tokens=tokens,
                elapsed_seconds=elapsed_seconds,
            )
        )
    return out


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
