"""Carrying out merges with point-to-point messages: the weighted average, redistribution, and the final merge."""

import time
from dataclasses import dataclass

import torch

from .distributed import (
    broadcast_tensors,
    is_distributed,
    recv_object_tensors,
    recv_tensor,
    send_object_tensors,
    send_tensor,
)
from .instances import Instance, MergePlan, Transfer, final_merge_weights, plan_transfers
from .outer import GlobalModel
from .rounds import MergeResult


__all__ = ["MergeOutcome", "execute_merge", "final_merge", "merge_at_round_end"]


@dataclass
class MergeOutcome:
    """This rank's view of a merge."""

    sent_bytes: int
    merged_phi: torch.Tensor | None  # the survivor's new weights, where this rank has them
    changed_instance: bool


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
    """
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
            if transfer.kind == "merge_input":
                sent += _send_global(phi, momentum, transfer.dst, group)
            elif transfer.kind == "global":
                source = merged if transfer.instance == plan.survivor else (phi, momentum)
                sent += _send_global(source[0], source[1], transfer.dst, group)
            elif transfer.kind == "inner":
                sent += send_object_tensors(inner_optimizer.state_dict(), transfer.dst, phi.device, group)
            elif transfer.kind == "save":
                sent += send_tensor(merged[0], transfer.dst, group)
        elif rank == transfer.dst:
            if transfer.kind == "merge_input":
                other_phi, other_momentum = _recv_global(phi, transfer.src, with_momentum, group)
                merged_phi = phi.mul(w_survivor).add_(other_phi, alpha=w_merged)
                merged_momentum = (
                    momentum.mul(w_survivor).add_(other_momentum, alpha=w_merged) if with_momentum else None
                )
                merged = (merged_phi, merged_momentum)
            elif transfer.kind == "global":
                incoming = _recv_global(phi, transfer.src, with_momentum, group)
            elif transfer.kind == "inner":
                inner_state = recv_object_tensors(transfer.src, phi.device, group)
            elif transfer.kind == "save":
                saved_phi = recv_tensor(phi, transfer.src, group)
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
def final_merge(
    instances: list[Instance], *, rank: int, global_model: GlobalModel, writer: int = 0, group=None
) -> int:
    """Replace every worker's φ and θ by the demand-weighted average of the instances; returns bytes sent.

    Each instance's first worker sends its φ to `writer` (global rank 0 is always a first worker), which sums them
    in id order and broadcasts the result to all ranks, so every worker ends with bit-identical weights. An instance
    that never trained has weight 0 and sends nothing (`instances.final_merge_weights`). `group`: as in
    `execute_merge`.
    """
    if len(instances) == 1 or not is_distributed():
        return 0
    phi = global_model.phi.detach()
    weights = final_merge_weights(instances)
    sent = 0
    merged = torch.zeros_like(phi) if rank == writer else None
    for inst in sorted(instances, key=lambda x: x.id):
        src = inst.first_worker
        if weights[inst.id] == 0:
            continue
        if rank == writer:
            value = phi if src == writer else recv_tensor(phi, src, group)
            merged.add_(value, alpha=weights[inst.id])
        elif rank == src:
            sent += send_tensor(phi, writer, group)
    if merged is None:
        merged = torch.empty_like(phi)
    broadcast_tensors([merged], src=writer, group=group)
    global_model.load_flat(merged, None)
    global_model.copy_to_params()
    return sent + (merged.numel() * merged.element_size() if rank == writer else 0)


def merge_at_round_end(
    plan: MergePlan,
    where: str,
    *,
    rank: int,
    global_model: GlobalModel,
    inner_optimizer,
    with_momentum: bool,
    save: bool,
    monitor,
    hint,
) -> tuple[MergeResult, bool]:
    """Carry out a round's merge on this rank, bounded by the monitor's `worker_timeout`; returns what every rank
    reports of it (bytes, seconds, the merged φ on global rank 0 when merges are saved) and whether this worker
    changed instance."""
    started = time.perf_counter()
    transfers = plan_transfers(plan, writer_rank=0, save=save)
    with monitor.watch(where, hint):  # its messages are bounded by worker_timeout too
        outcome = execute_merge(
            plan,
            transfers,
            rank=rank,
            global_model=global_model,
            inner_optimizer=inner_optimizer,
            with_momentum=with_momentum,
            group=monitor.message_group,
        )
    moved = monitor.gather_rows([outcome.sent_bytes, time.perf_counter() - started], where, hint)
    phi = outcome.merged_phi if rank == 0 and save else None
    result = MergeResult(plan, int(sum(r[0] for r in moved)), max(r[1] for r in moved), phi)
    return result, outcome.changed_instance
