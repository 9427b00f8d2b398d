"""Batches of any size from a stream: the streamed twin of `sampler.AdaptiveBatchSampler`."""

import copy
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from torch.utils.data import DataLoader, IterableDataset

from .sampler import positive_batch_size
from .stream_parts import StreamPart, part_class, worker_stream


__all__ = ["AdaptiveStreamSampler", "adaptive_stream_loader", "check_sampler_kind", "reshard_stream_states"]


class AdaptiveStreamSampler(IterableDataset):
    """Yields lists of examples from this worker's part of a stream forever; `batch_size` applies to the next batch.

    The same surface the worker uses of `AdaptiveBatchSampler`: `batch_size` (settable), `shard_size` (None: a stream
    does not bound a batch request), `next_batch()`, `state_dict()` / `load_state_dict()` (`kind="stream"`: the
    part's own exact position, saved in `checkpoint-N/adloco/rank-R.pt["sampler"]`). Batches are never short; a
    batch that reaches the end of the part's shards continues in the next pass.

    Use it as the dataset of a `DataLoader` with `batch_size=None` and `num_workers=0` ([`adaptive_stream_loader`]):
    each batch is then cut when the Trainer asks for it, after a round's end has set the new size.

    Args:
        part: this worker's part of the stream (`next_example`, `state_dict`, `load_state_dict`), see
            `stream.worker_stream`.
        batch_size: initial examples per batch.
        probe_part: makes a fresh part of the same stream for `probe_examples` (so probing reads no training data).

    Example:
    ```python
    >>> sampler = AdaptiveStreamSampler(worker_stream(stream, rank=0, world_size=2), batch_size=2)
    >>> len(sampler.next_batch())
    2
    >>> sampler.batch_size = 4
    >>> len(sampler.next_batch())
    4
    ```
    """

    shard_size = None  # a stream has no shard to exhaust: batch requests are bounded by batch_size_cap only

    def __init__(self, part: Any, *, batch_size: int, probe_part: Callable[[], Any] | None = None):
        self.part = part
        self.batch_size = batch_size
        self.samples = 0
        self._probe_part = probe_part

    @property
    def batch_size(self) -> int:
        return self._batch_size

    @batch_size.setter
    def batch_size(self, value: int) -> None:
        self._batch_size = positive_batch_size(value)

    def next_batch(self) -> list[Any]:
        """Draw the next `batch_size` examples and advance the position."""
        batch = [self.part.next_example() for _ in range(self.batch_size)]
        self.samples += len(batch)
        return batch

    def probe_examples(self, n: int) -> list[Any]:
        """`n` examples from a fresh part of the stream (for `max_batch_size="auto"`): the position is unchanged."""
        if self._probe_part is None:
            raise ValueError("this stream sampler has no probe_part: it cannot probe without drawing training data")
        part = self._probe_part()
        return [part.next_example() for _ in range(n)]

    def __iter__(self) -> Iterator[list[Any]]:
        while True:
            yield self.next_batch()

    def state_dict(self) -> dict[str, Any]:
        return {
            "kind": "stream",
            "batch_size": self.batch_size,
            "samples": self.samples,
            "stream": self.part.state_dict(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("kind") != "stream":
            raise ValueError(
                "the checkpoint's sampler state is map-style (saved with a train_dataset that has a length), but this "
                "run's train_dataset is a stream: resume with the dataset the run was started with"
            )
        self.part.load_state_dict(state["stream"])
        self.batch_size = int(state["batch_size"])
        self.samples = int(state["samples"])


def reshard_stream_states(states: Sequence[dict[str, Any]], world_size: int) -> list[dict[str, Any]]:
    """The sampler states of `world_size` new workers continuing the old workers' `states` (an elastic resume): the
    stream re-split by its part's `reshard_states` (`StreamPart`, `PackedPart`); batch sizes and counts carried over
    (a new rank's batch size is set from its instance's request when the round table is restored)."""
    kinds = {state["stream"].get("kind") for state in states}
    part = part_class(next(iter(kinds))) if len(kinds) == 1 else None
    if part is not None:
        streams = part.reshard_states([state["stream"] for state in states], world_size)
    else:
        raise ValueError(
            f"the checkpoint's training stream ({', '.join(sorted(map(str, kinds)))}) keeps its own position and "
            "cannot be re-split over another number of workers: resume with the checkpoint's number of workers, or "
            "use a datasets.IterableDataset or a PackedStream"
        )
    return [
        {
            "kind": "stream",
            "batch_size": int(states[min(rank, len(states) - 1)]["batch_size"]),
            "samples": int(states[rank]["samples"]) if rank < len(states) else 0,
            "stream": stream,
        }
        for rank, stream in enumerate(streams)
    ]


def adaptive_stream_loader(
    dataset, collate_fn, *, batch_size: int, num_workers: int, rank: int, pin_memory: bool = False
) -> DataLoader:
    """A plain `DataLoader` over this worker's `AdaptiveStreamSampler`, in the main process.

    `batch_size=None` hands each drawn list to `collate_fn` as it is, and `num_workers=0` cuts exactly one batch per
    step (a prefetched batch would have the old size, and a position the checkpoint does not hold).
    """
    part = worker_stream(dataset, rank, num_workers)
    # A datasets stream or a PackedStream makes fresh parts; a user's stream keeps its position in the object itself.
    fresh = isinstance(part, StreamPart) or hasattr(dataset, "split_by_node")

    def probe_part():
        return worker_stream(dataset if fresh else copy.deepcopy(dataset), rank, num_workers)

    sampler = AdaptiveStreamSampler(part, batch_size=batch_size, probe_part=probe_part)
    return DataLoader(sampler, batch_size=None, collate_fn=collate_fn, num_workers=0, pin_memory=pin_memory)


def check_sampler_kind(saved: dict[str, Any], sampler: Any) -> None:
    """Refuse a checkpoint whose data position is of another kind than this run's train_dataset (map-style or
    stream), before anything is restored. A state without `kind` is map-style (saved before streams existed)."""
    saved_kind = saved.get("kind", "map")
    kind = "stream" if isinstance(sampler, AdaptiveStreamSampler) else "map"
    if saved_kind != kind:
        names = {"stream": "a streamed train_dataset", "map": "a map-style train_dataset (with a length)"}
        raise ValueError(
            f"the checkpoint was saved with {names[saved_kind]}, but this run has {names[kind]}: resume with the "
            "kind of train_dataset the run was started with (for pretrain_c4.py, the same --streaming setting)"
        )
