"""A worker's part of a streamed training dataset, with a position that a checkpoint restores exactly.

Every worker reads its own part of a `datasets.IterableDataset` (C4 streamed from the Hub, local JSON-lines shards):

- layout `"shards"` when the stream has at least as many shards (files) as there are workers: worker `rank` of `W`
  reads shards `rank, rank + W, ...` in order, each one whole. This is `datasets.distributed.split_dataset_by_node`
  when the shards divide evenly; when they do not, `split_dataset_by_node` would make every worker read every file
  and keep one example in `W`, while here the parts still go by file (the workers' parts then differ by one shard).
- layout `"stride"` when there are fewer shards than workers: every worker reads the whole stream and keeps the
  examples `i` with `i % W == rank` (`split_dataset_by_node`'s rule), so the parts are disjoint and differ by at most
  one example.

A part never runs out: at the end of its shards it starts the next pass over the same shards. Its `state_dict()` is
plain types (`torch.save` with `weights_only=True` loading works): the pass, the shards still to read this pass and
the `datasets` state of the shard being read, which `datasets` restores at the next example. Two things `datasets`
does that the part works around (DESIGN §7): its `state_dict()` right after `load_state_dict()` is a fresh state
until iteration starts (the part returns the loaded one until its first pull), and a shuffle buffer is not restored
(a warning names it: its examples are lost or repeated on resume).
"""

import logging
from collections.abc import Iterator
from typing import Any

import datasets
from torch.utils.data import IterableDataset


__all__ = ["StreamPart", "is_stream", "worker_stream"]

logger = logging.getLogger(__name__)

STATE_KIND = "datasets-part"


def is_stream(dataset: Any) -> bool:
    """Whether `dataset` is a stream (a torch `IterableDataset`, which `datasets.IterableDataset` is) and not a
    map-style dataset with a length."""
    return isinstance(dataset, IterableDataset)


