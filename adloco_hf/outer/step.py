"""The outer step of DiLoCo (Douillard et al., 2023, arXiv 2311.08105) inside one instance.

At the end of a round every worker w of instance i computes the pseudo-gradient Δ_w = φ_i − θ_w in float32, the
instance averages it (`outer_reduce`: an all-reduce in `pseudo_grad_dtype`, or int8 / int4 blocks with error
feedback; only when it has more than one worker), every worker applies the same outer SGD (momentum, Nesterov) to its
replica of φ_i, and sets θ_w ← φ_i. φ_i and the momentum stay in float32 on the device or on the CPU.

With `outer_overlap` the average of round t is applied one round late and each worker applies its own fresh Δ at
once (`eager.EagerOffset`): θ_w ← φ_i + o_w, and the all-reduce runs while the next round trains. With
`num_fragments` φ is synced in fragments on a staggered schedule instead (`streaming.StreamingSync`, held as
`GlobalModel.streaming`), each overlapped with `fragment_sync_delay` inner steps.
"""

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import partial

import torch

from ..common.layout import part_range
from .eager import EagerOffset
from .process_split import ProcessSplit
from .reduce import BUCKET_NUMEL, PendingMean, PseudoGradReduce, ring_all_reduce_bytes
from .settings import OuterSettings
from .streaming_diloco import StreamingSync


__all__ = ["BUCKET_NUMEL", "DTYPES", "GlobalModel", "OuterStepResult", "ProcessSplit", "ring_all_reduce_bytes"]

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass
class OuterStepResult:
    """What one outer step did on this worker."""

    pseudo_grad_norm: float  # of the average applied to φ (overlapped: the previous round's; 0 in the first)
    payload_bytes: int  # what one worker contributes to the all-reduce (0 when it communicates nothing)
    seconds: float  # spent in the outer step (overlapped: mostly waiting for the previous round's average)
    skipped: bool  # the average was not finite: φ unchanged
    local_finite: bool = True  # this worker's own Δ was finite (overlapped: a non-finite one is not applied)
    local_sq_norm: float = math.nan  # ‖Δ_w‖² of this worker's own Δ before the average (blocking steps only)


