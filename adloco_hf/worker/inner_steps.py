"""`InnerSteps`: how a worker runs one inner step under its round's plan, and what the step leaves for the round.

The Trainer hands each inner step over whole (`Worker.train_step`): its batch, and its own forward/backward as a
[`StepPasses`] to run on every chunk. The step is cut as switch mode planned the round (`plan.process`), or into two
halves on the round's last step for the gradient statistics (`batch.switch_mode.plan_step`); the statistics hooks
see each chunk's gradient (`batch/grad_stats.py`); inside a worker of several processes (DDP) the chunks before the
last one skip DDP's all-reduce, and on a statistics step every process keeps its own gradient until the statistics
are read, then averages it as DDP would have (`replica.sync_gradients`). The step's loss, samples, tokens and
statistics go into the round's tally; its timings into the tally through the worker's [`Clock`].
"""

import contextlib
from typing import Any, Protocol

import torch

from ..batch.grad_stats import GradientStatisticsCollector, adam_root_preconditioner
from ..batch.size_tests import GradientStatistics
from ..batch.switch_mode import Statistics, StepPlan, plan_step
from ..common.clock import Clock
from ..common.inputs import batch_length, split_inputs
from ..common.rng import set_rng_state
from ..rounds.tally import RoundTally
from .replicas.replica import ReplicaParallel
from .round_state import RoundState
from .settings import StepSettings
from .training import TrainingObjects


__all__ = ["InnerSteps", "StepPasses"]


class StepPasses(Protocol):
    """The Trainer's side of an inner step (`trainer/inner_step.py`): what the worker calls, never the Trainer."""

    model: torch.nn.Module  # the model as the step runs it (wrapped in DDP inside a worker of several processes)

    def forward_backward(self, chunk: dict[str, Any], samples: int, batch: int) -> torch.Tensor:
        """Forward and backward of `chunk` (`samples` of the step's `batch` samples); returns its loss."""

    def items(self, chunk: dict[str, Any]) -> float | None:
        """The loss normaliser's items in `chunk` (its label tokens), or None when each chunk's loss is a mean."""

    def tokens(self, inputs: dict[str, Any]) -> torch.Tensor | int:
        """The tokens of the step's batch."""


