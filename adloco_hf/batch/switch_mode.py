"""Switch mode: when a requested batch no longer fits, decide between capping it and accumulating gradients.

AdLoCo (arXiv 2508.18182, §4.2) turns gradient accumulation on only once the requested batch exceeds the hardware
limit by a factor γ (`switch_threshold`): just above the limit, accumulating would halve the number of updates for a
small gain in batch size, so the request is capped instead.
"""

import enum
import math
from dataclasses import dataclass


__all__ = ["BatchPlan", "Statistics", "StepPlan", "SwitchMode", "plan_batch", "plan_step", "split_sizes"]


@dataclass(frozen=True)
class BatchPlan:
    """How one inner step of a worker is executed.

    Attributes:
        batch_size: samples the step really uses (what the sampler draws).
        micro_batch_size: the largest chunk that goes through forward/backward at once.
        accumulation_steps: number of chunks the batch is split into (1 means no accumulation).
    """

    batch_size: int
    micro_batch_size: int
    accumulation_steps: int

    @property
    def accumulates(self) -> bool:
        return self.accumulation_steps > 1


def plan_batch(requested: int, max_batch_size: int, switch_threshold: float = 2.0) -> BatchPlan:
    """Plan one inner step for a requested per-worker batch size (DESIGN §3.3).

    | requested b (m = max_batch_size, γ = switch_threshold) | plan |
    |---|---|
    | b ≤ m        | batch b, micro b, 1 step |
    | m < b ≤ γ·m  | batch m, micro m, 1 step (the request is capped) |
    | b > γ·m      | A = ⌈b/m⌉ steps; batch b split into A chunks whose sizes differ by at most 1 |

    Args:
        requested: samples per worker per inner step asked for by the batch-size test.
        max_batch_size: the largest micro-batch that fits on the device.
        switch_threshold: γ ≥ 1; accumulation starts once the request exceeds γ·max_batch_size.

    Returns:
        The [`BatchPlan`] for the step.

    Example:
    ```python
    >>> plan_batch(10, 8)
    BatchPlan(batch_size=8, micro_batch_size=8, accumulation_steps=1)
    >>> plan_batch(17, 8)
    BatchPlan(batch_size=17, micro_batch_size=6, accumulation_steps=3)
    ```
    """
    if requested < 1:
        raise ValueError(f"requested batch size must be >= 1, got {requested}")
    if max_batch_size < 1:
        raise ValueError(f"max_batch_size must be >= 1, got {max_batch_size}")
    if switch_threshold < 1:
        raise ValueError(f"switch_threshold must be >= 1, got {switch_threshold}")
    if requested <= max_batch_size:
        return BatchPlan(requested, requested, 1)
    if requested <= switch_threshold * max_batch_size:
        return BatchPlan(max_batch_size, max_batch_size, 1)
    steps = math.ceil(requested / max_batch_size)
    return BatchPlan(requested, math.ceil(requested / steps), steps)


@dataclass(frozen=True)
class SwitchMode:
    """Switch mode on one device: its largest micro-batch and γ. The package plans every batch through `plan`
    (`rounds/plan.py`), and the goodput rule reads the ranges of requests that run in the same number of passes
    (`pass_ranges`) instead of modelling the rule again.

    Example:
    ```python
    >>> SwitchMode(8, 2.0).plan(17)
    BatchPlan(batch_size=17, micro_batch_size=6, accumulation_steps=3)
    >>> SwitchMode(8, 2.0).pass_ranges(1, 30)
    [(1, 8, 1), (17, 24, 3), (25, 30, 4)]
    ```
    """

    max_batch_size: int
    switch_threshold: float = 2.0

    def plan(self, requested: int) -> BatchPlan:
        """[`plan_batch`] of `requested` samples on this device."""
        return plan_batch(requested, self.max_batch_size, self.switch_threshold)

    def pass_ranges(self, low: int, high: int) -> list[tuple[int, int, int]]:
        """The requests in [low, high] whose plan uses every requested sample, grouped by their number of passes:
        (lowest, highest, passes), ascending. The band (m, γ m] runs as m and is left out: none of it uses more
        samples than m, a request of the first range (or `low`, where it falls in the band: callers keep it)."""
        m = self.max_batch_size
        ranges = [(max(1, low), min(m, high), 1)] if max(1, low) <= min(m, high) else []
        first = math.floor(self.switch_threshold * m) + 1  # the smallest request that accumulates
        for passes in range(max(2, math.ceil(first / m)), math.ceil(high / m) + 1):
            lo, hi = max((passes - 1) * m + 1, first, low), min(passes * m, high)
            if lo <= hi:
                ranges.append((lo, hi, passes))
        return ranges


def split_sizes(total: int, parts: int) -> list[int]:
    """Split `total` samples into `parts` chunks whose sizes differ by at most one, larger chunks first."""
    if parts < 1 or parts > total:
        raise ValueError(f"cannot split {total} samples into {parts} non-empty chunks")
    base, extra = divmod(total, parts)
    return [base + 1] * extra + [base] * (parts - extra)


class Statistics(enum.Enum):
    """Where one inner step's gradient statistics come from (DESIGN §3.2)."""

    NONE = "none"  # this step measures nothing
    SPLIT = "split"  # the step's chunks (micro-batches, or two halves of its batch) are the groups
    PREVIOUS = "previous"  # a one-sample batch: the previous step's gradient is the second group


@dataclass(frozen=True)
class StepPlan:
    """How the Trainer runs one inner step of a worker.

    Attributes:
        chunk_sizes: samples of each forward/backward inside the step (one entry: the whole batch at once).
        statistics: where the step's gradient statistics come from.
        remember_gradient: keep this step's gradient as the next step's second group (one-sample batches).
    """

    chunk_sizes: tuple[int, ...]
    statistics: Statistics = Statistics.NONE
    remember_gradient: bool = False

    @property
    def accumulates(self) -> bool:
        return len(self.chunk_sizes) > 1


def plan_step(
    batch: int,
    plan: BatchPlan,
    *,
    measure: bool,
    last_of_round: bool,
    next_last_of_round: bool,
    has_previous: bool,
) -> StepPlan:
    """Plan one inner step of `batch` samples under switch mode's `plan`.

    Statistics are measured on the last step of each round (`last_of_round`) when `measure` is on: from the step's
    chunks when it accumulates, else from two halves of its batch; a one-sample batch has no second group, so the
    step before the last keeps its gradient (`remember_gradient`) and the last pairs with it.
    """
    one_sample = plan.batch_size == 1 and not plan.accumulates
    statistics, remember = Statistics.NONE, False
    if measure and last_of_round:
        if not one_sample:
            statistics = Statistics.SPLIT
        else:
            statistics = Statistics.PREVIOUS if has_previous else Statistics.NONE
            remember = next_last_of_round
    elif measure:
        remember = one_sample and next_last_of_round
    if statistics is Statistics.SPLIT and batch < 2:
        statistics = Statistics.NONE
    parts = plan.accumulation_steps if plan.accumulates else (2 if statistics is Statistics.SPLIT else 1)
    return StepPlan(tuple(split_sizes(batch, min(parts, batch))), statistics, remember)
