"""The data of a round's members (live recovery, issue 52; pure): where each worker of the round continues.

Every worker's sampler state at the end of the last committed round is known to every member (each round's
reports carry it, and a round counts only when all members commit it). A round whose members are those of the
last committed round continues from those states. When the members change (a worker left, one joined, or a round
was dropped after a member died inside it), what no worker had drawn by the last committed round of every pass in
progress is re-split over the new members exactly as an elastic resume does (`AdaptiveBatchSampler.
reshard_sampler_states`, `sampling/reshard.py`): the new members' ranks are their places in ascending worker order.

So within every pass no sample enters two committed rounds, and none is skipped: what a dead worker drew in the round
it died in, and what the survivors drew in a round they dropped, was never committed, and is drawn again.
"""

from collections.abc import Mapping, Sequence
from typing import Any

from .sampler import AdaptiveBatchSampler


__all__ = ["states_for_members"]


def states_for_members(committed: Mapping[int, dict[str, Any]], members: Sequence[int]) -> dict[int, dict[str, Any]]:
    """worker id → the sampler state each of `members` continues from, given every worker's state at the end of the
    last committed round (`committed`: worker id → `AdaptiveBatchSampler.state_dict()`, the workers of that round)."""
    old, new = sorted(committed), sorted(set(members))
    if not new:
        raise ValueError("a round has at least one member")
    if old == new:
        return {worker: dict(committed[worker]) for worker in new}
    resharded = AdaptiveBatchSampler.reshard_sampler_states([committed[worker] for worker in old], len(new))
    return dict(zip(new, resharded, strict=True))
