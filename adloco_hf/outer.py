"""The outer step of DiLoCo (Douillard et al., 2023, arXiv 2311.08105) inside one instance.

At the end of a round every worker w of instance i computes the pseudo-gradient Δ_w = φ_i − θ_w in float32, the
instance averages it with one all-reduce (in `pseudo_grad_dtype`, only when it has more than one worker), every
worker applies the same outer SGD (momentum, Nesterov) to its replica of φ_i, and sets θ_w ← φ_i. φ_i and the
momentum stay in float32 on the device or on the CPU.
"""

import math
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist

from .distributed import comm_device


__all__ = ["DTYPES", "GlobalModel", "OuterStepResult", "ring_all_reduce_bytes"]

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
# Elements per all-reduce bucket: bounds the low-precision copy made for communication (64 MiB in bf16).
BUCKET_NUMEL = 1 << 25


def ring_all_reduce_bytes(payload_bytes: int, num_workers: int) -> int:
    """Bytes all workers together send in a ring all-reduce: each sends 2 (M − 1) / M of the payload."""
    return 2 * (num_workers - 1) * payload_bytes


@dataclass
class OuterStepResult:
    """What one outer step did on this worker."""

    pseudo_grad_norm: float
    payload_bytes: int  # what one worker contributes to the all-reduce (0 when it communicates nothing)
    seconds: float
    skipped: bool


class GlobalModel:
    """φ_i, the float32 global copy of an instance's trainable parameters, with its outer SGD.

    φ is one flat tensor (a leaf with `.grad` holding the pseudo-gradient), so the all-reduce and the optimizer step
    are single fused operations; `views` map it back onto the parameters.

    Args:
        params: the worker's trainable parameters θ, in a fixed order shared by all workers.
        device: where φ and the momentum live.
        lr, momentum, nesterov: the outer SGD's settings.
    """

    def __init__(
        self, params: list[torch.Tensor], *, device: torch.device, lr: float, momentum: float, nesterov: bool
    ):
        self.params = params
        self.numel = sum(p.numel() for p in params)
        self.phi = torch.zeros(self.numel, dtype=torch.float32, device=device, requires_grad=True)
        self.phi.grad = torch.zeros_like(self.phi)
        self.views = self.views_of(self.phi.data)
        self.grad_views = self.views_of(self.phi.grad)
        self.optimizer = torch.optim.SGD(
            [self.phi], lr=lr, momentum=momentum, nesterov=bool(nesterov and momentum > 0)
        )
        self.copy_from_params()

    @classmethod
    def from_args(cls, params: list[torch.Tensor], args) -> "GlobalModel":
        """With an `AdLoCoConfig`'s outer optimizer, on `outer_state_device` ("device": `args.device`, or "cpu")."""
        device = torch.device("cpu") if args.outer_state_device == "cpu" else args.device
        return cls(params, device=device, lr=args.outer_lr, momentum=args.outer_momentum, nesterov=args.outer_nesterov)

    def views_of(self, flat: torch.Tensor) -> list[torch.Tensor]:
        """Views of a flat tensor shaped like the parameters, in their order."""
        views, offset = [], 0
        for p in self.params:
            views.append(flat[offset : offset + p.numel()].view(p.shape))
            offset += p.numel()
        return views

    @property
    def device(self) -> torch.device:
        return self.phi.device

    @torch.no_grad()
    def copy_from_params(self) -> None:
        """φ ← θ."""
        for view, p in zip(self.views, self.params):
            view.copy_(p.detach())

    @torch.no_grad()
    def copy_to_params(self) -> None:
        """θ ← φ (cast to the parameters' dtype and device)."""
        for view, p in zip(self.views, self.params):
            p.copy_(view)

    @property
    def momentum(self) -> torch.Tensor | None:
        return self.optimizer.state.get(self.phi, {}).get("momentum_buffer")

    def set_momentum(self, value: torch.Tensor | None) -> None:
        if value is None:
            self.optimizer.state.pop(self.phi, None)
        else:
            self.optimizer.state[self.phi]["momentum_buffer"] = value.to(self.device, torch.float32).clone()

    @torch.no_grad()
    def load_flat(self, phi: torch.Tensor, momentum: torch.Tensor | None) -> None:
        """Replace φ and the momentum (e.g. after a merge or a move to another instance)."""
        self.phi.data.copy_(phi.to(self.device, torch.float32))
        self.set_momentum(momentum)

    @torch.no_grad()
    def outer_step(self, *, group, num_workers: int, dtype: torch.dtype) -> OuterStepResult:
        """Pseudo-gradient, instance all-reduce, outer SGD, θ ← φ. A non-finite Δ_i leaves φ unchanged.

        Every worker of the instance calls this in the same round; `group` is the instance's process group
        (None for a single worker, which then communicates nothing and keeps Δ in float32).
        """
        start = time.perf_counter()
        delta = self.phi.grad
        for grad_view, view, p in zip(self.grad_views, self.views, self.params):
            grad_view.copy_(p.detach())
            grad_view.neg_().add_(view)
        payload = 0
        if num_workers > 1:
            payload = self._all_reduce_mean(delta, group, num_workers, dtype)
        norm = float(torch.linalg.vector_norm(delta))
        skipped = not math.isfinite(norm)
        if not skipped:
            self.optimizer.step()
        self.copy_to_params()
        return OuterStepResult(norm, payload, time.perf_counter() - start, skipped)

    def _all_reduce_mean(self, delta: torch.Tensor, group, num_workers: int, dtype: torch.dtype) -> int:
        """Average Δ over the group in `dtype`; returns the payload in bytes."""
        device = comm_device(delta.device)
        delta.div_(num_workers)  # before the cast, so float16 sums cannot overflow
        pending = []
        for start in range(0, delta.numel(), BUCKET_NUMEL):
            chunk = delta[start : start + BUCKET_NUMEL]
            buffer = chunk.to(device=device, dtype=dtype)  # the chunk itself when no cast or move is needed
            pending.append((chunk, buffer, dist.all_reduce(buffer, group=group, async_op=True)))
        for chunk, buffer, work in pending:
            work.wait()
            if buffer.data_ptr() != chunk.data_ptr():
                chunk.copy_(buffer)
        return delta.numel() * torch.empty((), dtype=dtype).element_size()

    def state_dict(self) -> dict:
        return {
            "phi": self.phi.detach().cpu().clone(),
            "momentum": None if self.momentum is None else self.momentum.detach().cpu().clone(),
        }

    def load_state_dict(self, state: dict) -> None:
        if state["phi"].numel() != self.numel:
            raise ValueError(
                f"the saved global weights have {state['phi'].numel()} elements but the model has {self.numel}"
            )
        self.load_flat(state["phi"], state["momentum"])
