"""`AdLoCoCallback`: hands the Trainer's events to AdLoCo (training begins, a step ends, training ends).

`AdLoCoTrainer` adds it itself, right after the Trainer's flow callback and before reporting and user callbacks, so
at a round's end they see the synchronised weights and the round's totals. Users never need to construct it.
"""

from collections.abc import Callable

from transformers import TrainerCallback


__all__ = ["AdLoCoCallback"]


class AdLoCoCallback(TrainerCallback):
    """Calls `start` when training begins, `step_end` at the end of every inner step, and `end` when training ends.

    Args:
        start: sets up this process's worker (instance, φ, batch plan).
        step_end: ends the step (its timing, a fragment sync), and the round when the step was its last.
        end: finishes a round cut short, merges the instances, saves, evaluates and pushes the merged model.
    """

    def __init__(self, *, start: Callable[[], None], step_end: Callable[[], None], end: Callable[[], None]):
        self._start, self._step_end, self._end = start, step_end, end

    def on_train_begin(self, args, state, control, **kwargs):
        self._start()

    def on_step_end(self, args, state, control, **kwargs):
        self._step_end()

    def on_train_end(self, args, state, control, **kwargs):
        self._end()
