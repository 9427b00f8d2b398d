"""Switch mode: when a requested batch no longer fits, decide between capping it and accumulating gradients.

AdLoCo (arXiv 2508.18182, §4.2) turns gradient accumulation on only once the requested batch exceeds the hardware
limit by a factor γ (`switch_threshold`): just above the limit, accumulating would halve the number of updates for a
small gain in batch size, so the request is capped instead.
"""

import math
from dataclasses import dataclass


__all__ = ["BatchPlan", "plan_batch", "split_sizes"]


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


def split_sizes(total: int, parts: int) -> list[int]:
    """Split `total` samples into `parts` chunks whose sizes differ by at most one, larger chunks first."""
    if parts < 1 or parts > total:
        raise ValueError(f"cannot split {total} samples into {parts} non-empty chunks")
    base, extra = divmod(total, parts)
    return [base + 1] * extra + [base] * (parts - extra)
