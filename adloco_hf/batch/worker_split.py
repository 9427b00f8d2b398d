"""Workers of different speeds: an instance's batch per inner step split among its workers by their speed (pure).

Every worker of an instance runs the same H inner steps per round, and the round ends when the slowest has
finished them. With equal batches a worker at a quarter of the others' speed makes every round four times longer;
with `worker_batch_split="speed"` each worker's share of the instance's total batch follows its measured speed, so
that all of them finish together. The instance's total per inner step stays what its controller asks for (the
request × its workers, as switch mode runs it), so the samples per round, and the tokens, do not change.

The split of a total of B samples (in units of u = `processes_per_worker`: every process draws 1/G of its worker's
share) over workers taking s_w seconds per sample is the one that ends the round soonest: it minimises the slowest
worker's time max_w x_w s_w over integer shares x_w with Σ x_w = B, each at least `minimum` and at most `limit`.
Giving each next unit to the worker that would finish it soonest is optimal for that (`split_by_speed`: the greedy
takes the cheapest of all the units' finishing times, which no other split can beat; `tests/batch/test_worker_split.py`
checks it against every split of small totals). The continuous solution is x_w ∝ 1 / s_w: in proportion to speed.

Measured seconds move from round to round (other jobs, caches, a thermal limit): `plan_worker_split` keeps the
current split unless the new one would end the round sooner by more than `hysteresis` (the share of the current
round's predicted time), so noise does not reshuffle the batches (AdaptDL's users ask the same of a batch change:
adaptdl#27). When the instance's total changes (its request grew), the split kept is the current one resized to the
new total (`resize_split`), so a growing request does not reshuffle the batches either. A worker's seconds per sample are measured at its current share, with the fixed costs of a step
spread over it, so the next plan corrects the previous one until the workers' times agree.
"""

import heapq
import math
from collections.abc import Sequence


__all__ = ["equal_split", "plan_worker_split", "resize_split", "round_seconds", "split_by_speed"]


def equal_split(total: int, num_workers: int) -> tuple[int, ...]:
    """`total` over `num_workers` workers as evenly as possible, larger shares first (an instance's equal split)."""
    base, extra = divmod(total, num_workers)
    return tuple([base + 1] * extra + [base] * (num_workers - extra))


def resize_split(
    split: Sequence[int], total: int, *, unit: int = 1, minimum: int = 1, limit: int | None = None
) -> tuple[int, ...] | None:
    """`split` scaled to another `total` (the request grew or shrank), each share in proportion, in whole `unit`s
    (largest remainders first, ties to the lower index): the split the workers' speeds asked for, at the new size.
    None when a share would fall outside [`minimum`, `limit`] (then there is no such split to keep)."""
    units, old = total // unit, sum(split)
    exact = [x * total / old / unit for x in split]
    resized = [math.floor(e) for e in exact]
    order = sorted(range(len(split)), key=lambda w: (-(exact[w] - resized[w]), w))
    for w in order[: units - sum(resized)]:
        resized[w] += 1
    if any(x * unit < minimum or (limit is not None and x * unit > limit) for x in resized):
        return None
    return tuple(x * unit for x in resized)


def round_seconds(split: Sequence[int], seconds_per_sample: Sequence[float]) -> float:
    """The predicted time of a round's inner step: the slowest worker's x_w s_w."""
    return max(x * s for x, s in zip(split, seconds_per_sample))


def split_by_speed(
    total: int,
    seconds_per_sample: Sequence[float],
    *,
    unit: int = 1,
    minimum: int = 1,
    limit: int | None = None,
) -> tuple[int, ...]:
    """The integer split of `total` samples that minimises the slowest worker's time max_w x_w s_w.

    Args:
        total: samples per inner step of the whole instance (a multiple of `unit`).
        seconds_per_sample: s_w of each worker (finite, > 0).
        unit: every share is a multiple of it (G = processes_per_worker).
        minimum: the smallest share (a multiple of `unit`).
        limit: the largest share (None: no bound), e.g. a worker's data shard.

    Returns:
        The shares, in the workers' order. Ties go to the lower worker index, so every rank computes the same split.

    Example:
    ```python
    >>> split_by_speed(16, [1.0, 1.0, 1.0, 4.0])
    (5, 5, 5, 1)
    ```
    """
    m = len(seconds_per_sample)
    if m < 1:
        raise ValueError("split_by_speed needs at least one worker")
    if unit < 1 or total % unit or minimum % unit or minimum < unit:
        raise ValueError(f"total={total} and minimum={minimum} must be multiples of unit={unit} >= 1, minimum >= unit")
    if not all(math.isfinite(s) and s > 0 for s in seconds_per_sample):
        raise ValueError(f"seconds per sample must be finite and > 0, got {list(seconds_per_sample)}")
    units, low = total // unit, minimum // unit
    high = units if limit is None else limit // unit
    if units < m * low or units > m * high or high < low:
        raise ValueError(
            f"{total} samples cannot be split over {m} workers with shares in [{minimum}, {limit}] (unit {unit})"
        )
    shares = [low] * m
    # Each unit goes to the worker that would finish it soonest: its time with one more unit of samples.
    heap = [((low + 1) * unit * s, w) for w, s in enumerate(seconds_per_sample) if low < high]
    heapq.heapify(heap)
    for _ in range(units - m * low):
        _, w = heapq.heappop(heap)
        shares[w] += 1
        if shares[w] < high:
            heapq.heappush(heap, ((shares[w] + 1) * unit * seconds_per_sample[w], w))
    return tuple(x * unit for x in shares)


def plan_worker_split(
    total: int,
    seconds_per_sample: Sequence[float],
    current: Sequence[int] | None,
    *,
    hysteresis: float,
    unit: int = 1,
    minimum: int = 1,
    limit: int | None = None,
) -> tuple[int, ...]:
    """The next round's shares of an instance's `total`, from the workers' measured seconds per sample.

    `current` is the split the instance runs now (None when it no longer applies: another total, other workers);
    it is kept when some worker has no measurement (a round without steps) or when the best split would not end
    the round sooner by more than `hysteresis` × its predicted time. Without a current split and without
    measurements the split is equal.
    """
    m = len(seconds_per_sample)
    valid = current is not None and len(current) == m and sum(current) == total
    measured = all(math.isfinite(s) and s > 0 for s in seconds_per_sample)
    if not measured:
        return tuple(current) if valid else _equal_in_units(total, m, unit)
    best = split_by_speed(total, seconds_per_sample, unit=unit, minimum=minimum, limit=limit)
    if valid and round_seconds(best, seconds_per_sample) >= (1 - hysteresis) * round_seconds(
        current, seconds_per_sample
    ):
        return tuple(current)
    return best


def _equal_in_units(total: int, num_workers: int, unit: int) -> tuple[int, ...]:
    return tuple(unit * x for x in equal_split(total // unit, num_workers))
