"""How an instance averages its workers' pseudo-gradients: in `pseudo_grad_dtype`, or as int8 / int4 blocks.

`PseudoGradReduce.start(delta, group, num_workers)` begins the average and returns a `PendingMean`; `wait()` gives
the float32 mean, identical on every worker of the group. Blocking outer steps wait at once; an overlapped outer step
(`outer_overlap`) waits one round later, while the next round's inner steps run.

- `"none"`: an all-reduce in `pseudo_grad_dtype` (bucketed, `async_op=True`: gloo and NCCL run it in their own
  threads and streams, so nothing of ours runs while it is in flight).
- `"int8"` / `"int4"`: `compressed_ring.ring_all_reduce_mean` with this worker's `ErrorFeedback`. The ring is a
  sequence of point-to-point exchanges with quantization in between, so in the background it runs on a daemon
  thread of its own (on a CUDA device, on a side stream, so the compute stream never waits for it).

A group of one sends nothing and its mean is the input (no quantization, the residual untouched).

A weighted mean Σ_r w_r Δ_r (`weight` = this worker's w_r, the weights summing to 1 over the group: workers that
trained different numbers of samples, `worker_batch_split="speed"`) is the same sum with each worker's term scaled
before it is sent: w_r Δ_r in place of Δ_r / M in the dtype all-reduce, and M w_r Δ_r in place of Δ_r in the
compressed ring, whose sum / M is then Σ_r w_r Δ_r exactly as its plain mean was Σ_r Δ_r / M: the ring itself
does not change (its error bound holds for the scaled inputs x_r = M w_r Δ_r). With error feedback a worker's
residual is what its quantizations dropped of the scaled values, in the units of M × the mean, and it is added to
the next round's scaled values, where it enters the mean with the same 1 / M as the values it was dropped from:
over the rounds, the means sent plus Σ_r residual_r / M still equal Σ_rounds Σ_r w_r Δ_r, whatever the weights of
each round. Without a weight (equal shares) nothing is scaled and the result is bit for bit the plain mean.
"""

import threading
from collections.abc import Callable

import torch
import torch.distributed as dist

from ..common.distributed import comm_device
from .compression import ErrorFeedback, wire_bytes
from .ring import ring_all_reduce_mean


__all__ = ["BITS", "BUCKET_NUMEL", "PendingMean", "PseudoGradReduce", "ring_all_reduce_bytes"]

BITS = {"none": None, "int8": 8, "int4": 4}
# Elements per all-reduce bucket: bounds the low-precision copy made for communication (64 MiB in bf16).
BUCKET_NUMEL = 1 << 25


def ring_all_reduce_bytes(payload_bytes: int, num_workers: int) -> int:
    """Bytes all workers together send in a ring all-reduce: each sends 2 (M − 1) / M of the payload."""
    return 2 * (num_workers - 1) * payload_bytes


class PendingMean:
    """An average in flight. `wait()` returns it (float32, the input's device) and may be called again."""

    def __init__(self, finish: Callable[[], torch.Tensor], thread: threading.Thread | None = None):
        self._finish = finish
        self._thread = thread
        self._result: torch.Tensor | None = None

    @classmethod
    def done(cls, mean: torch.Tensor) -> "PendingMean":
        """An average that is already known (a group of one, or one restored from a checkpoint)."""
        pending = cls(lambda: mean)
        pending.wait()  # nothing to wait for: the mean is its result at once
        return pending

    def wait(self) -> torch.Tensor:
        if self._result is None:
            if self._thread is not None:
                self._thread.join()
            self._result = self._finish()
        return self._result


