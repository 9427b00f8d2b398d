"""The Trainer's side of one inner step: its own forward/backward, handed to the worker to run on each chunk of the
step ([`TrainerPasses`]); the probe step that sizes `max_batch_size="auto"`; and the DDP that joins the processes of
one worker.

These are the Trainer's own steps run differently, not overrides: `trainer/trainer.py` decides when each runs.
"""

from collections.abc import Callable
from typing import Any

import torch
from transformers import Trainer

from ..common.inputs import count_tokens
from ..common.upstream import mark_prepared, trainer_num_items_in_batch
from ..sampling.stream_sampler import AdaptiveStreamSampler


__all__ = ["StartupProbe", "TrainerPasses", "probe_step", "worker_ddp"]


class TrainerPasses:
    """The Trainer's forward/backward of one chunk of an inner step, as the worker runs the step
    (`worker.inner_steps.StepPasses`).

    Args:
        trainer: the Trainer whose loss normalisation the chunks follow.
        step: the Trainer's own `training_step` (forward, backward, loss).
        model: the model as the step runs it.
        num_items_in_batch: the whole batch's items (label tokens), or None.

    With `num_items_in_batch` the model normalises every chunk by the whole batch's count; otherwise the Trainer
    divides each chunk's mean loss by `current_gradient_accumulation_steps`, set here to b / n_j for a chunk of n_j
    of the step's b samples, so that the chunks' gradients add up to the whole batch's.
    """

    def __init__(self, trainer: Trainer, step: Callable, model: torch.nn.Module, num_items_in_batch):
        self.model = model
        self.trainer = trainer
        self.step = step
        self.num_items_in_batch = num_items_in_batch

    def forward_backward(self, chunk: dict[str, Any], samples: int, batch: int) -> torch.Tensor:
        if samples == batch or self.num_items_in_batch is not None:
            return self.step(self.model, chunk, self.num_items_in_batch)
        saved = getattr(self.trainer, "current_gradient_accumulation_steps", 1)
        self.trainer.current_gradient_accumulation_steps = batch / samples
        try:
            return self.step(self.model, chunk, self.num_items_in_batch)
        finally:
            self.trainer.current_gradient_accumulation_steps = saved

    def items(self, chunk: dict[str, Any]) -> float | None:
        if self.num_items_in_batch is None:
            return None
        return float(trainer_num_items_in_batch(self.trainer, chunk, self.trainer.args.device))

    def tokens(self, inputs: dict[str, Any]) -> torch.Tensor | int:
        return count_tokens(inputs, getattr(self.trainer.model, "main_input_name", "input_ids"))


def probe_examples(loader, sampler, size: int, generator: torch.Generator | None = None) -> list:
    """`size` training examples that training does not draw: a fresh part of a stream, or of a map-style dataset
    the first ones (`generator`: random ones, drawn from that generator, not from the training's)."""
    dataset = loader.dataset
    if isinstance(sampler, AdaptiveStreamSampler):
        return sampler.probe_examples(size)  # from a fresh part: no training data is drawn
    if generator is None:
        return [dataset[i % len(dataset)] for i in range(size)]
    return [dataset[int(i)] for i in torch.randint(len(dataset), (size,), generator=generator)]


def probe_step(trainer: Trainer, loader, sampler, size: int, prepare: Callable[[dict], dict]) -> None:
    """Forward and backward on `size` training samples of `loader` (batched by `prepare`: the Trainer's own input
    preparation), gradients cleared after (for max_batch_size='auto')."""
    inputs = prepare(loader.collate_fn(probe_examples(loader, sampler, size)))
    model = trainer.model
    model.train()
    try:
        with trainer.compute_loss_context_manager():
            loss = trainer.compute_loss(model, inputs)
        trainer.accelerator.backward(loss)
    finally:
        model.zero_grad(set_to_none=True)


class StartupProbe:
    """The Trainer's forward/backward on examples training does not draw, for the startup profile
    (`batch/profiling.py`): inputs of any size, and the passes of an inner step over them.

    Args:
        trainer: the Trainer (its `training_step`, input preparation and model).
        loader, sampler: the training loader and its sampler (where the examples come from, left untouched).
        step: the Trainer's own `training_step`.
        prepare: the Trainer's own input preparation (to its device).

    The examples are drawn from a generator of the probe's own, seeded by the run's seed and the process's rank.
    """

    def __init__(self, trainer: Trainer, loader, sampler, step: Callable, prepare: Callable[[dict], dict]):
        self.trainer, self.loader, self.sampler, self.prepare = trainer, loader, sampler, prepare
        self.generator = torch.Generator().manual_seed(hash((trainer.args.seed, trainer.args.process_index)) % 2**31)
        self.passes = TrainerPasses(trainer, step, trainer.model_wrapped, None)

    @property
    def model(self) -> torch.nn.Module:
        return self.passes.model

    def inputs(self, size: int) -> dict[str, Any]:
        examples = probe_examples(self.loader, self.sampler, size, self.generator)
        return self.prepare(self.loader.collate_fn(examples))

    def first_inputs(self) -> dict[str, Any]:
        return self.prepare(self.loader.collate_fn(probe_examples(self.loader, self.sampler, 1)))

    def forward_backward(self, inputs: dict[str, Any], samples: int, batch: int) -> torch.Tensor:
        # Before the first step the Trainer has not set the accumulation its `training_step` divides by: one step.
        missing = not hasattr(self.trainer, "current_gradient_accumulation_steps")
        if missing:
            self.trainer.current_gradient_accumulation_steps = 1
        try:
            return self.passes.forward_backward(inputs, samples, batch)
        finally:
            if missing:
                del self.trainer.current_gradient_accumulation_steps

    def zero_grad(self) -> None:
        self.trainer.model.zero_grad(set_to_none=True)


def worker_ddp(prepared, args, device: torch.device, group) -> torch.nn.parallel.DistributedDataParallel:
    """DDP over the processes of one worker (`group`) with the Trainer's `ddp_*` settings. accelerate cannot take a
    process group, so the model is wrapped here and marked prepared: the Trainer then prepares only the optimizer,
    and `unwrap_model` still finds the model."""
    kwargs = {
        "find_unused_parameters": bool(args.ddp_find_unused_parameters),
        "broadcast_buffers": True if args.ddp_broadcast_buffers is None else bool(args.ddp_broadcast_buffers),
    }
    if args.ddp_bucket_cap_mb is not None:
        kwargs["bucket_cap_mb"] = args.ddp_bucket_cap_mb
    if args.ddp_static_graph is not None:
        kwargs["static_graph"] = bool(args.ddp_static_graph)
    ddp = torch.nn.parallel.DistributedDataParallel(
        prepared,
        device_ids=[device] if device.type == "cuda" else None,
        process_group=group,
        **kwargs,
    )
    mark_prepared(ddp)
    return ddp