class StreamPart:
    """Worker `rank`'s part of `dataset`, read one example at a time (an explicit iterator: nothing hides state).

    Args:
        dataset: a `datasets.IterableDataset`; each of its shards must be readable with
            `dataset.shard(num_shards, index, contiguous=True)` (every file-based stream is).
        rank: this worker's index.
        world_size: the number of workers sharing the stream.

    Example:
    ```python
    >>> stream = datasets.load_dataset("json", data_files=files, split="train", streaming=True)  # 4 files
    >>> part = StreamPart(stream, rank=1, world_size=2)  # reads files 1 and 3
    >>> example = part.next_example()
    >>> state = part.state_dict()  # saved with the checkpoint; a new part's load_state_dict(state) continues here
    ```
    """

    def __init__(self, dataset: datasets.IterableDataset, *, rank: int, world_size: int):
        if world_size < 1 or not 0 <= rank < world_size:
            raise ValueError(f"rank must be in [0, world_size), got rank={rank}, world_size={world_size}")
        self.dataset = dataset
        self.rank, self.world_size = rank, world_size
        self.num_shards = int(dataset.num_shards)
        self.layout = "shards" if self.num_shards >= world_size else "stride"
        self.epoch = 0
        self._queue = self._pass_shards()
        self._rows = 0  # rows read from the shard at the head of the queue
        self._seen = 0  # stride: examples of the whole stream read this pass, kept or not
        self._kept_this_pass = 0
        self._shard: datasets.IterableDataset | None = None
        self._iterator: Iterator[dict] | None = None
        self._loaded_inner: dict | None = None  # a loaded shard state, applied when that shard is opened
        if rank == 0 and has_shuffle_buffer(dataset):
            logger.warning(
                "the training stream shuffles with a buffer (IterableDataset.shuffle): datasets does not restore the "
                "buffer's content on resume, so a resumed run loses or repeats the examples it held; shuffle the "
                "shards' order instead (data_files order) or shuffle before writing the shards"
            )

    def _pass_shards(self) -> list[int]:
        if self.layout == "shards":
            return list(range(self.rank, self.num_shards, self.world_size))
        return list(range(self.num_shards))

    def describe(self) -> str:
        """One line for logs: the layout and the shards this part reads."""
        shards = self._pass_shards()
        return f"layout {self.layout}: {len(shards)} of {self.num_shards} shard(s) for rank {self.rank} of {self.world_size}"

    def _open_head(self) -> None:
        shard = self.dataset.shard(num_shards=self.num_shards, index=self._queue[0], contiguous=True)
        if self._loaded_inner is not None:
            shard.load_state_dict(self._loaded_inner)
            self._loaded_inner = None
        self._shard, self._iterator = shard, iter(shard)

    def next_example(self) -> dict[str, Any]:
        """The next example of this part, continuing into the next pass at the end of its shards."""
        while True:
            if not self._queue:
                if self._kept_this_pass == 0:
                    raise ValueError(
                        f"rank {self.rank}'s part of the training stream ({self.describe()}) has no example in a "
                        "whole pass: give the stream more documents or shards, or launch fewer workers"
                    )
                self.epoch += 1
                self._queue, self._seen, self._kept_this_pass = self._pass_shards(), 0, 0
            if self._iterator is None:
                self._open_head()
            example = next(self._iterator, None)
            if example is None:
                self._queue.pop(0)
                self._rows, self._shard, self._iterator = 0, None, None
                continue
            self._rows += 1
            self._seen += 1
            if self.layout == "stride" and (self._seen - 1) % self.world_size != self.rank:
                continue
            self._kept_this_pass += 1
            return example

    def __iter__(self) -> Iterator[dict[str, Any]]:
        while True:
            yield self.next_example()

    def state_dict(self) -> dict[str, Any]:
        """Where this part stands: exact, so that `load_state_dict` continues with the next example."""
        if self._shard is not None:
            inner = self._shard.state_dict()
        else:
            inner = self._loaded_inner  # loaded but not yet read: datasets would return a fresh state here
        return {
            "kind": STATE_KIND,
            "layout": self.layout,
            "num_shards": self.num_shards,
            "world_size": self.world_size,
            "rank": self.rank,
            "epoch": self.epoch,
            "queue": list(self._queue),
            "rows": self._rows,
            "seen": self._seen,
            "kept": self._kept_this_pass,
            "inner": inner,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from a `state_dict()` of a part of the same stream, rank and number of workers."""
        for key in ("num_shards", "world_size", "rank"):
            if state[key] != getattr(self, key):
                raise ValueError(
                    f"the training stream's state was saved with {key}={state[key]}, but this run has "
                    f"{key}={getattr(self, key)}; resume with the same stream (data files) and number of processes"
                )
        self.epoch = int(state["epoch"])
        self._queue = [int(shard) for shard in state["queue"]]
        self._rows, self._seen, self._kept_this_pass = int(state["rows"]), int(state["seen"]), int(state["kept"])
        self._shard = self._iterator = None
        self._loaded_inner = state["inner"]


def has_shuffle_buffer(dataset: datasets.IterableDataset) -> bool:
    """Whether a `datasets` stream shuffles through a buffer somewhere in its chain (private `datasets` classes, so
    an unknown chain answers False)."""
    node = getattr(dataset, "_ex_iterable", None)
    while node is not None:
        if type(node).__name__ == "BufferShuffledExamplesIterable":
            return True
        node = getattr(node, "ex_iterable", None)
    return False


def worker_stream(dataset: Any, rank: int, world_size: int):
    """This worker's part of a training stream: an object with `next_example()`, `state_dict()`, `load_state_dict()`.

    - a `datasets.IterableDataset`: a [`StreamPart`];
    - an object with `split_by_node(rank, world_size)` (e.g. `PackedStream`): what it returns;
    - any other torch `IterableDataset` with `state_dict()`/`load_state_dict()`: itself, wrapped; it must read its own
      part of the data on each worker.
    """
    if isinstance(dataset, datasets.IterableDataset):
        return StreamPart(dataset, rank=rank, world_size=world_size)
    if hasattr(dataset, "split_by_node"):
        return dataset.split_by_node(rank, world_size)
    if hasattr(dataset, "state_dict") and hasattr(dataset, "load_state_dict"):
        if world_size > 1 and rank == 0:
            logger.info(
                "train_dataset %s is used as it is on every worker: it must read a different part on each",
                type(dataset).__name__,
            )
        return _OwnStatePart(dataset)
    raise ValueError(
        f"train_dataset is a stream ({type(dataset).__name__}) without state_dict()/load_state_dict(): a resumed run "
        "could not continue where it stopped. Use a datasets.IterableDataset, or give the stream both methods"
    )


class _OwnStatePart:
    """A user's stream that keeps its own position: iterated once, its state is its own."""

    def __init__(self, dataset):
        self.dataset = dataset
        self._iterator: Iterator | None = None

    def describe(self) -> str:
        return f"{type(self.dataset).__name__} (its own part on every worker)"

    def next_example(self):
        if self._iterator is None:
            self._iterator = iter(self.dataset)
        example = next(self._iterator, None)
        if example is None:  # the next pass
            self._iterator = iter(self.dataset)
            example = next(self._iterator, None)
            if example is None:
                raise ValueError(f"train_dataset {type(self.dataset).__name__} yields no example")
        return example

    def state_dict(self) -> dict[str, Any]:
        return self.dataset.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.dataset.load_state_dict(state)
        self._iterator = None
