"""The messages that carry out a merge (pure, the same on every rank): point-to-point sends in one global order
(`merge_transport="point_to_point"`, `plan_transfers`) or collectives (`"all_reduce"`, `plan_collectives`), planned
from a `table.MergePlan`; `merges.py` runs them."""

from dataclasses import dataclass

from .table import MergePlan


__all__ = ["Broadcast", "HandOff", "MergeCollectives", "Transfer", "plan_collectives", "plan_transfers"]


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
class HandOff:
    """A leaver's weighted contribution (its factor × φ and momentum) to a worker that stays in the survivor."""

    src: int
    dst: int


@dataclass(frozen=True)
class MergeCollectives:
    """A merge as collectives (`merge_transport="all_reduce"`); every rank runs its part in this order.

    Every worker of the two merging instances contributes `weights[rank]` × (φ, momentum) of its instance: w_i / n_i
    for a worker of merging instance i (its merge weight over its number of workers), so the contributions add up to
    w_survivor·φ_s + w_merged·φ_m. A worker that joins the survivor from a third instance contributes 0.

    1. `handoffs`: each leaver (a merging instance's worker that is not among the survivor's workers after the merge:
       `redistribute` moves it to another instance) sends its contribution, point to point, to one of the `members`
       (round robin, ascending), which adds it to its own; a leaver does not receive the merged state.
    2. One all-reduce (a sum) over `members`: the survivor's workers after the merge (those of the merging instances
       that stay, and those that join from a third instance), so every member ends with the sum. With one member
       there is nothing to reduce.
    3. `broadcasts`, in instance id order: a non-merging instance's φ and momentum to the workers it gains. Their
       groups are disjoint, so they run side by side, and side by side with the hand-offs: a leaver sends its
       contribution while it receives its new instance's state.
    4. `save_src` (the first member) sends the merged φ to `writer` (the rank that writes checkpoints) when it is not
       a member.

    Inner-optimizer state is not sent: every worker keeps its own. `groups` lists the process groups, in the order
    every rank creates them (`new_group` is collective over the world).
    """

    members: tuple[int, ...]
    weights: dict[int, float]  # every contributor: the members and the leavers
    handoffs: tuple[HandOff, ...]
    broadcasts: tuple[Broadcast, ...]
    writer: int
    save_src: int | None

    @property
    def groups(self) -> list[tuple[int, ...]]:
        return ([self.members] if len(self.members) > 1 else []) + [b.ranks for b in self.broadcasts]


def plan_collectives(plan: MergePlan, *, writer_rank: int = 0, save: bool = True) -> MergeCollectives:
    """The collectives that carry out `plan` (see [`MergeCollectives`]); pure, the same on every rank."""
    before = {inst.id: inst for inst in plan.before}
    survivor, merged = before[plan.survivor], before[plan.merged]
    members = next(inst for inst in plan.after if inst.id == plan.survivor).workers
    members = tuple(sorted(members))  # at least one of the survivor's own workers (`redistribute` keeps them first)
    leavers = sorted((set(survivor.workers) | set(merged.workers)) - set(members))
    weights = {rank: 0.0 for rank in members}
    for inst, weight in zip((survivor, merged), plan.weights):
        for rank in inst.workers:
            weights[rank] = weight / len(inst.workers)
    handoffs = tuple(HandOff(rank, members[i % len(members)]) for i, rank in enumerate(leavers))
    broadcasts = []
    for inst in sorted(plan.after, key=lambda x: x.id):
        if inst.id == plan.survivor:
            continue
        joined = set(inst.workers) - set(before[inst.id].workers)
        if joined:
            src = before[inst.id].first_worker  # holds its instance's state, and stays (`redistribute`)
            broadcasts.append(Broadcast(inst.id, src, tuple(sorted(joined | {src}))))
    save_src = members[0] if save and writer_rank not in members else None
    return MergeCollectives(members, weights, handoffs, tuple(broadcasts), writer_rank, save_src)
