"""The training data of `AdLoCoTrainer`: a `DataLoader` over the adaptive sampler, whose batch size changes between
rounds (accelerate's `BatchSamplerShard` would freeze it), with the Trainer's `dataloader_*` worker processes."""

import datasets
from torch.utils.data import DataLoader
from transformers import Trainer

from ..common.upstream import trainer_collator_with_removed_columns, trainer_remove_unused_columns
from ..sampling.prefetch import LoaderSettings
from ..sampling.sampler import AdaptiveBatchSampler, adaptive_train_loader
from ..sampling.stream_parts import is_stream
from ..sampling.stream_sampler import AdaptiveStreamSampler, adaptive_stream_loader
from .inputs_check import check_eval_batches, check_first_batch, check_not_text


__all__ = ["epoch_of", "train_loader"]


def train_loader(trainer: Trainer) -> tuple[DataLoader, AdaptiveBatchSampler | AdaptiveStreamSampler]:
    """The loader of `trainer.train_dataset` and the sampler that plans its batches. A map-style dataset is shuffled
    and sharded by `AdaptiveBatchSampler`; a stream goes through `AdaptiveStreamSampler` (this worker's part of it,
    batches of the planned size). Unused columns are removed as the Trainer's own loader does.

    Called before training starts (before any worker sets up its rounds or writes a file): a map-style dataset's
    first batch, and every evaluation set's, must hold the model's input (`inputs_check.py`).

    With `dataloader_num_workers > 0` the loader's worker processes fetch and collate batches ahead of training; a
    change of batch size re-plans those, so every step trains on the batch it would without them
    (`sampling/prefetch.py`)."""
    args, dataset, collator = trainer.args, trainer.train_dataset, trainer.data_collator
    check_not_text(trainer, dataset)  # before the Trainer strips a text dataset of every column
    settings = LoaderSettings.from_args(args)
    initial = trainer.worker.settings.start.rounds.initial_batch_size  # per_device_train_batch_size
    if is_stream(dataset):
        loader = adaptive_stream_loader(
            dataset,
            trainer_collator_with_removed_columns(trainer, collator, "training"),
            batch_size=initial,
            num_workers=args.world_size,
            rank=args.process_index,
            loader=settings,
        )
        check_eval_batches(trainer)
        return loader, loader.adaptive_sampler
    if isinstance(dataset, datasets.Dataset):
        dataset = trainer_remove_unused_columns(trainer, dataset, "training")
    else:
        collator = trainer_collator_with_removed_columns(trainer, collator, "training")
    loader = adaptive_train_loader(
        dataset,
        collator,
        batch_size=initial,
        num_workers=args.world_size,
        rank=args.process_index,
        seed=args.data_seed if args.data_seed is not None else args.seed,
        loader=settings,
    )
    check_first_batch(trainer, loader.dataset, loader.collate_fn, original=trainer.train_dataset)
    check_eval_batches(trainer)
    return loader, loader.adaptive_sampler


def epoch_of(sampler: AdaptiveBatchSampler | AdaptiveStreamSampler, step: int, max_steps: int) -> float:
    """The epoch to report (`TrainerState.epoch`): the data training consumed, as the sampler counts it (passes over
    this worker's shard of a map-style dataset; the passes a stream's part has finished). A stream that does not say
    which pass it reads gets steps over `max_steps`, from the resumed step (as an uninterrupted run logs)."""
    passes = sampler.passes
    return passes if passes is not None else step / max_steps
