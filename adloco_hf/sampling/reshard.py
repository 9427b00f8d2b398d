"""The data of a pass re-split over another number of workers (an elastic resume; pure, no I/O).

Workers of different instances draw batches of different sizes, so when a checkpoint is written they can stand in
different passes over the data. What no old worker has drawn yet of every pass that has been started (its
*remainder*) is dealt to the new workers, pass by pass in ascending order, round-robin as one sequence: the k-th
item of all the passes' remainders goes to new worker k mod `W'`, so the parts differ by at most one item, within
every pass and in all. This *bridge* is drawn first; every new worker then starts
the next pass with the regular layout for `W'` workers. So within every pass each item is drawn exactly once by the
old and new workers together, and no pass is cut short.

The items are what a sampler draws (dataset indices for `AdaptiveBatchSampler`); the caller lists each pass's
remainder in a canonical order, the same whatever the old layout was, so the bridge is too.

Example:
```python
>>> bridge({0: [5, 1, 4], 1: [2, 0, 3, 6]}, 2)
[[(0, [5, 4]), (1, [0, 6])], [(0, [1]), (1, [2, 3])]]
```
"""

from collections.abc import Sequence
from typing import TypeVar


__all__ = ["bridge", "check_old_states", "check_world_size"]

Item = TypeVar("Item")


def check_world_size(world_size: int, num_items: int | None = None) -> None:
    """Refuse a number of workers below 1, or above `num_items` (every worker needs data)."""
    if int(world_size) != world_size or world_size < 1:
        raise ValueError(f"world_size must be a positive integer, got {world_size}")
    if num_items is not None and num_items < world_size:
        raise ValueError(
            f"the dataset has {num_items} samples, fewer than the {world_size} workers that would share it; "
            "resume with fewer workers or use a larger train_dataset"
        )


def check_old_states(
    states: Sequence[dict], what: str, *, same: Sequence[str] = (), indexed: Sequence[str] = ()
) -> None:
    """Refuse states that are not every old worker's of one checkpoint, in rank order: each must agree with rank
    0's on the keys `same`, hold its own position in the list under the keys `indexed` (its rank) and, where it has
    one, the number of states under `"world_size"`/`"num_workers"`."""
    if not states:
        raise ValueError(f"re-splitting needs the {what} state of every old worker, got none")
    for rank, state in enumerate(states):
        expected = {key: states[0].get(key) for key in same} | {key: rank for key in indexed}
        expected |= {key: len(states) for key in ("world_size", "num_workers") if key in state}
        for key, value in expected.items():
            if state.get(key) != value:
                raise ValueError(
                    f"the {what} state of old rank {rank} has {key}={state.get(key)!r}, expected {value!r}: pass the "
                    "states of every worker of one checkpoint, in rank order"
                )


def bridge(remainders: dict[int, Sequence[Item]], world_size: int) -> list[list[tuple[int, list[Item]]]]:
    """Deal each pass's remainder over `world_size` new workers.

    Args:
        remainders: pass → the items of that pass no worker has drawn yet, in canonical order.
        world_size: the new number of workers.

    Returns:
        For every new worker, its bridge: `(pass, items)` in ascending pass order, empty parts left out.
    """
    check_world_size(world_size)
    parts: list[list[tuple[int, list[Item]]]] = [[] for _ in range(world_size)]
    dealt = 0
    for epoch in sorted(remainders):
        items = list(remainders[epoch])
        for rank in range(world_size):
            share = items[(rank - dealt) % world_size :: world_size]
            if share:
                parts[rank].append((epoch, share))
        dealt += len(items)
    return parts