class PseudoGradReduce:
    """The instance average of pseudo-gradients, with this worker's error-feedback residual when compressing.

    Args:
        compression: `"none"`, `"int8"` or `"int4"` (`AdLoCoConfig.pseudo_grad_compression`).
        dtype: the all-reduce's precision when not compressing (`pseudo_grad_dtype`).
        block_size: values per scale when compressing.
    """

    def __init__(self, compression: str = "none", *, dtype: torch.dtype = torch.bfloat16, block_size: int = 256):
        if compression not in BITS:
            raise ValueError(f"pseudo_grad_compression={compression!r}: choose one of {list(BITS)}")
        self.compression = compression
        self.bits = BITS[compression]
        self.dtype = dtype
        self.block_size = block_size
        self.error_feedback = None if self.bits is None else ErrorFeedback(self.bits, block_size)

    def payload_bytes(self, numel: int, num_workers: int) -> int:
        """What one worker contributes, in the ring model (`outer.ring_all_reduce_bytes`); 0 for a group of one."""
        if num_workers <= 1:
            return 0
        if self.bits is None:
            return numel * torch.empty((), dtype=self.dtype).element_size()
        return wire_bytes(numel, bits=self.bits, block_size=self.block_size)

    def start(
        self,
        delta: torch.Tensor,
        group,
        num_workers: int,
        *,
        background: bool = False,
        out: torch.Tensor | None = None,
        weight: float | None = None,
    ) -> PendingMean:
        """Begin averaging `delta` (flat float32) over `group`. With `background`, a compressed ring runs on its own
        thread; the dtype all-reduce is asynchronous either way. `delta` is read before this returns (dtype) or by the
        ring (compressed: leave it alone until `wait`); the mean is written to `out` when given (it may be `delta`
        for a blocking call), else to a new tensor. `weight`: this worker's weight in a weighted mean (module
        docstring); None for the plain mean."""
        if num_workers <= 1:
            return PendingMean.done(delta.detach().clone() if out is None else out.copy_(delta))
        if self.bits is None:
            return self._all_reduce(delta, group, num_workers, out, weight)
        if weight is not None:
            delta = delta * (num_workers * weight)  # a new tensor: the ring may read it after this returns
        if out is not None:
            ring = self._ring(delta, group, background)
            return PendingMean(lambda: out.copy_(ring.wait()), ring._thread)
        return self._ring(delta, group, background)

    def _all_reduce(
        self, delta: torch.Tensor, group, num_workers: int, out: torch.Tensor | None, weight: float | None
    ) -> PendingMean:
        device = comm_device(delta.device)
        pending = []
        for start in range(0, delta.numel(), BUCKET_NUMEL):
            # Divided (or weighted) before the cast, so float16 sums cannot overflow; always a new tensor, so delta
            # is left alone.
            part = delta[start : start + BUCKET_NUMEL]
            buffer = (part / num_workers if weight is None else part * weight).to(device=device, dtype=self.dtype)
            pending.append((start, buffer, dist.all_reduce(buffer, group=group, async_op=True)))

        def finish() -> torch.Tensor:
            mean = torch.empty_like(delta, dtype=torch.float32) if out is None else out
            for start, buffer, work in pending:
                work.wait()
                mean[start : start + buffer.numel()].copy_(buffer)
            return mean

        return PendingMean(finish)

    def _ring(self, delta: torch.Tensor, group, background: bool) -> PendingMean:
        def run() -> torch.Tensor:
            return ring_all_reduce_mean(
                delta, group, bits=self.bits, block_size=self.block_size, error_feedback=self.error_feedback
            ).mean

        if not background:
            mean = run()
            return PendingMean.done(mean)
        box: dict[str, object] = {}
        stream = torch.cuda.Stream(delta.device) if delta.device.type == "cuda" else None

        def target() -> None:
            try:
                if stream is None:
                    box["mean"] = run()
                else:
                    with torch.cuda.stream(stream):
                        box["mean"] = run()
                    stream.synchronize()
            except BaseException as error:  # re-raised in the training thread by wait()
                box["error"] = error

        if stream is not None:
            stream.wait_stream(torch.cuda.current_stream(delta.device))  # delta is ready before the side stream reads
        thread = threading.Thread(target=target, name="adloco-outer-ring", daemon=True)
        thread.start()

        def finish() -> torch.Tensor:
            if "error" in box:
                raise box["error"]
            return box["mean"]

        return PendingMean(finish, thread)

    def reset_error_feedback(self) -> None:
        """Forget the residual (this worker's instance changed: the residual belonged to the old ring)."""
        if self.error_feedback is not None:
            self.error_feedback.residual = None

    def state_dict(self) -> dict | None:
        return None if self.error_feedback is None else self.error_feedback.state_dict()

    def load_state_dict(self, state: dict | None) -> None:
        """Restore the residual; none saved (or compression now off) leaves it empty."""
        if self.error_feedback is not None:
            self.error_feedback.residual = None
            if state is not None:
                self.error_feedback.load_state_dict(state)
