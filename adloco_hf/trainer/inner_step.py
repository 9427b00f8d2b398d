"""One inner step inside `AdLoCoTrainer`: micro-batches accumulated into one optimizer step (switch mode, or two
halves for the gradient statistics), the probe step that sizes `max_batch_size="auto"`, and the DDP that joins the
processes of one worker.

These are the Trainer's own steps run differently, not overrides: `trainer/trainer.py` decides when each runs.
"""

import contextlib
from collections.abc import Callable

import torch
from transformers import Trainer

from ..batch.switch_mode import Statistics, StepPlan
from ..common.inputs import split_inputs
from ..sampling.stream_sampler import AdaptiveStreamSampler
from ..worker.core import Worker


__all__ = ["accumulate", "no_sync", "probe_step", "worker_ddp"]


def no_sync(model):
    """DDP's `no_sync` for a worker of several processes; nothing to turn off for a bare model."""
    return (
        model.no_sync() if isinstance(model, torch.nn.parallel.DistributedDataParallel) else contextlib.nullcontext()
    )


def accumulate(
    trainer: Trainer,
    worker: Worker,
    step: Callable,
    model,
    inputs,
    plan: StepPlan,
    num_items_in_batch,
    synced: bool = True,
) -> torch.Tensor:
    """Forward/backward each chunk inside one optimizer step; the gradient equals the whole batch's.

    `step` is the Trainer's own `training_step` (forward, backward, loss), run once per chunk. Inside a worker of
    several processes (DDP) every chunk but the last runs under `no_sync` (`synced`: the last one all-reduces the
    accumulated gradient; else the caller keeps all of them local).

    With `num_items_in_batch` the model normalises every chunk by the whole batch's token count; otherwise the
    Trainer divides each chunk's mean loss by `current_gradient_accumulation_steps`, set here to b / n_j.
    """
    sizes = list(plan.chunk_sizes)
    chunks = split_inputs(inputs, sizes)
    batch = sum(sizes)
    collect = plan.statistics is Statistics.SPLIT
    weights = [n / batch for n in sizes]
    if collect and num_items_in_batch is not None:
        counts = [float(trainer._get_num_items_in_batch([c], trainer.args.device)) for c in chunks]
        weights = [c / sum(counts) for c in counts] if sum(counts) > 0 else None
    if collect and weights is not None:
        worker.start_statistics(weights)
    saved = getattr(trainer, "current_gradient_accumulation_steps", 1)
    total = None
    try:
        for index, (chunk, size) in enumerate(zip(chunks, sizes)):
            if collect and weights is not None:
                worker.begin_chunk(index)
            if num_items_in_batch is None:
                trainer.current_gradient_accumulation_steps = batch / size
            last = index == len(sizes) - 1
            with contextlib.nullcontext() if last or not synced else no_sync(model):
                loss = step(model, chunk, num_items_in_batch)
            total = loss if total is None else total + loss
    finally:
        trainer.current_gradient_accumulation_steps = saved
    return total


def probe_step(trainer: Trainer, size: int) -> None:
    """Forward and backward on `size` training samples, gradients cleared after (for max_batch_size='auto')."""
    loader, sampler = trainer._train_loader, trainer.train_sampler
    dataset, collator = loader.dataset, loader.collate_fn
    if isinstance(sampler, AdaptiveStreamSampler):
        examples = sampler.probe_examples(size)  # from a fresh part: no training data is drawn
    else:
        examples = [dataset[i % len(dataset)] for i in range(size)]
    inputs = trainer._prepare_inputs(collator(examples))
    model = trainer.model
    model.train()
    try:
        with trainer.compute_loss_context_manager():
            loss = trainer.compute_loss(model, inputs)
        trainer.accelerator.backward(loss)
    finally:
        model.zero_grad(set_to_none=True)


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
    ddp._is_accelerate_prepared = True
    return ddp
