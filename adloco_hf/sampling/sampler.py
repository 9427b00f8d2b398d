"""An infinite batch sampler whose batch size can change between steps, one disjoint shard per worker."""

from collections.abc import Iterator, Sequence
from typing import Any

import torch
from torch.utils.data import IterableDataset, Sampler

from .prefetch import AdaptiveDataLoader, LoaderSettings, PlannedBatches
from .reshard import bridge, check_old_states, check_world_size


__all__ = ["AdaptiveBatchSampler", "adaptive_train_loader"]


class AdaptiveBatchSampler(Sampler[list[int]]):
    """Yields lists of dataset indices forever; `batch_size` may be changed at any time and applies to the next batch.

    Every pass over the data draws a fresh permutation of all indices from a generator seeded with `seed + pass`
    (the same on every worker), and worker `rank` of `num_workers` takes the strided shard `perm[rank::num_workers]`,
    truncated so that all shards have equal length: shards are disjoint within a pass and every worker sees different
    data in every pass. A batch that reaches the end of a shard continues in the next pass, so no sample is dropped
    and no batch is short. The position is part of `state_dict()`, so a resumed run draws the same batches.

    A run resumed with another number of workers re-splits what the old workers had not drawn of the passes they
    had started (`reshard_sampler_states`, see `sampling/reshard.py`): each new worker first draws its part of that *bridge*,
    then regular passes with the new layout. Within every pass no sample is lost or drawn twice.

    Iterated as the `batch_sampler` of a plain `DataLoader`, it draws each batch when the loader asks for it: use
    `num_workers=0` there. [`adaptive_train_loader`] builds an [`AdaptiveDataLoader`], whose worker processes may
    prefetch: a change of `batch_size` then re-plans the batches drawn ahead (`planned`, the part that owns the batch
    size), and `state_dict()` is the position before the first batch training has not received
    (`sampling/prefetch.py`).

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
        # The batch size, and the batches a loader drew ahead of training (`sampling/prefetch.py`).
        self._in_flight = PlannedBatches(
            batch_size, position=self._position, rewind=self._rewind, draw=self.next_batch
        )
        self.epoch = 0
        self.position = 0
        self._shard: list[int] | None = None
        self._shard_epoch = -1
        # An elastic resume's bridge, drawn before the regular passes (which then start at `epoch`): each part is
        # (pass, indices); `_bridge_pos` counts what was drawn of all parts.
        self._bridge: list[tuple[int, list[int]]] = []
        self._bridge_pos = 0

    @property
    def batch_size(self) -> int:
        return self._in_flight.batch_size

    @batch_size.setter
    def batch_size(self, value: int) -> None:
        self._in_flight.batch_size = value  # re-plans what an AdaptiveDataLoader drew ahead at the old size

    @property
    def planned(self) -> PlannedBatches:
        """The batch size and the batches planned ahead of training, which an [`AdaptiveDataLoader`] draws."""
        return self._in_flight

    @property
    def passes(self) -> float:
        """The passes over this worker's shard that training has consumed (samples drawn / shard size, counted from
        the run's start; an elastic resume's bridge is the rest of the passes before `epoch`)."""
        epoch, position, bridge, bridge_pos = self._in_flight.consumed_position()
        left = sum(len(items) for _, items in bridge) - bridge_pos
        return epoch + (position - left) / self.shard_size

    def _position(self) -> tuple:
        return self.epoch, self.position, self._bridge, self._bridge_pos

    def _rewind(self, before: tuple, batches: list[list[int]]) -> None:
        self.epoch, self.position, self._bridge, self._bridge_pos = before

    def _current_shard(self) -> list[int]:
        if self._shard_epoch != self.epoch:
            permutation = _permutation(self.seed, self.epoch, self.num_samples)
            shard = permutation[self.rank :: self.num_workers][: self.shard_size]
            self._shard, self._shard_epoch = shard.tolist(), self.epoch
        return self._shard

    def _draw(self, count: int) -> tuple[int, list[int]]:
        """At most `count` indices from the current pass, as (pass, indices), advancing the position."""
        offset = self._bridge_pos
        for epoch, items in self._bridge:
            if offset < len(items):
                taken = items[offset : offset + count]
                self._bridge_pos += len(taken)
                if self._bridge_pos == sum(len(part) for _, part in self._bridge):
                    self._bridge, self._bridge_pos = [], 0
                return epoch, taken
            offset -= len(items)
        epoch, shard = self.epoch, self._current_shard()
        take = min(count, self.shard_size - self.position)
        taken = shard[self.position : self.position + take]
        self.position += take
        if self.position == self.shard_size:
            self.epoch += 1
            self.position = 0
        return epoch, taken

    def next_batch(self) -> list[int]:
        """Draw the next batch of `batch_size` indices and advance the position."""
        return [index for _, indices in self.next_batch_by_pass() for index in indices]

    def next_batch_by_pass(self) -> list[tuple[int, list[int]]]:
        """`next_batch` as (pass, indices) parts, in order: a batch that crosses a pass's end has several."""
        parts: list[tuple[int, list[int]]] = []
        drawn = 0
        while drawn < self.batch_size:
            epoch, indices = self._draw(self.batch_size - drawn)
            parts.append((epoch, indices))
            drawn += len(indices)
        return parts

    def __iter__(self) -> Iterator[list[int]]:
        while True:
            yield self.next_batch()

    def state_dict(self) -> dict[str, Any]:
        """The position training consumed (before any batch a loader drew ahead), and the batch size."""
        epoch, position, bridge, bridge_pos = self._in_flight.consumed_position()
        return {
            "epoch": epoch,
            "position": position,
            "batch_size": self.batch_size,
            "seed": self.seed,
            "num_samples": self.num_samples,
            "num_workers": self.num_workers,
            "rank": self.rank,
            **_bridge_state(bridge, bridge_pos),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for key in ("seed", "num_samples", "num_workers", "rank"):
            if state[key] != getattr(self, key):
                raise ValueError(
                    f"the sampler state was saved with {key}={state[key]}, but this run has {key}={getattr(self, key)}; "
                    "resume with the same dataset, seed and number of processes"
                )
        self._in_flight.drop()  # a loaded position replaces whatever was drawn ahead
        self.epoch = int(state["epoch"])
        self.position = int(state["position"])
        self.batch_size = int(state["batch_size"])
        self._bridge, self._bridge_pos = _bridge_of(state), int(state.get("bridge_pos") or 0)

    @classmethod
    def reshard_sampler_states(cls, states: Sequence[dict[str, Any]], world_size: int) -> list[dict[str, Any]]:
        """The states of `world_size` new workers continuing the old workers' `states` (one per old rank, in rank
        order): each holds its part of the bridge (module `sampling/reshard.py`), then regular passes from the first pass no
        old worker had started, with the new layout. Loadable with `load_state_dict` by the new ranks."""
        check_old_states(states, "sampler", same=("seed", "num_samples"), indexed=("rank",))
        first = states[0]
        num_samples, seed = int(first["num_samples"]), int(first["seed"])
        check_world_size(world_size, num_samples)
        # The last pass any old worker has drawn from: every pass up to it is finished through the bridge.
        last = max(int(s["epoch"]) - (1 if int(s["position"]) == 0 else 0) for s in states)
        remainders: dict[int, list[int]] = {}
        for state in states:
            for epoch, items in _remainders(state, last).items():
                remainders.setdefault(epoch, []).extend(items)
        for epoch, items in remainders.items():
            if len(set(items)) != len(items):
                raise ValueError(f"the old workers' sampler states overlap in pass {epoch}: they are not one run's")
            order = torch.empty(num_samples, dtype=torch.long)
            order[_permutation(seed, epoch, num_samples)] = torch.arange(num_samples)
            indices = torch.tensor(items, dtype=torch.long)
            remainders[epoch] = indices[torch.argsort(order[indices])].tolist()  # the pass's order, any old layout
        parts = bridge(remainders, world_size)
        return [
            {
                "epoch": last + 1,
                "position": 0,
                "batch_size": int(states[min(rank, len(states) - 1)]["batch_size"]),
                "seed": seed,
                "num_samples": num_samples,
                "num_workers": world_size,
                "rank": rank,
                **_bridge_state(part, 0),
            }
            for rank, part in enumerate(parts)
        ]


def _permutation(seed: int, epoch: int, num_samples: int) -> torch.Tensor:
    return torch.randperm(num_samples, generator=torch.Generator().manual_seed(seed + epoch))


def _bridge_state(parts: list[tuple[int, list[int]]], position: int) -> dict[str, Any]:
    """A bridge as plain values and one int32 tensor (`torch.load(weights_only=True)` reads it); None without one."""
    if not parts:
        return {"bridge_passes": None, "bridge_lengths": None, "bridge_indices": None, "bridge_pos": 0}
    return {
        "bridge_passes": [epoch for epoch, _ in parts],
        "bridge_lengths": [len(items) for _, items in parts],
        "bridge_indices": torch.tensor([i for _, items in parts for i in items], dtype=torch.int32),
        "bridge_pos": position,
    }


def _bridge_of(state: dict[str, Any]) -> list[tuple[int, list[int]]]:
    """The bridge of a state (`[]` for one without, or written before bridges existed)."""
    if state.get("bridge_passes") is None:
        return []
    flat = torch.as_tensor(state["bridge_indices"]).tolist()
    parts, start = [], 0
    for epoch, length in zip(state["bridge_passes"], state["bridge_lengths"]):
        parts.append((int(epoch), flat[start : start + int(length)]))
        start += int(length)
    return parts


def _remainders(state: dict[str, Any], last: int) -> dict[int, list[int]]:
    """pass → what the worker of `state` has not drawn yet of passes up to `last`: the rest of its bridge, then of
    its regular shards (with its layout)."""
    remaining: dict[int, list[int]] = {}
    offset = int(state.get("bridge_pos") or 0)
    for epoch, items in _bridge_of(state):
        rest = items[max(offset, 0) :]
        offset -= len(items)
        if rest:
            remaining.setdefault(epoch, []).extend(rest)
    num_samples, num_workers, rank = int(state["num_samples"]), int(state["num_workers"]), int(state["rank"])
    shard_size = num_samples // num_workers
    for epoch in range(int(state["epoch"]), last + 1):
        shard = _permutation(int(state["seed"]), epoch, num_samples)[rank::num_workers][:shard_size]
        start = int(state["position"]) if epoch == int(state["epoch"]) else 0
        remaining.setdefault(epoch, []).extend(shard[start:].tolist())
    return remaining


def adaptive_train_loader(
    dataset,
    collate_fn,
    *,
    batch_size: int,
    num_workers: int,
    rank: int,
    seed: int,
    loader: LoaderSettings | None = None,
) -> AdaptiveDataLoader:
    """An [`AdaptiveDataLoader`] over this worker's `AdaptiveBatchSampler` (its `adaptive_sampler`).

    `num_workers` is the number of AdLoCo workers sharing the data; `loader` the DataLoader's own worker processes
    (`dataloader_num_workers`, ...), which fetch and collate the planned batches (`sampling/prefetch.py`). Not
    prepared by accelerate: `BatchSamplerShard` would freeze the batch size; the Trainer's `_prepare_inputs` moves
    each batch to the device. Refuses, before training, data a worker cannot take a disjoint shard of.
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
    return AdaptiveDataLoader(dataset, sampler, collate_fn=collate_fn, settings=loader or LoaderSettings(), rank=rank)
