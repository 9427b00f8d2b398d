"""Carrying out merges: the weighted average, redistribution, and the final merge.

Two transports (`AdLoCoConfig.merge_transport`), with P the payload of one instance state: φ and the outer momentum
in float32, 8 bytes per trainable parameter (4 without momentum); with `merge_payload="compact"` the all-reduce
transport sends φ in bfloat16 and the momentum as int8 blocks instead, P ≈ 3 bytes a parameter (`payload.py`):

- `"all_reduce"` (`all_reduce_merge`, `messages.plan_collectives`): the survivor's workers after the merge (n
  members: those of both merging instances that stay, and any that joins from a third instance) all-reduce the
  weighted sum of (φ, momentum); a worker of a merging instance that `redistribute` moves to another instance (a
  leaver) only hands its weighted contribution to one member, point to point, while it receives its new instance's
  state in a broadcast from that instance's first worker; the merged φ (P / 2 with momentum) goes to the checkpoint
  writer when it is not a member. Every worker keeps its own inner-optimizer (AdamW) state. Bytes sent: P per
  leaver, 2 (n − 1) P over the members (ring model, `outer.ring_all_reduce_bytes`; nothing for n = 1), (k − 1) P for
  a broadcast to k − 1 workers, P / 2 for the save. Link time: a leaver ≈ P (P up and P down at once); a member
  ≈ P down per hand-off it takes (round robin over the members), then 2 (n − 1) / n P < 2 P; the broadcasts of
  different instances side by side: ≤ 3 P per link (plus P / 2 where the writer is outside the merge).
- `"point_to_point"` (`execute_merge`): blocking sends in one global order (`messages.plan_transfers`): the merged
  instance's state to the survivor's first worker, the merged state to each other worker of the survivor one after
  the other, and the first worker's AdamW state (≈ P more) to each worker that joins an instance: ≈ n P on the
  survivor's first worker's link for the weights alone (P in, then P to each of the n − 1 others in turn), plus
  ≈ P per joining worker.
"""

import time
from dataclasses import dataclass

import torch

from ..common.distributed import (
    ProcessGroupCache,
    broadcast_tensors,
    is_distributed,
    recv_object_tensors,
    recv_tensor,
    send_object_tensors,
    send_tensor,
)
from ..common.layout import WorkerLayout
from ..config.choices import MERGE_TRANSPORTS
from ..outer.step import GlobalModel
from .merge_settings import MergePlace, MergeSettings
from .payload import Float32Payload, all_reduce_share, broadcast_state, merge_payload, recv_handoffs, start_handoff
from .table import Instance, MergePlan, final_merge_weights, instance_of
from .transfers import MergeCollectives, Transfer, plan_collectives, plan_transfers


__all__ = [
    "MERGE_TRANSPORTS",
    "MergeOutcome",
    "MergePlace",
    "MergeSettings",
    "all_reduce_merge",
    "all_reduce_share",
    "execute_merge",
    "final_merge",
    "merge_at_round_end",
]


def _peers(layout: WorkerLayout | None, local_rank: int):
    """Worker id → the global rank this process talks to for it: the same local rank of that worker (identity with
    one process per worker). With G processes per worker every local rank runs the merge over its own ranks, on the
    same data (the worker's processes hold the same φ, momentum and inner state), so they all end alike."""
    if layout is None or layout.processes_per_worker == 1:
        return lambda worker: worker
    return lambda worker: layout.rank(worker, local_rank)


def _local_groups(layout: WorkerLayout | None, local_rank: int, workers) -> tuple[int, ...]:
    return tuple(workers) if layout is None else layout.cross_ranks(workers, local_rank)


@dataclass(frozen=True)
class MergeResult:
    """A merge that happened at a round's end. `phi` holds the merged weights on global rank 0 (to save), else None;
    `rank_bytes` the bytes each global rank sent, in rank order (`bytes` is their sum)."""

    plan: MergePlan
    bytes: int
    seconds: float
    phi: torch.Tensor | None
    rank_bytes: tuple[int, ...] = ()


@dataclass
class MergeOutcome:
    """This rank's view of a merge."""

    sent_bytes: int
    merged_phi: torch.Tensor | None  # the survivor's new weights, where this rank has them
    changed_instance: bool
    received_bytes: int | None = None  # counted by `all_reduce_merge` (its all-reduce by the ring model)


