"""Degraded instances: rounds skipped in a row, instances that made no progress, and when the run stops (pure).

A round is skipped for an instance when its averaged pseudo-gradient is not finite (`outer/step.py`): its global weights
stay as they were and training goes on, which is right for a passing NaN. A worker that turns NaN or inf every round
(a broken device, a bad data shard, a learning rate that diverges) would instead keep its instance from training for
the rest of the run, silently; and once a merge seats that worker in another instance, that instance's rounds are
skipped too, since one worker's non-finite pseudo-gradient makes its instance's average non-finite. `decide_round`
(the same on every rank) calls these functions to make it loud:

- an instance that skips more than `max_skipped_rounds` rounds in a row stops the run with [`SkippedRoundsError`],
  naming the instance, its workers, those whose training loss was not finite, and what to do;
- a merge, or the final merge, of an instance that made no progress (every round since the start, or since its last
  merge, skipped) is logged at WARNING with the weight it enters with: 0 when it never trained (its weights are the
  ones it started from), its demand's otherwise (`instances/table.py`).
"""

import math

from .table import Instance, MergePlan, final_merge_weights


__all__ = ["SkippedRoundsError", "final_merge_warnings", "merge_warnings", "skipped_rounds_failure"]

_FIX = (
    "Find what makes those workers' values non-finite (their data shard, their device, a learning rate that "
    "diverges, fp16 overflow), then resume from a checkpoint; or raise max_skipped_rounds (None never stops) to "
    "train on regardless."
)


class SkippedRoundsError(RuntimeError):
    """An instance skipped more than `max_skipped_rounds` rounds in a row; the message names it and what to do."""


def _who(inst: Instance) -> str:
    return f"instance {inst.id} (worker rank(s) {list(inst.workers)})"


def _no_progress(inst: Instance) -> str:
    if not inst.trained:
        return f"all its {inst.rounds_since_merge} round(s) since the start were skipped (non-finite pseudo-gradient)"
    return f"all its {inst.rounds_since_merge} round(s) since its last merge were skipped (non-finite pseudo-gradient)"


def _weight_reason(inst: Instance, weight: float, other: str) -> str:
    if not inst.trained and weight == 0:
        return (
            f"with weight 0, not its demand's: its weights are the ones it started from, and averaging them in would "
            f"only pull {other} back towards them"
        )
    if not inst.trained:
        return f"by demand (weight {weight:.2f}), since nothing in the merge has trained"
    return (
        f"with its demand's weight {weight:.2f}: its weights are its last merge's, which hold the training before it"
    )


def merge_warnings(plan: MergePlan, *, outer_step: int) -> list[str]:
    """A warning for each instance of a merge that made no progress, with the weight it enters with and why."""
    rows = {inst.id: inst for inst in plan.before}
    sides = ((plan.survivor, plan.weights[0], plan.merged), (plan.merged, plan.weights[1], plan.survivor))
    return [
        f"round {outer_step}: {_who(rows[own])} made no progress: {_no_progress(rows[own])}. It is merged "
        f"{_weight_reason(rows[own], weight, f'instance {other}')}."
        for own, weight, other in sides
        if rows[own].made_no_progress
    ]


def final_merge_warnings(instances: list[Instance]) -> list[str]:
    """A warning for each instance of the final merge that made no progress, with its weight and why."""
    weights = final_merge_weights(instances)
    return [
        f"final merge: {_who(inst)} made no progress: {_no_progress(inst)}. It is merged "
        f"{_weight_reason(inst, weights[inst.id], 'the merged model')}."
        for inst in sorted(instances, key=lambda x: x.id)
        if inst.made_no_progress
    ]


def skipped_rounds_failure(
    table: list[Instance],
    losses: dict[int, float],
    *,
    outer_step: int,
    global_step: int,
    max_skipped_rounds: int | None,
) -> str | None:
    """Why the run must stop, if an instance of `table` (after this round) skipped more than `max_skipped_rounds`
    rounds in a row; else None. `losses` maps every worker's rank to its training loss in this round."""
    if max_skipped_rounds is None:
        return None
    parts = []
    for inst in sorted(table, key=lambda x: x.id):
        if inst.skipped_in_a_row <= max_skipped_rounds:
            continue
        first = outer_step - inst.skipped_in_a_row + 1
        since = "the start" if first == 1 else f"round {first - 1}"
        part = (
            f"{_who(inst)} skipped rounds {first}-{outer_step} ({inst.skipped_in_a_row} in a row, more than "
            f"max_skipped_rounds={max_skipped_rounds}): its pseudo-gradient was NaN or inf each time, so its weights "
            f"have not moved since {since}"
        )
        broken = [rank for rank in inst.workers if not math.isfinite(losses[rank])]
        if broken:
            part += f"; the training loss was not finite on worker rank(s) {broken}"
        parts.append(part)
    if not parts:
        return None
    return f"AdLoCo, round {outer_step} (step {global_step}): " + "; ".join(parts) + f". {_FIX}"