class InnerSteps:
    """A worker's inner steps inside a round: the step's plan, statistics, tally and timings (module docstring).

    Args:
        settings: the inner steps' settings.
        training: the model, optimizer and scaler the steps train.
        replica: how the worker's processes hold the replica (DDP's `no_sync`, local gradients, statistics).
        rounds: the rounds' state: this worker's plan and where the round ends.
        clock: the clock of the step timings.
    """

    def __init__(
        self,
        settings: StepSettings,
        training: TrainingObjects,
        replica: ReplicaParallel,
        rounds: RoundState,
        clock: Clock,
    ):
        self.settings = settings
        self.training = training
        self.replica = replica
        self.rounds = rounds
        self.clock = clock
        self.collector = GradientStatisticsCollector(
            training.model.parameters(), inner_products=settings.batch_size_test in INNER_PRODUCT_TESTS
        )
        self.collector.sum_group = replica.statistics_group
        self.tally = RoundTally()
        self.rng_to_restore: dict[str, Any] | None = None  # a checkpoint's random state, drawn by the next step
        self._started: float | None = None  # the clock when the current step's passes started
        self._passes_ended: float | None = None
        self._stepped: float | None = None  # ... and when its optimizer step ended
        # The step's time for this worker's speed ends with its optimizer step, before any callback of the step's end
        # (one might wait for other workers): a hook of the optimizer itself marks it.
        inner = getattr(training.optimizer, "optimizer", training.optimizer)  # accelerate's wrapper holds it
        hook = getattr(inner, "register_step_post_hook", None)
        self._hook = None if hook is None else hook(self._optimizer_stepped)

    # ---- one step ----
    def run(self, step: int, inputs: dict[str, Any], passes: StepPasses) -> torch.Tensor:
        """Run the inner step about to start (0-based `step`) on `inputs`; returns its loss."""
        if self.rng_to_restore is not None:
            set_rng_state(self.rng_to_restore)  # the first step after a resume draws what the saved run would have
            self.rng_to_restore = None
        batch = batch_length(inputs)
        plan = self._plan(step, batch)
        local = self._keeps_local_gradients(step)
        self._started = self.clock.now()
        self.clock.passes(plan.chunk_sizes)
        with self.replica.no_sync(passes.model) if local else contextlib.nullcontext():
            loss = self._run_chunks(plan, inputs, passes, synced=not local)
        self._finish(plan, loss, batch, passes.tokens(inputs))
        if local:
            self.replica.sync_gradients(self.training.trainable())
        return loss

    def _plan(self, step: int, batch: int) -> StepPlan:
        """How the step is cut, and where its gradient statistics come from."""
        is_round_end = self.rounds.is_round_end
        return plan_step(
            batch,
            self.rounds.plan.process,
            measure=self.settings.batch_size_test != "none",
            last_of_round=is_round_end(step + 1),
            next_last_of_round=is_round_end(step + 2),
            has_previous=self.collector.has_previous,
        )

    def _keeps_local_gradients(self, step: int) -> bool:
        """Whether the step keeps this process's own gradient until `sync_gradients` (DDP with several processes per
        worker): the steps whose gradient statistics or remembered gradient are read. Decided from the step and the
        plan only, identical on the worker's processes (a process that synced while another did not would hang)."""
        if not self.replica.keeps_local_gradients or self.settings.batch_size_test == "none":
            return False
        process = self.rounds.plan.process
        one_sample = process.batch_size == 1 and not process.accumulates
        return self.rounds.is_round_end(step + 1) or (one_sample and self.rounds.is_round_end(step + 2))

    def _run_chunks(self, plan: StepPlan, inputs: dict[str, Any], passes: StepPasses, *, synced: bool) -> torch.Tensor:
        """Forward/backward each chunk inside one optimizer step; the gradient equals the whole batch's. Every chunk
        but the last skips DDP's all-reduce when the step is `synced` (the last one all-reduces the sum)."""
        sizes = list(plan.chunk_sizes)
        if len(sizes) == 1:
            return passes.forward_backward(inputs, sizes[0], sizes[0])
        chunks = split_inputs(inputs, sizes)
        batch = sum(sizes)
        weights = self._statistics_weights(plan, chunks, sizes, passes)
        if weights is not None:
            self.collector.start(weights, self._root_preconditioner())
        total = None
        for index, (chunk, size) in enumerate(zip(chunks, sizes)):
            if weights is not None:
                self.collector.begin_chunk(index)
            last = index == len(sizes) - 1
            with contextlib.nullcontext() if last or not synced else self.replica.no_sync(passes.model):
                loss = passes.forward_backward(chunk, size, batch)
            total = loss if total is None else total + loss
        return total

    def _statistics_weights(
        self, plan: StepPlan, chunks: list[dict[str, Any]], sizes: list[int], passes: StepPasses
    ) -> list[float] | None:
        """The chunks' shares of the loss normaliser on a statistics step (of its items when the model normalises by
        them, else of its samples); None on any other step, or when no chunk holds an item."""
        if plan.statistics is not Statistics.SPLIT:
            return None
        counts = [passes.items(chunk) for chunk in chunks]
        if counts[0] is None:
            return [n / sum(sizes) for n in sizes]
        return [c / sum(counts) for c in counts] if sum(counts) > 0 else None

    def _finish(self, plan: StepPlan, loss: torch.Tensor, samples: int, tokens: torch.Tensor | int) -> None:
        """Close the step's passes: their timing, the statistics (if the step measured any), its loss and counts."""
        self._passes_ended = self.clock.now()
        if self.settings.time_steps:  # batch_size_target="goodput": the throughput model's pass timings
            # The statistics step of a plan that does not accumulate ran its batch as two halves: another pass size.
            split = plan.statistics is Statistics.SPLIT and plan.accumulates and not self.rounds.plan.accumulates
            self.tally.add_passes(self._passes_ended - self._started, plan.chunk_sizes, split=split)
        self.clock.step_rest()
        if plan.statistics is not Statistics.NONE or plan.remember_gradient:
            self._statistics(plan, samples)
        self.tally.add_step(loss, samples, tokens)

    def _statistics(self, plan: StepPlan, samples: int) -> None:
        collector, scale = self.collector, self.training.loss_scale()
        root = self._root_preconditioner() if plan.statistics is not Statistics.NONE else None
        if plan.statistics is Statistics.SPLIT and collector.active:
            measured = self.replica.statistics_samples(samples)
            self.tally.stats = collector.finish(samples=measured, loss_scale=scale)
        elif plan.statistics is Statistics.PREVIOUS:
            self.tally.stats = collector.finish_with_previous(loss_scale=scale, root_preconditioner=root)
        adam = self.settings.noise_preconditioner == "adam"
        if plan.statistics is not Statistics.NONE and adam and root is None:
            self.tally.stats = None  # before Adam's first step there is no metric to measure in
        if plan.remember_gradient:
            collector.remember(loss_scale=scale)

    def _root_preconditioner(self) -> list[torch.Tensor] | None:
        """√P of `noise_preconditioner="adam"` now (None: the Euclidean metric, or no second moments yet)."""
        if self.settings.noise_preconditioner != "adam":
            return None
        return adam_root_preconditioner(self.training.optimizer, self.collector.params)

    def _optimizer_stepped(self, optimizer, args, kwargs) -> None:
        if self._started is not None and self._stepped is None:
            self._stepped = self.clock.now()

    def step_ended(self) -> None:
        """The inner step has ended (its optimizer step and scheduler ran): its seconds up to the optimizer step
        count towards this worker's speed in the round (`worker_batch_split="speed"`), and the seconds since its
        passes ended are the step's own cost (ω of the goodput rule's throughput model)."""
        if self._started is None:
            return
        now = self.clock.now()
        self.tally.seconds += (self._stepped if self._stepped is not None else now) - self._started
        if self.settings.time_steps:
            self.tally.add_step_rest(now - self._passes_ended)
        self._started = self._passes_ended = self._stepped = None

    def detach(self) -> None:
        """Remove the optimizer's hook (a later `train()` makes new inner steps around the same optimizer)."""
        if self._hook is not None:
            self._hook.remove()
            self._hook = None

    # ---- the round ----
    @property
    def round_statistics(self) -> GradientStatistics | None:
        """The gradient statistics this worker measured in the current round (None until its statistics step)."""
        return self.tally.stats

    def new_round(self) -> None:
        self.tally = RoundTally()

    def state_dict(self, part: list[torch.Tensor]) -> dict[str, Any] | None:
        """The round so far, with this process's weights `part` (None at a round's end: nothing to carry)."""
        return self.tally.state_dict(part, self.collector)

    def load_state_dict(self, state: dict[str, Any] | None, part: list[torch.Tensor]) -> None:
        if state is not None:
            self.tally = RoundTally.restore(state, part, self.collector)


INNER_PRODUCT_TESTS = ("inner_product", "augmented_inner_product")