def _send_global(phi: torch.Tensor, momentum: torch.Tensor | None, dst: int, group=None) -> int:
    sent = send_tensor(phi, dst, group)
    if momentum is not None:
        sent += send_tensor(momentum, dst, group)
    return sent


def _recv_global(
    like: torch.Tensor, src: int, with_momentum: bool, group=None
) -> tuple[torch.Tensor, torch.Tensor | None]:
    phi = recv_tensor(like, src, group)
    return phi, recv_tensor(like, src, group) if with_momentum else None


@torch.no_grad()
def execute_merge(
    plan: MergePlan,
    transfers: list[Transfer],
    *,
    rank: int,
    global_model: GlobalModel,
    inner_optimizer,
    with_momentum: bool,
    group=None,
    layout: WorkerLayout | None = None,
    local_rank: int = 0,
) -> MergeOutcome:
    """Run this rank's part of `transfers` in order, then apply what it received.

    Everything a rank sends is its state from before the merge; received state is applied only after the last
    message, so a rank can serve its old instance and join a new one in the same merge.

    Args:
        plan: the merge (identical on every rank).
        transfers: `plan_transfers(plan)`.
        rank: this process's global rank.
        global_model: this worker's φ and outer momentum.
        inner_optimizer: this worker's inner optimizer (its state is sent to workers that join the instance).
        with_momentum: whether the outer SGD has momentum to carry (outer_momentum > 0).
        group: the group of the messages (global ranks; a group of the whole world), the default group when None.
        layout, local_rank: with several processes per worker, `rank` and the plan are worker ids and this process
            exchanges with the same local rank of the other workers.
    """
    peer = _peers(layout, local_rank)
    phi = global_model.phi.detach()
    momentum = global_model.momentum if with_momentum else None
    if with_momentum and momentum is None:
        momentum = torch.zeros_like(phi)  # SGD's first step treats a zero buffer exactly like a missing one
    w_survivor, w_merged = plan.weights
    merged = incoming = inner_state = None
    saved_phi = None
    sent = 0
    for transfer in transfers:
        if rank == transfer.src:
            dst = peer(transfer.dst)
            if transfer.kind == "merge_input":
                sent += _send_global(phi, momentum, dst, group)
            elif transfer.kind == "global":
                source = merged if transfer.instance == plan.survivor else (phi, momentum)
                sent += _send_global(source[0], source[1], dst, group)
            elif transfer.kind == "inner":
                sent += send_object_tensors(inner_optimizer.state_dict(), dst, phi.device, group)
            elif transfer.kind == "save":
                sent += send_tensor(merged[0], dst, group)
        elif rank == transfer.dst:
            src = peer(transfer.src)
            if transfer.kind == "merge_input":
                other_phi, other_momentum = _recv_global(phi, src, with_momentum, group)
                merged_phi = phi.mul(w_survivor).add_(other_phi, alpha=w_merged)
                merged_momentum = (
                    momentum.mul(w_survivor).add_(other_momentum, alpha=w_merged) if with_momentum else None
                )
                merged = (merged_phi, merged_momentum)
            elif transfer.kind == "global":
                incoming = _recv_global(phi, src, with_momentum, group)
            elif transfer.kind == "inner":
                inner_state = recv_object_tensors(src, phi.device, group)
            elif transfer.kind == "save":
                saved_phi = recv_tensor(phi, src, group)
    new_state = merged if merged is not None else incoming
    if new_state is not None:
        global_model.load_flat(*new_state)
        global_model.copy_to_params()
    if inner_state is not None:
        inner_optimizer.load_state_dict(inner_state)
    survivor_members = next(inst.workers for inst in plan.after if inst.id == plan.survivor)
    if saved_phi is None and rank in survivor_members and new_state is not None:
        saved_phi = global_model.phi.detach()
    return MergeOutcome(sent, saved_phi, changed_instance=inner_state is not None)