class GlobalModel:
    """φ_i, the float32 global copy of an instance's trainable parameters, with its outer SGD.

    φ is one flat tensor (a leaf whose `.grad` holds the pseudo-gradient during the outer step), so the all-reduce and
    the optimizer step are single fused operations; `views` map it back onto the parameters. Between outer steps the
    instance's state is φ and the momentum (8 bytes a parameter on `device`): Δ lives only during the outer step,
    when the inner step's activations are freed, so it does not raise the worker's peak memory.

    Args:
        params: the worker's trainable parameters θ, in a fixed order shared by all workers.
        device: where φ and the momentum live.
        lr, momentum, nesterov: the outer SGD's settings.
        reduce: how the instance averages Δ (bfloat16 all-reduce when None).
        overlap: eager updates with the all-reduce in flight during the next round (`outer_overlap`).
        overlap_local_weight: λ of the eager update (`eager.EagerOffset`; None: 1 / M).
        fragments: Streaming DiLoCo's (num_fragments, fragment_sync_delay, fragment_update_alpha), or None: the whole
            of φ at every round's end (`streaming.StreamingSync`).
        positions: with fragments, where `params` lie in the whole model when they are shards of it (the position of
            each one's first element, and the whole model's size); None: they are the whole model.
    """

    def __init__(
        self,
        params: list[torch.Tensor],
        *,
        device: torch.device,
        lr: float,
        momentum: float,
        nesterov: bool,
        reduce: PseudoGradReduce | None = None,
        overlap: bool = False,
        overlap_local_weight: float | None = 1.0,
        fragments: tuple[int, int, float] | None = None,
        positions: tuple[list[int], int] | None = None,
    ):
        self.params = params
        self.numel = sum(p.numel() for p in params)
        self.phi = torch.zeros(self.numel, dtype=torch.float32, device=device, requires_grad=True)
        self.views = self.views_of(self.phi.data)
        self.optimizer = torch.optim.SGD(
            [self.phi], lr=lr, momentum=momentum, nesterov=bool(nesterov and momentum > 0)
        )
        self.reduce = reduce if reduce is not None else PseudoGradReduce()
        self.eager = (
            EagerOffset(
                self.numel,
                device=device,
                lr=lr,
                momentum=momentum,
                nesterov=nesterov,
                local_weight=overlap_local_weight,
            )
            if overlap
            else None
        )
        self.pending: PendingMean | None = None  # overlapped: the average of the last round, in flight
        # processes_per_worker > 1 (`split_over`): this process reduces slice [a, b) of Δ across workers and the
        # worker's intra group all-gathers the slices; φ and the momentum stay whole on every process of the worker.
        self.part: tuple[int, int] | None = None
        self.split = ProcessSplit()
        # worker_parallelism="fsdp" (`shard_over`): `params` are this process's shards; the norms are summed over
        # the worker's processes (`split.norm_group`) so that all of them report the whole model's and skip alike.
        self.copy_from_params()
        self.streaming: StreamingSync | None = None
        if fragments is not None:
            num_fragments, delay, alpha = fragments
            self.streaming = StreamingSync(
                self, num_fragments=num_fragments, delay=delay, alpha=alpha, positions=positions
            )

    @classmethod
    def from_settings(
        cls,
        params: list[torch.Tensor],
        settings: OuterSettings,
        *,
        device: torch.device,
        positions: tuple[list[int], int] | None = None,
    ) -> "GlobalModel":
        """With the run's outer settings: its outer optimizer, on `state_device` ("device": `device`, the worker's;
        or "cpu"), its `compression` (or `pseudo_grad_dtype`), `overlap` and fragments (`positions`: see the
        class)."""
        state_device = torch.device("cpu") if settings.state_device == "cpu" else device
        reduce = PseudoGradReduce(
            settings.compression, dtype=DTYPES[settings.pseudo_grad_dtype], block_size=settings.compression_block_size
        )
        return cls(
            params,
            device=state_device,
            lr=settings.lr,
            momentum=settings.momentum,
            nesterov=settings.nesterov,
            reduce=reduce,
            overlap=settings.overlap,
            overlap_local_weight=settings.overlap_local_weight,
            fragments=settings.fragments,
            positions=positions,
        )

    def split_over(self, intra_group, processes_per_worker: int, local_rank: int) -> None:
        """Reduce only this process's 1/G slice of Δ across workers (`worker_layout.part_range`), then all-gather the
        slices over the worker's `intra_group`, so each of the worker's G links carries 1/G of the payload."""
        if processes_per_worker <= 1:
            return
        self.split = replace(self.split, intra_group=intra_group, parts=processes_per_worker, local_rank=local_rank)
        self.part = part_range(self.numel, processes_per_worker, local_rank)

    def shard_over(self, intra_group) -> None:
        """`params` are this process's FSDP shards (the same shard as this local rank of the other workers): Δ is
        all-reduced across workers as it is, and only its norms are summed over the worker's `intra_group`."""
        self.split = replace(self.split, norm_group=intra_group)

    @property
    def overlap(self) -> bool:
        return self.eager is not None

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
        """θ ← φ (+ this worker's eager offset while one is held), cast to the parameters' dtype and device."""
        offset = None if self.eager is None else self.eager.offset
        if offset is None:
            for view, p in zip(self.views, self.params):
                p.copy_(view)
            return
        for view, offset_view, p in zip(self.views, self.views_of(offset), self.params):
            p.copy_(view + offset_view)

    @torch.no_grad()
    def start_point(self) -> torch.Tensor:
        """Where this worker's round started: φ, or φ + o with an eager offset (flat float32, a new tensor)."""
        offset = None if self.eager is None else self.eager.offset
        return self.phi.detach().clone() if offset is None else self.phi.detach() + offset

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
    def outer_step(
        self,
        *,
        group,
        num_workers: int,
        dtype: torch.dtype | None = None,
        weight: float | None = None,
        agree: Callable[[Callable[[], None]], bool] | None = None,
    ) -> OuterStepResult:
        """Pseudo-gradient, instance average, outer SGD, θ ← φ. A non-finite average leaves φ unchanged.

        Every worker of the instance calls this in the same round; `group` is the instance's process group
        (None for a single worker, which then communicates nothing and keeps Δ in float32). `dtype` overrides the
        reduce's `pseudo_grad_dtype` (kept for callers of the blocking bf16/fp32 step). `weight`: this worker's
        share of the samples its instance trained in the round, when they differ (`worker_batch_split="speed"`):
        the average is then Σ_w weight_w Δ_w (`outer/reduce.py`); None is the plain mean.

        `agree` (live recovery's `RoundQuorum.agree`, blocking whole-φ steps only): runs the average, True if every
        member commits it; else every member drops the round alike (φ unchanged, θ ← φ, skipped with a NaN norm).
        """
        if dtype is not None and dtype != self.reduce.dtype and self.reduce.bits is None:
            self.reduce.dtype = dtype
        if agree is not None and (self.eager is not None or self.part is not None or self.streaming is not None):
            raise ValueError("a round quorum's outer step is blocking and whole: no outer_overlap, fragments or split")
        if self.eager is not None:
            return self._overlapped_step(group, num_workers, weight)
        start = time.perf_counter()
        delta = self.pseudo_gradient()
        local_sq = float(torch.dot(delta, delta))
        sent = self.numel
        committed = True
        if num_workers > 1 and self.part is not None:
            a, b = self.part
            part = delta[a:b]
            self.reduce.start(part, group, num_workers, out=part, weight=weight).wait()
            delta.copy_(self.split.gather(part, self.numel))  # every process of the worker: the whole average
            sent = b - a
        elif agree is not None:
            committed = agree(partial(self._average_into, delta, group, num_workers, weight))
        elif num_workers > 1:
            self._average_into(delta, group, num_workers, weight)
        norm = float(torch.linalg.vector_norm(delta)) if committed else math.nan
        norm, local_sq = self.split.whole_norms(norm, local_sq, self.device)
        skipped = not math.isfinite(norm)
        if not skipped:
            self._step_with(delta)
        del delta
        self.copy_to_params()
        payload = self.reduce.payload_bytes(sent, num_workers)
        return OuterStepResult(norm, payload, time.perf_counter() - start, skipped, local_sq_norm=local_sq)

    def _average_into(self, delta: torch.Tensor, group, num_workers: int, weight: float | None) -> None:
        """Δ ← the instance's (weighted) average of Δ, in place (blocking)."""
        self.reduce.start(delta, group, num_workers, out=delta, weight=weight).wait()

    @torch.no_grad()
    def pseudo_gradient(self) -> torch.Tensor:
        """Δ_w = φ − θ_w, flat float32, in a new buffer (one subtraction per parameter on φ's device; θ on another
        device, `outer_state_device="cpu"`, is copied over first)."""
        delta = torch.empty_like(self.phi, requires_grad=False)
        for out, view, p in zip(self.views_of(delta), self.views, self.params):
            if p.device == out.device:
                torch.sub(view, p.detach(), out=out)
            else:
                out.copy_(p.detach())
                out.neg_().add_(view)
        return delta

    def _step_with(self, grad: torch.Tensor) -> None:
        """The outer SGD on φ with `grad` as its gradient, which φ holds only for the step."""
        self.phi.grad = grad
        try:
            self.optimizer.step()
        finally:
            self.phi.grad = None

    def _flat_params(self) -> torch.Tensor:
        return torch.cat([p.detach().reshape(-1).to(self.device, torch.float32) for p in self.params])

    def _overlapped_step(self, group, num_workers: int, weight: float | None = None) -> OuterStepResult:
        """Eager update (`outer/eager.py`): wait for last round's average and apply it to φ, apply this worker's fresh Δ to
        its offset, then start this round's average in the background and return (θ ← φ + o)."""
        start = time.perf_counter()
        local = self.start_point().sub_(self._flat_params())
        norm, skipped = self._apply_pending()
        local_finite = bool(torch.isfinite(local).all())
        # A non-finite Δ is still sent (the instance skips its average next round, as a blocking step would now);
        # this worker's offset takes zeros instead.
        self.eager.apply(local if local_finite else torch.zeros_like(local), num_workers, share=weight)
        self.pending = self.reduce.start(local, group, num_workers, background=True, weight=weight)
        self.copy_to_params()
        payload = self.reduce.payload_bytes(self.numel, num_workers)
        return OuterStepResult(norm, payload, time.perf_counter() - start, skipped, local_finite)

    def _apply_pending(self) -> tuple[float, bool]:
        """Wait for the average in flight and step φ with it: (its norm, whether it was skipped); (0, False) if none."""
        if self.pending is None:
            return 0.0, False
        mean = self.pending.wait()
        self.pending = None
        norm = float(torch.linalg.vector_norm(mean))
        skipped = not math.isfinite(norm)
        if not skipped:
            self._step_with(mean.to(self.device, torch.float32))
        return norm, skipped

    @torch.no_grad()
    def settle(self) -> bool:
        """Overlapped: apply the average in flight to φ and drop this worker's offset, so that θ = φ on every worker
        of the instance (before a merge and at the end of training). Streaming: apply the fragment average in flight
        and put θ ← φ (an elastic resume; a merge and the end of training sync every fragment first,
        `StreamingSync.flush`). Returns whether the average was skipped."""
        if self.streaming is not None:
            return self.streaming.settle(drop_local=True)
        if self.eager is None:
            return False
        _, skipped = self._apply_pending()
        self.eager.clear()
        self.copy_to_params()
        return skipped

    def state_dict(self) -> dict:
        """φ and momentum; with compression the residual; overlapped, the offset and the average in flight (waited
        for here, and saved unapplied: the resumed run applies it where this one would have)."""
        pending = None if self.pending is None else self.pending.wait().detach().cpu().clone()
        return {
            "phi": self.phi.detach().cpu().clone(),
            "momentum": None if self.momentum is None else self.momentum.detach().cpu().clone(),
            "error_feedback": self.reduce.state_dict(),
            "eager": None if self.eager is None else self.eager.state_dict(),
            "pending": pending,
            "fragments": None if self.streaming is None else self.streaming.state_dict(),
        }

    def load_state_dict(self, state: dict) -> None:
        if state["phi"].numel() != self.numel:
            raise ValueError(
                f"the saved global weights have {state['phi'].numel()} elements but the model has {self.numel}"
            )
        self.load_flat(state["phi"], state["momentum"])
        self.reduce.load_state_dict(state.get("error_feedback"))
        pending = state.get("pending")
        self.pending = None if pending is None else PendingMean.done(pending.to(self.device, torch.float32))
        if self.eager is not None:
            self.eager.load_state_dict(state.get("eager"))
        elif self.pending is not None:  # saved overlapped, resumed blocking: apply the average, drop the offset
            self._apply_pending()
        if self.streaming is not None:
            self.streaming.load_state_dict(state.get("fragments"))

    def restore_params(self) -> None:
        """θ as a checkpoint left it (after `load_state_dict`): φ (+ the eager offset), or with fragments this
        process's own weights, which differ from φ between syncs."""
        if self.streaming is not None:
            self.streaming.restore_params()
        else:
            self.copy_to_params()

    def reset_error_feedback(self) -> None:
        """Forget every compression residual (this worker's ring changed: a merge, an elastic resume)."""
        self.reduce.reset_error_feedback()
        if self.streaming is not None:
            self.streaming.reset_error_feedback()
