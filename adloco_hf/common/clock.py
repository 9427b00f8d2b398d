"""`Clock`: the seconds a worker's timings read, and the hook that lets a benchmark price them instead.

A worker times three things (`worker/inner_steps.py`, `worker/round_end.py`): an inner step's forward/backward
passes, the rest of that step (clipping, the optimizer step, the scheduler, zeroing the gradients) and the round's
outer step. The timings feed the goodput rule's throughput model (`batch_size_target="goodput"`,
`batch/throughput.py`) and each worker's speed (`worker_batch_split="speed"`). Between the two readings of `now()`
that time each of them, the worker announces the work: `passes(chunk_sizes)`, `step_rest()`, `outer_step(...)`.
A merge at a round's end (`worker/merging.py`) is announced too, once its messages have gone: `merge(...)`, with the
bytes every rank sent; it comes after the round's outer step and before the next step's first reading. Before the
first round, the goodput rule's startup profile (`batch/profiling.py`) times passes (announced as an inner step's,
`passes`) and two all-reduces over every worker, each announced once it has run: `all_reduce(...)`.

This clock reads `time.perf_counter()` and ignores the announcements; with `synchronize` (CUDA and the goodput
rule) it waits for the kernels queued so far first, since the host runs ahead of the device and a pass would
otherwise be charged to whichever later call waits for it. A subclass that advances its own time in the
announcements is a *virtual clock*: every decision that reads timings then follows the prices it sets (a device
profile, a link model) instead of the machine the run happens to use, and a run is deterministic for its seed.
Install one before training with `trainer.worker.clock = MyClock()`.

Example:
```python
class FixedPrices(Clock):
    def __init__(self):
        super().__init__()
        self.seconds = 0.0

    def now(self):
        return self.seconds

    def passes(self, chunk_sizes):
        self.seconds += sum(0.01 + 0.002 * n for n in chunk_sizes)

    def step_rest(self):
        self.seconds += 0.005

    def outer_step(self, *, round_number, workers, payload_bytes):
        self.seconds += 2 * (workers - 1) / workers * payload_bytes / 12.5e6  # a ring over 100 Mbit/s

    def merge(self, *, round_number, sent_bytes):
        self.seconds += max(sent_bytes, default=0) / 12.5e6  # the busiest sender's bytes over 100 Mbit/s
```

`recipes/benchmarks/toolkit/clock/virtual_clock.py` is the benchmarks' virtual clock: a device profile for the steps, the
ring model of a link for the outer step, and the busiest sender for a merge.
"""

import contextlib
import time
from collections.abc import Iterator

import torch


__all__ = ["Clock"]


class Clock:
    """The clock of a worker's timings (module docstring).

    Args:
        device: the device whose queued kernels `now` waits for when `synchronize` is set (CUDA only).
        synchronize: wait for the device before every reading.
    """

    def __init__(self, device: torch.device | None = None, synchronize: bool = False):
        self.device = device
        self.synchronize = bool(synchronize and device is not None and device.type == "cuda")

    def now(self) -> float:
        """Seconds, on any fixed origin."""
        if self.synchronize:
            torch.cuda.synchronize(self.device)
        return time.perf_counter()

    def passes(self, chunk_sizes: tuple[int, ...]) -> None:
        """An inner step's forward/backward passes start: one per chunk, of these numbers of samples."""

    def step_rest(self) -> None:
        """The step's passes ended: clipping, the optimizer step and the scheduler start."""

    def outer_step(self, *, round_number: int, workers: int, payload_bytes: int) -> None:
        """The outer step of round `round_number` (1-based) ran among an instance's `workers`, sending a payload of
        `payload_bytes` per worker into the all-reduce (announced after it, before its end is read)."""

    def all_reduce(self, *, workers: int, payload_bytes: int) -> None:
        """An all-reduce of `payload_bytes` per worker over `workers` workers has run (the startup profile's probe of
        the links, announced after it, before its end is read)."""

    @contextlib.contextmanager
    def synchronized(self) -> Iterator[None]:
        """Inside the block every reading waits for the device (CUDA), whatever `synchronize` says: the startup
        profile times passes one by one."""
        saved = self.synchronize
        self.synchronize = self.device is not None and self.device.type == "cuda"
        try:
            yield
        finally:
            self.synchronize = saved

    def merge(self, *, round_number: int, sent_bytes: tuple[int, ...]) -> None:
        """A merge at the end of round `round_number` has sent its messages: `sent_bytes[r]` bytes from global rank
        `r` (every rank, in rank order; the same tuple on every rank). Announced after the round's outer step."""
