"""Batches of any size from a stream: the streamed twin of `sampler.AdaptiveBatchSampler`.

The stream is read in the main process, where its position lives; DataLoader worker processes, when there are any,
only collate the examples the sampler drew (`StreamExamples` carries tensors to them as numpy arrays: torch would
move every tensor of every example through shared memory, ~40 times slower for a batch of 32 token blocks). A change
of size puts the examples of the batches drawn ahead back in front of the stream (`sampling/prefetch.py`).
"""

import copy
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
from torch.utils.data import Dataset

from .prefetch import AdaptiveDataLoader, LoaderSettings, PlannedBatches
from .stream_parts import StreamPart, part_class, worker_stream


__all__ = [
    "AdaptiveStreamSampler",
    "StreamExamples",
    "adaptive_stream_loader",
    "check_sampler_kind",
    "reshard_stream_states",
]


class AdaptiveStreamSampler:
    """Yields lists of examples from this worker's part of a stream forever; `batch_size` applies to the next batch.

    The same surface the worker uses of `AdaptiveBatchSampler`: `batch_size` (settable), `shard_size` (None: a stream
    does not bound a batch request), `next_batch()`, `state_dict()` / `load_state_dict()` (`kind="stream"`: the
    part's own exact position, saved in `checkpoint-N/adloco/rank-R.pt["sampler"]`). Batches are never short; a
    batch that reaches the end of the part's shards continues in the next pass.

    Use it through [`adaptive_stream_loader`]: its [`AdaptiveDataLoader`] draws the batches here, in the main
    process, and its worker processes (if any) collate them. Batches drawn ahead of training (`planned`, the part
    that owns the batch size) are re-planned when the size changes: their examples go back in front of the stream
    (`_pending`), and `state_dict()` is the part's position before the first batch training has not received. That
    position is behind the part's: the part's state is kept before every batch drawn ahead, and a position between
    two kept states (after a change of size) is rebuilt by reading a fresh part forward from the earlier one
    (`fresh_part`).

    Args:
        part: this worker's part of the stream (`next_example`, `state_dict`, `load_state_dict`), see
            `stream.worker_stream`.
        batch_size: initial examples per batch.
        fresh_part: makes a fresh part of the same stream: for `probe_examples` (so probing reads no training data)
            and to rebuild a position behind the part's.

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

    def __init__(self, part: Any, *, batch_size: int, fresh_part: Callable[[], Any] | None = None):
        self.part = part
        # The batch size, and the batches a loader drew ahead of training (`sampling/prefetch.py`).
        self._in_flight = PlannedBatches(
            batch_size,
            position=self._position,
            rewind=self._rewind,
            draw=self._next_examples,
            remember=self._remember,
            received=self._forget_states_behind,
        )
        self.samples = 0  # examples drawn (by batches, from the run's start)
        self._fresh_part = fresh_part
        self._pending: deque = deque()  # examples read from the part, to be drawn again (re-planned batches)
        self._states: dict[int, dict[str, Any]] = {}  # the part's state at `samples` = key, kept while drawing ahead

    @property
    def batch_size(self) -> int:
        return self._in_flight.batch_size

    @batch_size.setter
    def batch_size(self, value: int) -> None:
        self._in_flight.batch_size = value  # the examples of batches drawn ahead at the old size are drawn again

    @property
    def planned(self) -> PlannedBatches:
        """The batch size and the batches planned ahead of training, which an [`AdaptiveDataLoader`] draws."""
        return self._in_flight

    @property
    def passes(self) -> float | None:
        """Whole passes over this worker's part of the stream that its reading has finished (a stream's length is
        unknown until a pass ends), or None when the part does not tell (`reading_pass`). Read where the stream is
        read: ahead of training by the batches a loader prefetched (and a `PackedStream`'s tokenised documents)."""
        reading = getattr(self.part, "reading_pass", None)
        return None if reading is None else float(reading)

    def next_batch(self) -> list[Any]:
        """Draw the next `batch_size` examples and advance the position."""
        batch = [
            self._pending.popleft() if self._pending else self.part.next_example() for _ in range(self.batch_size)
        ]
        self.samples += len(batch)
        return batch

    def _next_examples(self) -> "StreamExamples":
        """`next_batch` on its way to a loader process (`StreamExamples`)."""
        return StreamExamples(self.next_batch())

    def _position(self) -> int:
        return self.samples

    def _remember(self, position: int) -> None:
        if not self._pending and position not in self._states:  # the part stands at `position`: keep its state
            self._states[position] = copy.deepcopy(self.part.state_dict())

    def _forget_states_behind(self, consumed: int) -> None:
        """Training received a batch: the states kept before what it consumed can go."""
        behind = sorted(key for key in self._states if key <= consumed)
        for key in behind[:-1]:  # the last state at or before what training consumed stays
            del self._states[key]

    def _rewind(self, before: int, batches: list[list[Any]]) -> None:
        self._pending.extendleft(reversed([example for batch in batches for example in batch]))
        self.samples = before

    def _state_at(self, position: int) -> dict[str, Any]:
        """The part's state after `position` examples were drawn (at most the part's own position)."""
        read = self.samples + len(self._pending)  # the part's own position
        if position == read:
            return self.part.state_dict()
        key = max((key for key in self._states if key <= position), default=None)
        if key is None:
            raise RuntimeError(f"no kept stream state at or before example {position}: it was drawn ahead unkept")
        if key == position:
            return copy.deepcopy(self._states[key])
        if self._fresh_part is None:
            raise ValueError(
                "this stream sampler has no fresh_part: it cannot rebuild the stream's position behind its own"
            )
        part = self._fresh_part()  # read forward from the kept state: the examples read are the same
        part.load_state_dict(copy.deepcopy(self._states[key]))
        for _ in range(position - key):
            part.next_example()
        return part.state_dict()

    def probe_examples(self, n: int) -> list[Any]:
        """`n` examples from a fresh part of the stream (for `max_batch_size="auto"`): the position is unchanged."""
        if self._fresh_part is None:
            raise ValueError("this stream sampler has no fresh_part: it cannot probe without drawing training data")
        part = self._fresh_part()
        return [part.next_example() for _ in range(n)]

    def __iter__(self) -> Iterator[list[Any]]:
        while True:
            yield self.next_batch()

    def state_dict(self) -> dict[str, Any]:
        """The position training consumed (before any batch a loader drew ahead), and the batch size."""
        consumed = self._in_flight.consumed_position()
        return {
            "kind": "stream",
            "batch_size": self.batch_size,
            "samples": consumed,
            "stream": self._state_at(consumed),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("kind") != "stream":
            raise ValueError(
                "the checkpoint's sampler state is map-style (saved with a train_dataset that has a length), but this "
                "run's train_dataset is a stream: resume with the dataset the run was started with"
            )
        self._in_flight.drop()  # a loaded position replaces whatever was drawn ahead
        self._pending.clear()
        self._states.clear()
        self.part.load_state_dict(state["stream"])
        self.batch_size = int(state["batch_size"])
        self.samples = int(state["samples"])


class StreamExamples(list):
    """A batch of stream examples on its way to a loader process: pickled with CPU tensors as numpy arrays, rebuilt
    as the same tensors there (`torch.from_numpy`: same dtype, shape and values). Without loader processes it is
    never pickled. A dtype numpy lacks (bfloat16) travels as a tensor."""

    def __reduce__(self):
        return _rebuild_examples, ([_to_wire(example) for example in self],)


class _WireTensor:
    __slots__ = ("array",)

    def __init__(self, array):
        self.array = array


def _to_wire(value: Any) -> Any:
    if isinstance(value, dict):
        return {key: _to_wire(item) for key, item in value.items()}
    if isinstance(value, torch.Tensor) and value.device.type == "cpu" and value.layout == torch.strided:
        try:
            return _WireTensor(value.detach().numpy())
        except TypeError:  # no numpy dtype
            return value
    return value


def _from_wire(value: Any) -> Any:
    if isinstance(value, dict):
        return {key: _from_wire(item) for key, item in value.items()}
    return torch.from_numpy(value.array) if isinstance(value, _WireTensor) else value


def _rebuild_examples(examples: list) -> list:
    return [_from_wire(example) for example in examples]


class _Drawn(Dataset):
    """The loader's dataset for a stream: its "indices" are the examples the sampler drew, returned as they are."""

    def __getitem__(self, example):
        return example

    def __getitems__(self, examples):
        return list(examples)


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
    dataset,
    collate_fn,
    *,
    batch_size: int,
    num_workers: int,
    rank: int,
    loader: LoaderSettings | None = None,
) -> AdaptiveDataLoader:
    """An [`AdaptiveDataLoader`] over this worker's `AdaptiveStreamSampler` (its `adaptive_sampler`).

    `num_workers` is the number of AdLoCo workers sharing the stream; `loader` the DataLoader's own worker processes
    (`dataloader_num_workers`, ...): they collate the examples the sampler reads here, in the main process.
    """
    part = worker_stream(dataset, rank, num_workers)
    # A datasets stream or a PackedStream makes fresh parts; a user's stream keeps its position in the object itself.
    fresh = isinstance(part, StreamPart) or hasattr(dataset, "split_by_node")

    def fresh_part():
        return worker_stream(dataset if fresh else copy.deepcopy(dataset), rank, num_workers)

    sampler = AdaptiveStreamSampler(part, batch_size=batch_size, fresh_part=fresh_part)
    return AdaptiveDataLoader(_Drawn(), sampler, collate_fn=collate_fn, settings=loader or LoaderSettings(), rank=rank)


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
