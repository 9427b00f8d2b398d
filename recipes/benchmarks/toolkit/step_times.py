"""Timing a worker's inner steps around AdLoCo's own callback (`overhead`, each of its comparisons): one callback
before it sees the step alone, one after it sees the step with AdLoCo's end-of-round work."""

import time
from collections.abc import Callable

from transformers import TrainerCallback


__all__ = ["StepTimestamps", "timestamp_callbacks"]


class StepTimestamps:
    """Per-step timestamps shared by two callbacks: `begin` and `pre` (the step's end) from the one before AdLoCo's
    callback, `post` from the one after it; this process's CPU time over the timed window."""

    def __init__(self, synchronize: Callable[[], None]):
        self.synchronize = synchronize
        self.begin: dict[int, float] = {}
        self.pre: dict[int, float] = {}
        self.post: dict[int, float] = {}
        self.cpu_begin: float | None = None
        self.cpu_end: float | None = None

    def now(self) -> float:
        self.synchronize()
        return time.perf_counter()


def timestamp_callbacks(clock: StepTimestamps, first_timed_step: int) -> tuple[TrainerCallback, TrainerCallback]:
    """(before, after): insert `before` at the head of the Trainer's callback list, add `after` at its end."""

    class Before(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            clock.begin[state.global_step + 1] = clock.now()
            if state.global_step == first_timed_step - 1:
                clock.cpu_begin = time.process_time()

        def on_step_end(self, args, state, control, **kwargs):
            clock.pre[state.global_step] = clock.now()

    class After(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            clock.post[state.global_step] = clock.now()
            clock.cpu_end = time.process_time()

    return Before(), After()
