"""What a merge sends, and in which precision (`merge_payload`), for `merge_transport="all_reduce"`.

A merge moves instance states, φ and the outer momentum: into the survivor's weighted average (one all-reduce over
its members, after the workers that leave it handed their weighted contributions to a member: `start_handoff`,
`recv_handoffs`, in the same encoding as a broadcast) and to the workers that join another instance (a broadcast from
its first worker).

- `"float32"`: φ and the momentum as they are, 8 bytes a parameter: an all-reduce of n members takes
  2 (n − 1) / n × 8 bytes a parameter of link time, 6 bf16 model-times at n = 4; a leaver sends 4 while it
  receives 4 (its new instance's state).
- `"compact"`: what a merge needs in the precision it needs: φ in bfloat16 (the all-reduce sums bf16 values, each
  member's φ × its weight plus the contributions handed to it, rounded once; the result, exact in bf16, becomes
  every member's float32 φ) and the outer momentum as int8 blocks of `compression_block_size` values with one
  float32 scale each, averaged by the int8 ring of the pseudo-gradient (`outer/ring.py`: it re-quantizes partial
  sums; every member decodes the same bytes). About 2 + 1.02 bytes a parameter: 2.3 bf16 model-times at n = 4, 1.5
  at n = 2, and a leaver 1.5 up while it receives 1.5. The momentum's error is not fed back (a worker's residual
  would differ between the members, whose momenta must stay equal); it decays by the outer momentum every round. A
  hand-off sends the broadcasts' encoding of the leaver's weighted state. A broadcast's source instance applies the
  rounding the receivers decode to its own state, so the instance's workers still hold equal φ and momentum.

Measured in `recipes/benchmarks/merge_precision/` (the merged model's perplexity against the float32 merge's) and on
rate-limited links in `recipes/benchmarks/links/`.
"""

import torch
import torch.distributed as dist

from ..common.distributed import broadcast_tensors, comm_device, recv_tensor, send_tensor
from ..config.choices import MERGE_PAYLOADS
from ..outer.compression import Quantized, dequantize, quantize, wire_bytes
from ..outer.ring import ring_all_reduce_mean
from ..outer.step import ring_all_reduce_bytes


__all__ = [
    "MERGE_PAYLOADS",
    "CompactPayload",
    "Float32Payload",
    "all_reduce_share",
    "broadcast_state",
    "merge_payload",
    "recv_handoffs",
    "start_handoff",
]

MOMENTUM_BITS = 8


def all_reduce_share(payload_bytes: int, members: tuple[int, ...], rank: int) -> int:
    """This member's share of a ring all-reduce's bytes (`outer.ring_all_reduce_bytes`): 2 (n − 1) / n of the
    payload, split so that the members' shares add up to the ring total exactly."""
    total, n = ring_all_reduce_bytes(payload_bytes, len(members)), len(members)
    index = members.index(rank)
    return total // n + (1 if index < total % n else 0)


def _weighted(tensor: torch.Tensor, weight: float, device: torch.device) -> torch.Tensor:
    """weight × tensor, a new float32 tensor on `device` (zeros for weight 0: a non-finite value must not leak)."""
    if weight == 0:
        return torch.zeros(tensor.shape, dtype=torch.float32, device=device)
    return tensor.to(device, torch.float32).mul(weight)


def _contribution(state, weight: float, device: torch.device, received) -> list[torch.Tensor]:
    """weight × state plus the received (already weighted) contributions, float32 on `device`."""
    total = [_weighted(t, weight, device) for t in state]
    for other in received:
        for mine, theirs in zip(total, other):
            mine.add_(theirs.to(device))
    return total


class Float32Payload:
    """φ and the outer momentum in float32 (module docstring)."""

    name = "float32"

    def state_bytes(self, numel: int, with_momentum: bool) -> int:
        return numel * 4 * (2 if with_momentum else 1)

    def all_reduce(self, state, weight: float, group, members: tuple[int, ...], rank: int, received=()):
        """Σ over the members of weight × state, plus the `received` contributions (decoded hand-offs, already
        weighted), the same on every member (float32, on the comm device); and the bytes this member sent. With one
        member nothing travels."""
        on = comm_device(state[0].device)
        merged = _contribution(state, weight, on, received)
        if len(members) > 1:
            for tensor in merged:
                dist.all_reduce(tensor, op=dist.ReduceOp.SUM, group=group)
        return merged, all_reduce_share(sum(t.numel() * 4 for t in state), members, rank)

    def encode(self, state):
        """What a broadcast sends of `state` (the source only reads it)."""
        return list(state)

    def decode(self, wire, like: torch.Tensor):
        return [t.to(like.device, torch.float32) for t in wire]

    def empty(self, like: torch.Tensor, with_momentum: bool):
        on = comm_device(like.device)
        return [torch.empty(like.shape, dtype=torch.float32, device=on) for _ in range(2 if with_momentum else 1)]

    def exact(self, state):
        """The state every holder keeps after sending it: unchanged."""
        return None

    def send_saved(self, phi: torch.Tensor, dst: int, group) -> int:
        return send_tensor(phi, dst, group)

    def recv_saved(self, like: torch.Tensor, src: int, group) -> torch.Tensor:
        return recv_tensor(like, src, group)