@torch.no_grad()
def all_reduce_merge(
    plan: MergePlan,
    collectives: MergeCollectives,
    *,
    rank: int,
    global_model: GlobalModel,
    with_momentum: bool,
    groups,
    group=None,
    layout: WorkerLayout | None = None,
    local_rank: int = 0,
    payload=None,
) -> MergeOutcome:
    """Run this rank's part of `collectives` (`merge_transport="all_reduce"`, module docstring).

    Every rank first creates the process groups of `collectives.groups` in order (collective over the world, even for
    non-members), then: a leaver starts sending its hand-off (over `group`), a member receives the hand-offs it takes
    and runs the weighted all-reduce, a rank in a broadcast takes part in it, a leaver waits for its hand-off, then
    the save. Everything sent is this rank's state from before the merge; results are applied at the end. The inner
    optimizer is left alone: every worker keeps its own.

    Args:
        plan: the merge (identical on every rank).
        collectives: `plan_collectives(plan)`.
        rank: this process's global rank.
        global_model: this worker's φ and outer momentum.
        with_momentum: whether the outer SGD has momentum to carry (outer_momentum > 0).
        groups: a `distributed.ProcessGroupCache` (the worker's: groups are kept for the run).
        group: the group of the hand-offs and the save message (a group of the whole world; the default when None).
        layout, local_rank: as in `execute_merge` (each local rank runs the collectives over its own ranks).
        payload: what travels, `instances/payload.py` (`merge_payload`): float32 (None) or compact.
    """
    payload = payload or Float32Payload()
    peer = _peers(layout, local_rank)
    phi = global_model.phi.detach()
    momentum = global_model.momentum if with_momentum else None
    if with_momentum and momentum is None:
        momentum = torch.zeros_like(phi)  # SGD's first step treats a zero buffer exactly like a missing one
    state = [phi] if momentum is None else [phi, momentum]
    local_ranks = range(1 if layout is None else layout.processes_per_worker)
    for ranks in collectives.groups:  # every rank, in the same order: new_group is collective
        for local in local_ranks:
            groups.get(_local_groups(layout, local, ranks))
    sent = received = 0
    merged = incoming = saved_phi = None
    before = instance_of(list(plan.before), rank)
    pending = []  # a leaver's hand-off, in flight while it takes part in its new instance's broadcast
    for handoff in (h for h in collectives.handoffs if h.src == rank):
        pending, sent = start_handoff(payload, state, collectives.weights[rank], dst=peer(handoff.dst), group=group)
    if rank in collectives.members:
        srcs = [peer(h.src) for h in collectives.handoffs if h.dst == rank]
        taken, received = recv_handoffs(payload, srcs, group=group, like=phi, with_momentum=with_momentum)
        members = collectives.members
        members_group = groups.get(_local_groups(layout, local_rank, members)) if len(members) > 1 else None
        merged, share = payload.all_reduce(state, collectives.weights[rank], members_group, members, rank, taken)
        sent, received = sent + share, received + share  # the ring model: a member receives what it sends
    for broadcast in collectives.broadcasts:
        if rank in before.workers and broadcast.instance == before.id:
            kept = payload.exact(state)  # what the joining workers decode: every holder keeps the same
            if kept is not None and merged is None:
                incoming = kept
        if rank not in broadcast.ranks:
            continue
        broadcast_group = groups.get(_local_groups(layout, local_rank, broadcast.ranks))
        got, per_receiver = broadcast_state(
            payload,
            state,
            src=peer(broadcast.src),
            group=broadcast_group,
            is_src=rank == broadcast.src,
            like=phi,
            with_momentum=with_momentum,
        )
        sent += (len(broadcast.ranks) - 1) * per_receiver
        if got is not None:
            incoming = got
            received += payload.state_bytes(phi.numel(), with_momentum)
    for work in pending:
        work.wait()
    if collectives.save_src is not None:
        if rank == collectives.save_src:
            sent += payload.send_saved(merged[0], peer(collectives.writer), group)
        elif rank == collectives.writer:
            saved_phi = payload.recv_saved(phi, peer(collectives.save_src), group)
            received += payload.state_bytes(phi.numel(), False)
    now = instance_of(list(plan.after), rank).id
    new_state = merged if now == plan.survivor else incoming
    if new_state is not None:
        global_model.load_flat(new_state[0], new_state[1] if with_momentum else None)
        global_model.copy_to_params()
    if saved_phi is None and merged is not None:
        saved_phi = global_model.phi.detach()  # only the survivor's workers (the members) hold the merged state
    return MergeOutcome(sent, saved_phi, changed_instance=before.id != now, received_bytes=received)


