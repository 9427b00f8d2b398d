"""How a merge travels, planned the same on every rank (pure): the point-to-point messages of
`merge_transport="point_to_point"` ([`plan_transfers`]) and the collectives of `"all_reduce"` ([`plan_collectives`]).
`instances/merges.py` carries them out.
"""

from dataclasses import dataclass

from .table import MergePlan


__all__ = ["Broadcast", "MergeCollectives", "Transfer", "plan_collectives", "plan_transfers"]


@dataclass(frozen=True)
class Transfer:
    """One point-to-point message of a merge.

    kind: "merge_input" (the merged-away instance's weights and momentum to the survivor's first worker),
    "global" (an instance's weights and momentum to a worker that needs them), "inner" (the inner-optimizer
    state of an instance's first worker to a worker that joins it) or "save" (merged weights to the rank that
    writes checkpoints).
    """

    kind: str
    instance: int
    src: int
    dst: int


def plan_transfers(plan: MergePlan, *, writer_rank: int = 0, save: bool = True) -> list[Transfer]:
    """The ordered messages that carry out a merge; every rank runs its own part in this order.

    Blocking sends and receives in one global order cannot deadlock: the earliest unfinished message always has both
    its ends waiting on it.
    """
    before = {inst.id: inst for inst in plan.before}
    survivor_src = before[plan.survivor].first_worker
    transfers = [Transfer("merge_input", plan.survivor, before[plan.merged].first_worker, survivor_src)]
    for inst in sorted(plan.after, key=lambda x: x.id):
        if inst.id == plan.survivor:
            src, holders = survivor_src, {survivor_src}
            joined = set(inst.workers) - set(before[inst.id].workers)
        else:
            holders = set(before[inst.id].workers)
            src = min(holders)
            joined = set(inst.workers) - holders
        for dst in sorted(set(inst.workers) - holders):
            transfers.append(Transfer("global", inst.id, src, dst))
        for dst in sorted(joined):
            transfers.append(Transfer("inner", inst.id, src, dst))
    receivers = {t.dst for t in transfers if t.kind == "global" and t.instance == plan.survivor}
    if save and writer_rank != survivor_src and writer_rank not in receivers:
        transfers.append(Transfer("save", plan.survivor, survivor_src, writer_rank))
    return transfers


@dataclass(frozen=True)
class Broadcast:
    """A non-merging instance's φ and outer momentum, from its first worker to the workers that join it."""

    instance: int
    src: int
    ranks: tuple[int, ...]  # the broadcast's group: `src` and the joining workers, ascending


@dataclass(frozen=True)
class MergeCollectives:
    """A merge as collectives (`merge_transport="all_reduce"`); every rank runs its part in this order.

    1. One all-reduce (a sum) over `members`: the workers of both merging instances, and any worker that joins the
       survivor from a third instance. Each contributes `weights[rank]` × (φ, momentum) of its instance: w_i / n_i
       for a worker of merging instance i (its merge weight over its number of workers), 0 for one that joins from
       elsewhere, so the sum is w_survivor·φ_s + w_merged·φ_m on every member.
    2. `broadcasts`, in instance id order: a non-merging instance's φ and momentum to the workers it gains. Their
       groups are disjoint, so they run side by side.
    3. `save_src` sends the merged φ to `writer` (the rank that writes checkpoints) when it is not a member.

    Inner-optimizer state is not sent: every worker keeps its own. `groups` lists the process groups, in the order
    every rank creates them (`new_group` is collective over the world).
    """

    members: tuple[int, ...]
    weights: dict[int, float]
    broadcasts: tuple[Broadcast, ...]
    writer: int
    save_src: int | None

    @property
    def groups(self) -> list[tuple[int, ...]]:
        return [self.members] + [b.ranks for b in self.broadcasts]


def plan_collectives(plan: MergePlan, *, writer_rank: int = 0, save: bool = True) -> MergeCollectives:
    """The collectives that carry out `plan` (see [`MergeCollectives`]); pure, the same on every rank."""
    before = {inst.id: inst for inst in plan.before}
    survivor, merged = before[plan.survivor], before[plan.merged]
    survivor_after = next(inst for inst in plan.after if inst.id == plan.survivor)
    members = tuple(sorted(set(survivor.workers) | set(merged.workers) | set(survivor_after.workers)))
    weights = {rank: 0.0 for rank in members}
    for inst, weight in zip((survivor, merged), plan.weights):
        for rank in inst.workers:
            weights[rank] = weight / len(inst.workers)
    broadcasts = []
    for inst in sorted(plan.after, key=lambda x: x.id):
        if inst.id == plan.survivor:
            continue
        joined = set(inst.workers) - set(before[inst.id].workers)
        if joined:
            src = before[inst.id].first_worker  # holds its instance's state, and stays (`redistribute`)
            broadcasts.append(Broadcast(inst.id, src, tuple(sorted(joined | {src}))))
    save_src = survivor.first_worker if save and writer_rank not in members else None
    return MergeCollectives(members, weights, tuple(broadcasts), writer_rank, save_src)
