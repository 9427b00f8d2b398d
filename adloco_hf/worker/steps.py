"""The worker during a round's inner steps: the batch plan, how each step is cut, and what it measures.

The Trainer asks before every inner step how to run it (`plan_step`: switch mode's micro-batches and where the
step's gradient statistics come from) and hands its loss, samples and tokens back after it (`finish_step`); the
round's tally collects them for the round's end. With `batch_size_target="goodput"` the tally also collects how long
the step's forward/backward passes took (`plan_step` to `finish_step`) and the rest of the step (to `close_step`,
after the optimizer step): the goodput rule's throughput model (`batch/throughput.py`).
"""

import time

import torch

from ..batch.grad_stats import adam_root_preconditioner
from ..batch.lr_scaling import ADAM_RULES, apply_adam_scaling, apply_lr_factor, lr_factor
from ..batch.size_tests import GradientStatistics
from ..batch.switch_mode import Statistics, StepPlan, plan_batch, plan_step
from ..common.rng import set_rng_state
from ..rounds.decision import used_per_worker


__all__ = ["InnerSteps"]


class InnerSteps:
    """The inner-step calls of [`Worker`] (a part of it, which holds the state they read)."""

    def _apply_plan(self) -> None:
        """The batch of this worker's next round: to the sampler, and to the learning rate if it follows the batch.

        The request runs as switch mode plans it; with `worker_batch_split="speed"` this worker draws its share of
        the instance's total instead, whole (accumulated in micro-batches above `max_batch_size`). The learning rate
        follows the request, the same on every worker of the instance: their pseudo-gradients then have the same
        expected size, and weighting them by samples (`sample_weight`) weighs each by the inverse of its noise."""
        # A worker's request is split evenly over its processes (a multiple of processes_per_worker).
        steps, initial, g = self.settings.steps, self.settings.initial_batch_size, self.processes_per_worker
        requested = plan_batch(self.instance.batch_size // g, self.max_batch_size, steps.switch_threshold)
        share = self._share(g * requested.batch_size)
        self.plan = (
            requested if share == g * requested.batch_size else plan_batch(share // g, self.max_batch_size, 1.0)
        )
        self._sampler.batch_size = self.plan.batch_size
        if steps.lr_batch_scaling != "none":
            factor = lr_factor(steps.lr_batch_scaling, requested.batch_size, initial)
            apply_lr_factor(self._optimizer, self._scheduler, self._base_lrs, factor)
        if steps.lr_batch_scaling in ADAM_RULES:
            apply_adam_scaling(self._optimizer, self._base_adam, requested.batch_size, initial)

    def _share(self, used: int) -> int:
        """This worker's samples per inner step when its instance's request runs as `used` per worker."""
        inst = self.instance
        return inst.split(used)[inst.workers.index(self.worker_id)]

    def sample_weight(self) -> float | None:
        """This worker's weight in its instance's average of pseudo-gradients: the samples it trains in the round
        over all of the instance's (its share of the total; every worker runs the round's H inner steps). None while
        the instance's workers train equal batches: the plain mean, computed as before."""
        inst = self.instance
        split = inst.split(used_per_worker(inst.batch_size, self.rules))
        if len(set(split)) == 1:
            return None
        return split[inst.workers.index(self.worker_id)] / sum(split)

    def is_round_end(self, step: int) -> bool:
        """Whether the round ends after `step` inner steps: at every multiple of the round's H (which divides
        `max_inner_steps`, and so every save and evaluation step), or at max_steps (the last round may be short)."""
        return step % self.inner_steps == 0 or step >= self.max_steps

    def steps_to_round_end(self, step: int) -> int:
        """Inner steps from `step` to the end of its round (0 at a round's end)."""
        if step == self.last_synced_step:
            return 0
        next_end = min(-(-step // self.inner_steps) * self.inner_steps, self.max_steps)
        return next_end - step

    def sync_fragments(self, step: int) -> None:
        """Streaming DiLoCo (`num_fragments`), after every inner step on every rank: the fragment average due now is
        applied and the fragment due is sent (`outer/streaming_diloco.py`; fragment 0 is the round end's). A skipped average
        (non-finite) leaves clean inner-optimizer moments, as a skipped round does. Nothing without fragments."""
        streaming = self.global_model.streaming
        if streaming is None:
            return
        self.replica.reshard(self._model)  # FSDP: the fragments are read from and written into the shards
        inst = self.instance
        skipped = streaming.after_step(
            step,
            offset=step - self.last_synced_step,
            inner_steps=self.inner_steps,
            group=self.outer_groups.get(self.process_groups.cross(inst.workers)),
            num_workers=len(inst.workers),
        )
        if skipped:
            self._clean_inner_optimizer()

    def plan_step(self, step: int, batch: int) -> StepPlan:
        """How to run the inner step about to start (0-based `step`) on a batch of `batch` samples."""
        if self._rng_to_restore is not None:
            set_rng_state(self._rng_to_restore)  # the first step after a resume draws what the saved run would have
            self._rng_to_restore = None
        self._speed_started = time.perf_counter()
        if self.settings.steps.time_steps:
            self._step_started, self._passes_done = self._now(), None
        return plan_step(
            batch,
            self.plan,
            measure=self.settings.steps.batch_size_test != "none" and self.collector is not None,
            last_of_round=self.is_round_end(step + 1),
            next_last_of_round=self.is_round_end(step + 2),
            has_previous=self.collector is not None and self.collector.has_previous,
        )

    def step_trained(self) -> None:
        """The inner step's optimizer step is done: its time since `plan_step` (forward, backward, the optimizer
        step; not the data loading nor the callbacks of the step's end, which may wait for other workers) counts
        towards this worker's speed in the round (`WorkerReport.step_seconds`)."""
        if self._speed_started is not None:
            self._tally.seconds += time.perf_counter() - self._speed_started
            self._speed_started = None

    def local_gradient_step(self, step: int) -> bool:
        """Whether the inner step about to start (0-based `step`) must keep this process's own gradient until
        `sync_gradients` (DDP with processes_per_worker > 1): the steps whose gradient statistics or remembered
        gradient are read. Decided from the step and the plan only, identical on the worker's processes (a process
        that synced while another did not would hang DDP)."""
        measures = self.settings.steps.batch_size_test != "none"
        if not self.replica.keeps_local_gradients or not measures or self.collector is None:
            return False
        one_sample = self.plan.batch_size == 1 and not self.plan.accumulates
        return self.is_round_end(step + 1) or (one_sample and self.is_round_end(step + 2))

    def sync_gradients(self) -> None:
        """The worker's mean gradient from its processes' own (after a `local_gradient_step`): every process of the
        worker ends with the same `.grad`, the one DDP would have computed."""
        self.replica.sync_gradients(self._trainable())

    def start_statistics(self, chunk_weights: list[float]) -> None:
        """The step's chunks are about to run as statistics groups with these weights (summing to 1)."""
        self.collector.start(chunk_weights, self._root_preconditioner())

    def _root_preconditioner(self) -> list[torch.Tensor] | None:
        """√P of `noise_preconditioner="adam"` now (None: the Euclidean metric, or no second moments yet)."""
        if self.settings.steps.noise_preconditioner != "adam":
            return None
        return adam_root_preconditioner(self._optimizer, self.collector.params)

    def begin_chunk(self, index: int) -> None:
        self.collector.begin_chunk(index)

    def finish_step(self, plan: StepPlan, loss: torch.Tensor, samples: int, tokens: torch.Tensor | int) -> None:
        """Close a step: its statistics (if it measured any), and its loss, samples and tokens for the round."""
        if self.settings.steps.time_steps and self._step_started is not None:
            self._passes_done = self._now()
            # The statistics step of a plan that does not accumulate ran its batch as two halves: another pass size.
            split = plan.statistics is Statistics.SPLIT and plan.accumulates and not self.plan.accumulates
            self._tally.add_passes(self._passes_done - self._step_started, plan.chunk_sizes, split=split)
            self._step_started = None
        if plan.statistics is not Statistics.NONE or plan.remember_gradient:
            scale = self._loss_scale()
            root = self._root_preconditioner() if plan.statistics is not Statistics.NONE else None
            if plan.statistics is Statistics.SPLIT and self.collector.active:
                measured = self.replica.statistics_samples(samples)
                self._tally.stats = self.collector.finish(samples=measured, loss_scale=scale)
            elif plan.statistics is Statistics.PREVIOUS:
                self._tally.stats = self.collector.finish_with_previous(loss_scale=scale, root_preconditioner=root)
            adam = self.settings.steps.noise_preconditioner == "adam"
            if plan.statistics is not Statistics.NONE and adam and root is None:
                self._tally.stats = None  # before Adam's first step there is no metric to measure in
            if plan.remember_gradient:
                self.collector.remember(loss_scale=scale)
        self._tally.add_step(loss, samples, tokens)

    def close_step(self) -> None:
        """The inner step has ended (after its optimizer step): with `batch_size_target="goodput"`, the seconds since
        its passes ended count as the step's own cost (ω of the throughput model)."""
        if self.settings.steps.time_steps and self._passes_done is not None:
            self._tally.add_step_rest(self._now() - self._passes_done)
            self._passes_done = None

    def _now(self) -> float:
        """The step timings' clock; on CUDA once the kernels queued so far have run (the host runs ahead of the
        device otherwise, and a pass would be charged to whichever later call waits for it)."""
        if self.settings.device.type == "cuda":
            torch.cuda.synchronize(self.settings.device)
        return self.clock()

    @property
    def round_statistics(self) -> GradientStatistics | None:
        """The gradient statistics this worker measured in the current round (None until its statistics step)."""
        return self._tally.stats

    def _loss_scale(self) -> float:
        scaler = self._scaler
        return float(scaler.get_scale()) if scaler is not None and scaler.is_enabled() else 1.0