@torch.no_grad()
def final_merge(
    instances: list[Instance],
    *,
    rank: int,
    global_model: GlobalModel,
    writer: int = 0,
    group=None,
    layout: WorkerLayout | None = None,
    local_rank: int = 0,
    broadcast_group=None,
) -> int:
    """Replace every worker's φ and θ by the demand-weighted average of the instances; returns bytes sent.

    Each instance's first worker sends its φ to `writer` (global rank 0 is always a first worker), which sums them
    in id order and broadcasts the result to all ranks, so every worker ends with bit-identical weights. An instance
    that never trained has weight 0 and sends nothing (`instances.final_merge_weights`). `group`: as in
    `execute_merge`. With several processes per worker (`layout`), `rank`, `writer` and the instances are worker ids,
    every local rank runs the merge over its own ranks, and the result is broadcast over `broadcast_group` (this local
    rank of every worker; a broadcast over the world from G roots at once would mismatch).
    """
    if len(instances) == 1 or not is_distributed():
        return 0
    peer = _peers(layout, local_rank)
    phi = global_model.phi.detach()
    weights = final_merge_weights(instances)
    sent = 0
    merged = torch.zeros_like(phi) if rank == writer else None
    for inst in sorted(instances, key=lambda x: x.id):
        src = inst.first_worker
        if weights[inst.id] == 0:
            continue
        if rank == writer:
            value = phi if src == writer else recv_tensor(phi, peer(src), group)
            merged.add_(value, alpha=weights[inst.id])
        elif rank == src:
            sent += send_tensor(phi, peer(writer), group)
    if merged is None:
        merged = torch.empty_like(phi)
    broadcast_tensors([merged], src=peer(writer), group=group if broadcast_group is None else broadcast_group)
    global_model.load_flat(merged, None)
    global_model.copy_to_params()
    return sent + (merged.numel() * merged.element_size() if rank == writer else 0)


def merge_at_round_end(
    plan: MergePlan,
    where: str,
    *,
    place: MergePlace,
    settings: MergeSettings,
    global_model: GlobalModel,
    inner_optimizer,
    monitor,
    hint,
    gather=None,
    before: tuple[int, float] = (0, 0.0),
) -> tuple[MergeResult, bool]:
    """Carry out a round's merge on this process, bounded by the monitor's `worker_timeout`; returns what every rank
    reports of it (bytes, seconds, the merged φ on global rank 0 when merges are saved) and whether this worker
    changed instance.

    `settings.transport`: `"all_reduce"` (`all_reduce_merge`, on process groups from `place.groups`) or
    `"point_to_point"` (`execute_merge`; module docstring). `gather` (sharded workers, worker_parallelism="fsdp"):
    turns worker 0's shards of the merged φ into what rank 0 saves, collective over worker 0's processes. `before`:
    the bytes this rank sent and the seconds it spent just before, as part of the merge (Streaming DiLoCo's sync of
    every fragment), counted in the merge's."""
    groups = place.groups
    if settings.transport == "all_reduce" and groups is None:  # groups of this merge only, bounded by worker_timeout
        groups = ProcessGroupCache(timeout=monitor.timeout.total_seconds())
    started = time.perf_counter()
    with monitor.watch(where, hint):  # its messages are bounded by worker_timeout too
        if settings.transport == "all_reduce":
            outcome = all_reduce_merge(
                plan,
                plan_collectives(plan, writer_rank=0, save=settings.save),
                rank=place.worker,
                global_model=global_model,
                with_momentum=settings.with_momentum,
                groups=groups,
                group=monitor.message_group,
                layout=place.layout,
                local_rank=place.local_rank,
                payload=merge_payload(settings.payload, block_size=settings.block_size),
            )
        else:
            outcome = execute_merge(
                plan,
                plan_transfers(plan, writer_rank=0, save=settings.save),
                rank=place.worker,
                global_model=global_model,
                inner_optimizer=inner_optimizer,
                with_momentum=settings.with_momentum,
                group=monitor.message_group,
                layout=place.layout,
                local_rank=place.local_rank,
            )
    moved = monitor.gather_rows(
        [outcome.sent_bytes + before[0], time.perf_counter() - started + before[1]], where, hint
    )
    phi = outcome.merged_phi if place.global_rank == 0 and settings.save else None
    if gather is not None and settings.save and place.worker == 0 and outcome.merged_phi is not None:
        full = gather(outcome.merged_phi)  # every process of worker 0 (the writer) holds its shard
        phi = full if place.global_rank == 0 else None
    sent = tuple(int(r[0]) for r in moved)
    result = MergeResult(plan, sum(sent), max(r[1] for r in moved), phi, rank_bytes=sent)
    return result, outcome.changed_instance