class CompactPayload:
    """φ in bfloat16 and the outer momentum as int8 blocks (module docstring)."""

    name = "compact"

    def __init__(self, block_size: int = 256):
        self.block_size = block_size

    def _momentum_bytes(self, numel: int) -> int:
        return wire_bytes(numel, bits=MOMENTUM_BITS, block_size=self.block_size)

    def state_bytes(self, numel: int, with_momentum: bool) -> int:
        return numel * 2 + (self._momentum_bytes(numel) if with_momentum else 0)

    def all_reduce(self, state, weight: float, group, members: tuple[int, ...], rank: int, received=()):
        """As `Float32Payload.all_reduce`: this member's contribution (its own and the received ones, added in
        float32) is rounded to bf16 once before the bf16 sum; the momentum goes through the int8 ring."""
        phi = state[0]
        on = comm_device(phi.device)
        contribution = _contribution(state, weight, on, received)
        summed = contribution[0].to(torch.bfloat16)
        sent = 0
        if len(members) > 1:
            dist.all_reduce(summed, op=dist.ReduceOp.SUM, group=group)
            sent = all_reduce_share(phi.numel() * 2, members, rank)
        merged = [summed.to(phi.device, torch.float32)]
        if len(state) > 1:
            momentum = contribution[1].to(state[1].device)
            if len(members) > 1:
                # The ring averages: each member puts in n × its contribution, so the mean is the weighted sum.
                ring = ring_all_reduce_mean(
                    momentum.mul_(len(members)), group, bits=MOMENTUM_BITS, block_size=self.block_size
                )
                momentum = ring.mean
                sent += ring.bytes_sent
            merged.append(momentum)
        return merged, sent

    def encode(self, state):
        wire = [state[0].detach().to(torch.bfloat16)]
        if len(state) > 1:
            wire.append(quantize(state[1].detach().float(), MOMENTUM_BITS, self.block_size).to_wire())
        return [t.to(comm_device(state[0].device)) for t in wire]

    def decode(self, wire, like: torch.Tensor):
        state = [wire[0].to(like.device, torch.float32)]
        if len(wire) > 1:
            numel = like.numel()
            q = Quantized.from_wire(wire[1].to(like.device), numel, bits=MOMENTUM_BITS, block_size=self.block_size)
            state.append(dequantize(q).reshape(like.shape))
        return state

    def empty(self, like: torch.Tensor, with_momentum: bool):
        on = comm_device(like.device)
        wire = [torch.empty(like.shape, dtype=torch.bfloat16, device=on)]
        if with_momentum:
            wire.append(torch.empty(self._momentum_bytes(like.numel()), dtype=torch.uint8, device=on))
        return wire

    def exact(self, state):
        """The state every holder keeps after broadcasting it: what the receivers decode, so that all agree."""
        return self.decode(self.encode(state), state[0])

    def send_saved(self, phi: torch.Tensor, dst: int, group) -> int:
        return send_tensor(phi.to(torch.bfloat16), dst, group)  # the merged φ is exact in bf16

    def recv_saved(self, like: torch.Tensor, src: int, group) -> torch.Tensor:
        return recv_tensor(like.new_empty(like.shape, dtype=torch.bfloat16), src, group).to(like.device, torch.float32)


def merge_payload(name: str, *, block_size: int = 256) -> Float32Payload | CompactPayload:
    """The payload `merge_payload=name` sends."""
    if name not in MERGE_PAYLOADS:
        raise ValueError(f"merge_payload={name!r}: choose one of {list(MERGE_PAYLOADS)}")
    return CompactPayload(block_size) if name == "compact" else Float32Payload()


def broadcast_state(payload, state, *, src: int, group, is_src: bool, like: torch.Tensor, with_momentum: bool):
    """A broadcast of an instance's state from `src` (a global rank) over `group`: the source sends its encoding,
    the others return what they decoded. Returns (the state, bytes this rank sent per receiver)."""
    if is_src:
        wire = payload.encode(state)
        broadcast_tensors(wire, src=src, group=group)
        return None, sum(t.numel() * t.element_size() for t in wire)
    wire = payload.empty(like, with_momentum)
    broadcast_tensors(wire, src=src, group=group)
    return payload.decode(wire, like), 0


def start_handoff(payload, state, weight: float, *, dst: int, group) -> tuple[list, int]:
    """Start sending a leaver's contribution (weight × state, encoded as a broadcast is) to global rank `dst` without waiting: the leaver
    receives its new instance's broadcast meanwhile. Returns (the pending sends, to wait on; the bytes sent)."""
    # Weighted, then in the payload's broadcast encoding (float32 as it is; compact: bf16 φ, int8 momentum blocks).
    wire = [t.contiguous() for t in payload.encode([_weighted(t, weight, comm_device(t.device)) for t in state])]
    works = [dist.isend(t, dst=dst, group=group) for t in wire]
    return works, sum(t.numel() * t.element_size() for t in wire)


def recv_handoffs(payload, srcs, *, group, like: torch.Tensor, with_momentum: bool) -> tuple[list, int]:
    """The contributions of the leavers at global ranks `srcs`, in order, decoded (float32, weighted); and the bytes
    received."""
    taken, received = [], 0
    for src in srcs:
        wire = [recv_tensor(t, src, group) for t in payload.empty(like, with_momentum)]
        taken.append(payload.decode(wire, like))
        received += sum(t.numel() * t.element_size() for t in wire)
    return taken, received
