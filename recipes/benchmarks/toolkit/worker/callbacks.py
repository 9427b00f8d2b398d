"""The worker's callbacks: the token and seconds budgets that end training at a round's end, the clock of the inner
steps, and a mark at every round's end (what `links` cuts into per-round figures)."""

import time

import torch
import torch.distributed as dist
from transformers import TrainerCallback

from adloco_hf import AdLoCoTrainer
from recipes.benchmarks.toolkit.worker.trainers import BenchAdLoCoTrainer, BenchmarkMixin


__all__ = ["RoundMarks", "StepClock", "TimeBudgetStop", "TokenBudgetStop", "VirtualRounds"]


class TokenBudgetStop(TrainerCallback):
    """Stops AdLoCo at the end of the first round whose cumulative training tokens (all instances) reach the budget.

    Added with `trainer.add_callback`, so it runs after AdLoCo's own `on_step_end` has closed the round: at a round's
    last step `trainer.adloco_state` already counts that round (`last_round_step` is this step, `tokens` includes it).
    """

    def __init__(self, trainer: AdLoCoTrainer, budget: int):
        self.trainer, self.budget = trainer, budget

    def on_step_end(self, args, state, control, **kwargs):
        adloco = self.trainer.adloco_state
        if adloco.last_round_step == state.global_step and adloco.tokens >= self.budget:
            control.should_training_stop = True


class TimeBudgetStop(TrainerCallback):
    """Stops training at the end of the first round (every `every` steps) once `budget` seconds of training have
    passed (evaluations excluded). Every worker decides from the slowest one's clock (an all-reduce of one flag per
    round), so all stop at the same step."""

    def __init__(self, trainer: BenchmarkMixin, budget: float, every: int, is_round_end=None):
        self.trainer, self.budget, self.every, self.is_round_end = trainer, budget, every, is_round_end
        self.stopped_at: int | None = None

    def on_step_end(self, args, state, control, **kwargs):
        trainer = self.trainer
        end = self.is_round_end() if self.is_round_end else state.global_step % self.every == 0
        if not end or trainer.bench_start_time is None:
            return
        seconds = time.perf_counter() - trainer.bench_start_time - trainer.bench_eval_seconds
        shared = dist.is_initialized() and dist.get_world_size() > 1
        device = "cpu" if not shared or dist.get_backend() == "gloo" else args.device
        flag = torch.tensor([1.0 if seconds >= self.budget else 0.0], device=device)
        if shared:
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        if flag.item() > 0:
            control.should_training_stop = True
            self.stopped_at = state.global_step


class StepClock(TrainerCallback):
    """The seconds this worker spent in inner steps: from `on_step_begin` to its `on_step_end`, which runs first in
    the callback list (inserted at 0), before AdLoCo's ends the round. Forward, backward (switch mode's micro-batches
    and the statistics step's halves included), clipping and the optimizer step; data loading, the round's end (outer
    step, the round-end all-gather, merges) and evaluations are outside."""

    def __init__(self):
        self.seconds, self.steps, self._start = 0.0, 0, None

    def on_step_begin(self, args, state, control, **kwargs):
        self._start = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
        if self._start is not None:
            self.seconds += time.perf_counter() - self._start
            self.steps += 1
            self._start = None


class RoundMarks(TrainerCallback):
    """At the end of every round (added last, so after AdLoCo's `on_step_end` closed the round): `[global_step,
    training seconds since the start, evaluation seconds so far, inner-step seconds so far]` on this worker. The
    Trainer evaluates after `on_step_end`, so an evaluation at a round's end falls in the next mark's interval."""

    def __init__(self, trainer: BenchAdLoCoTrainer, clock: StepClock):
        self.trainer, self.clock, self.marks = trainer, clock, []

    def on_step_end(self, args, state, control, **kwargs):
        trainer = self.trainer
        if trainer.adloco_state.last_round_step == state.global_step and trainer.bench_start_time is not None:
            seconds = time.perf_counter() - trainer.bench_start_time
            self.marks.append([state.global_step, seconds, trainer.bench_eval_seconds, self.clock.seconds])


class VirtualRounds(TrainerCallback):
    """With a virtual clock (`toolkit/clock/virtual_clock.py`), at the end of every round (added after AdLoCo's callback,
    so the round, its outer step and any merge are priced): every worker's seconds become the slowest worker's on
    every link (one all-reduce of the clock's seconds, as the round end waits for the slowest), the round's end is
    recorded, and training stops once every link has reached its `budget` of virtual seconds (None: no budget)."""

    def __init__(self, trainer: BenchAdLoCoTrainer, clock, budget: list[float] | None):
        self.trainer, self.clock, self.budget = trainer, clock, budget
        self.ends: list[list[float]] = []  # per round: [global step, virtual seconds on each link]
        self.stopped_at: int | None = None

    def on_step_end(self, args, state, control, **kwargs):
        if self.trainer.adloco_state.last_round_step != state.global_step:
            return
        shared = dist.is_initialized() and dist.get_world_size() > 1
        device = "cpu" if not shared or dist.get_backend() == "gloo" else args.device
        seconds = torch.tensor(self.clock.seconds, dtype=torch.float64, device=device)
        if shared:
            dist.all_reduce(seconds, op=dist.ReduceOp.MAX)
        self.clock.align(seconds.tolist())
        self.ends.append([state.global_step, *self.clock.seconds])
        if self.budget is not None and all(s >= b for s, b in zip(self.clock.seconds, self.budget)):
            control.should_training_stop = True
            self.stopped_at = state.global_step
