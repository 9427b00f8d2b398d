"""An infinite batch sampler whose batch size can change between steps, one disjoint shard per worker."""

from collections.abc import Iterator
from typing import Any

import torch
from torch.utils.data import DataLoader, IterableDataset, Sampler


__all__ = ["AdaptiveBatchSampler", "adaptive_train_loader"]


class AdaptiveBatchSampler(Sampler[list[int]]):
    """Yields lists of dataset indices forever; `batch_size` may be changed at any time and applies to the next batch.

    Every pass over the data draws a fresh permutation of all indices from a generator seeded with `seed + pass`
    (the same on every worker), and worker `rank` of `num_workers` takes the strided shard `perm[rank::num_workers]`,
    truncated so that all shards have equal length: shards are disjoint within a pass and every worker sees different
    data in every pass. A batch that reaches the end of a shard continues in the next pass, so no sample is dropped
    and no batch is short. The position is part of `state_dict()`, so a resumed run draws the same batches.

    Use it as the `batch_sampler` of a plain `DataLoader` with `num_workers=0`: worker processes would prefetch
    batches drawn with the old batch size.

    Args:
        num_samples: the dataset's length.
        batch_size: initial samples per batch.
        num_workers: number of workers sharing the data (the world size).
        rank: this worker's index.
        seed: base seed of the permutations.

    Example:
    ```python
    >>> sampler = AdaptiveBatchSampler(10, batch_size=2, num_workers=2, rank=0, seed=0)
    >>> batches = iter(sampler)
    >>> len(next(batches))
    2
    >>> sampler.batch_size = 4
    >>> len(next(batches))
    4
    ```
    """

    def __init__(self, num_samples: int, *, batch_size: int, num_workers: int = 1, rank: int = 0, seed: int = 0):
        if num_workers < 1 or not 0 <= rank < num_workers:
            raise ValueError(f"rank must be in [0, num_workers), got rank={rank}, num_workers={num_workers}")
        if num_samples < num_workers:
            raise ValueError(
                f"the dataset has {num_samples} samples, fewer than the {num_workers} workers that share it; "
                "use a larger train_dataset or fewer processes"
            )
        self.num_samples = num_samples
        self.num_workers = num_workers
        self.rank = rank
        self.seed = seed
        self.shard_size = num_samples // num_workers
        self.batch_size = batch_size
        self.epoch = 0
        self.position = 0
        self._shard: list[int] | None = None
        self._shard_epoch = -1

    @property
    def batch_size(self) -> int:
        return self._batch_size

    @batch_size.setter
    def batch_size(self, value: int) -> None:
        if int(value) != value or value < 1:
            raise ValueError(f"batch_size must be a positive integer, got {value}")
        self._batch_size = int(value)

    def _current_shard(self) -> list[int]:
        if self._shard_epoch != self.epoch:
            generator = torch.Generator().manual_seed(self.seed + self.epoch)
            permutation = torch.randperm(self.num_samples, generator=generator)
            shard = permutation[self.rank :: self.num_workers][: self.shard_size]
            self._shard, self._shard_epoch = shard.tolist(), self.epoch
        return self._shard

    def next_batch(self) -> list[int]:
        """Draw the next batch of `batch_size` indices and advance the position."""
        batch: list[int] = []
        while len(batch) < self.batch_size:
            shard = self._current_shard()
            take = min(self.batch_size - len(batch), self.shard_size - self.position)
            batch.extend(shard[self.position : self.position + take])
            self.position += take
            if self.position == self.shard_size:
                self.epoch += 1
                self.position = 0
        return batch

    def __iter__(self) -> Iterator[list[int]]:
        while True:
            yield self.next_batch()

    def state_dict(self) -> dict[str, Any]:
        return {
            "epoch": self.epoch,
            "position": self.position,
            "batch_size": self.batch_size,
            "seed": self.seed,
            "num_samples": self.num_samples,
            "num_workers": self.num_workers,
            "rank": self.rank,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for key in ("seed", "num_samples", "num_workers", "rank"):
            if state[key] != getattr(self, key):
                raise ValueError(
                    f"the sampler state was saved with {key}={state[key]}, but this run has {key}={getattr(self, key)}; "
                    "resume with the same dataset, seed and number of processes"
                )
        self.epoch = int(state["epoch"])
        self.position = int(state["position"])
        self.batch_size = int(state["batch_size"])


def adaptive_train_loader(
    dataset, collate_fn, *, batch_size: int, num_workers: int, rank: int, seed: int, pin_memory: bool = False
) -> DataLoader:
    """A plain `DataLoader` over this worker's `AdaptiveBatchSampler` (its `batch_sampler`), in the main process.

    Not prepared by accelerate: `BatchSamplerShard` would freeze the batch size; the Trainer's `_prepare_inputs`
    moves each batch to the device. Refuses, before training, data a worker cannot take a disjoint shard of.
    """
    if isinstance(dataset, IterableDataset) or not hasattr(dataset, "__len__"):
        raise ValueError(
            "train_dataset must be map-style (with a length): each worker takes a disjoint shard of its indices; "
            "materialise a streamed dataset first (e.g. Dataset.from_generator or .take(n))"
        )
    if len(dataset) // num_workers < batch_size:
        raise ValueError(
            f"train_dataset has {len(dataset)} samples: {len(dataset) // num_workers} per worker for {num_workers} "
            f"worker(s), fewer than per_device_train_batch_size={batch_size}; use more data or a smaller initial batch"
        )
    sampler = AdaptiveBatchSampler(len(dataset), batch_size=batch_size, num_workers=num_workers, rank=rank, seed=seed)
    return DataLoader(dataset, batch_sampler=sampler, collate_fn=collate_fn, num_workers=0, pin_memory=pin_memory)
