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

import copy
import logging
from collections.abc import Iterator, Sequence
from typing import Any

import datasets
from torch.utils.data import IterableDataset

from .reshard import bridge, check_old_states, check_world_size


__all__ = ["StreamPart", "is_stream", "register_part_kind", "part_class", "worker_stream"]

logger = logging.getLogger(__name__)

STATE_KIND = "datasets-part"

# A worker's part of a stream, by the `kind` its state carries: the class whose `reshard_states` re-splits such states
# over another number of workers (an elastic resume). `StreamPart` registers itself below, `data.streaming.PackedPart`
# when its module is imported (which it is wherever a run's train_dataset is a `PackedStream`).
_PART_KINDS: dict[str, type] = {}


def register_part_kind(kind: str, part_class: type) -> type:
    """Record `part_class` (with a static `reshard_states(states, world_size)`) as the part whose states say `kind`."""
    if _PART_KINDS.get(kind, part_class) is not part_class:
        raise ValueError(f"stream part kind {kind!r} is already taken by {_PART_KINDS[kind].__qualname__}")
    _PART_KINDS[kind] = part_class
    return part_class


def part_class(kind: Any) -> type | None:
    """The registered part class of states of `kind`, or None (a user's stream that keeps its own position)."""
    return _PART_KINDS.get(kind)


def is_stream(dataset: Any) -> bool:
    """Whether `dataset` is a stream (a torch `IterableDataset`, which `datasets.IterableDataset` is) and not a
    map-style dataset with a length."""
    return isinstance(dataset, IterableDataset)


class StreamPart:
    """Worker `rank`'s part of `dataset`, read one example at a time (an explicit iterator: nothing hides state).

    A part reads a list of *pieces*, each one pass's worth of one reader's data: a shard read whole (layout
    `"shards"`) or every `W`-th example of the whole stream (layout `"stride"`). A regular pass is this rank's pieces
    for its layout; after an elastic resume (`reshard_states`) a part first reads the pieces the old workers left,
    then regular passes with the new layout.

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
        self.layout = layout_for(self.num_shards, world_size)
        self.epoch = 0  # the last pass whose pieces this part holds
        self._pieces = regular_pieces(self.num_shards, rank, world_size, 0)
        self._kept: int | None = 0  # examples kept in the current regular pass; None while reading a bridge
        self._shard: datasets.IterableDataset | None = None
        self._iterator: Iterator[dict] | None = None
        if rank == 0 and has_shuffle_buffer(dataset):
            logger.warning(
                "the training stream shuffles with a buffer (IterableDataset.shuffle): datasets does not restore the "
                "buffer's content on resume, so a resumed run loses or repeats the examples it held; shuffle the "
                "shards' order instead (data_files order) or shuffle before writing the shards"
            )

    def describe(self) -> str:
        """One line for logs: the layout and the shards this part reads."""
        shards = sum(len(piece["shards"]) for piece in regular_pieces(self.num_shards, self.rank, self.world_size, 0))
        return (
            f"layout {self.layout}: {shards} of {self.num_shards} shard(s) for rank {self.rank} of {self.world_size}"
        )

    def _open_head(self) -> None:
        head = self._pieces[0]
        shard = self.dataset.shard(num_shards=self.num_shards, index=head["shards"][0], contiguous=True)
        known = head["inner"] is not None
        if known:
            shard.load_state_dict(head["inner"])
        head["inner"] = None  # the open shard holds the position from here on
        self._shard, self._iterator = shard, iter(shard)
        if not known:  # only the rows read are known: read past them again
            for _ in range(head["rows"]):
                next(self._iterator)

    def next_example(self) -> dict[str, Any]:
        """The next example of this part, continuing into the next pass at the end of its pieces."""
        while True:
            if not self._pieces:
                if self._kept == 0:
                    raise ValueError(
                        f"rank {self.rank}'s part of the training stream ({self.describe()}) has no example in a "
                        "whole pass: give the stream more documents or shards, or launch fewer workers"
                    )
                self.epoch += 1
                self._pieces = regular_pieces(self.num_shards, self.rank, self.world_size, self.epoch)
                self._kept = 0
            if self._iterator is None:
                self._open_head()
            head = self._pieces[0]
            example = next(self._iterator, None)
            if example is None:
                head["shards"].pop(0)
                head["rows"], head["inner"], self._shard, self._iterator = 0, None, None, None
                if not head["shards"]:
                    self._pieces.pop(0)
                continue
            head["rows"] += 1
            head["seen"] += 1
            if (head["seen"] - 1) % head["modulus"] != head["residue"]:
                continue
            if self._kept is not None:
                self._kept += 1
            return example

    def __iter__(self) -> Iterator[dict[str, Any]]:
        while True:
            yield self.next_example()

    @property
    def reading_pass(self) -> int:
        """The pass the example last returned belongs to (before any: the pass about to be read)."""
        return int(self._pieces[0]["pass"]) if self._pieces else self.epoch + 1

    def state_dict(self) -> dict[str, Any]:
        """Where this part stands: exact, so that `load_state_dict` continues with the next example."""
        pieces = copy.deepcopy(self._pieces)
        if self._shard is not None:
            pieces[0]["inner"] = self._shard.state_dict()
        return {
            "kind": STATE_KIND,
            "layout": self.layout,
            "num_shards": self.num_shards,
            "world_size": self.world_size,
            "rank": self.rank,
            "epoch": self.epoch,
            "pieces": pieces,
            "kept": self._kept,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from a `state_dict()` of a part of the same stream, rank and number of workers (or one that
        `reshard_states` made for them)."""
        for key in ("num_shards", "world_size", "rank"):
            if state[key] != getattr(self, key):
                raise ValueError(
                    f"the training stream's state was saved with {key}={state[key]}, but this run has "
                    f"{key}={getattr(self, key)}; resume with the same stream (data files) and number of processes"
                )
        state = _with_pieces(state)
        self.epoch = int(state["epoch"])
        self._pieces = copy.deepcopy(state["pieces"])
        self._kept = None if state["kept"] is None else int(state["kept"])
        self._shard = self._iterator = None

    @staticmethod
    def reshard_states(states: Sequence[dict[str, Any]], world_size: int) -> list[dict[str, Any]]:
        """The states of `world_size` new parts continuing the old parts' `states` (one per old rank, in rank order).

        What the old parts have not read of every pass any of them has started is dealt to the new parts as whole
        pieces (`reshard.bridge`): a shard partly read continues where it stopped; an old stride piece is read by one
        new part with the old stride. The new parts then start the next pass with the layout for `world_size`.

        Guarantee: within every pass, each example of the stream is read exactly once by the old and new parts
        together (none lost, none twice); from the next pass on, the new layout. A new part may get more or fewer
        pieces than another in the bridge (pieces are dealt whole), and one that gets a stride piece re-reads the
        whole stream to pick its examples.
        """
        states = [_with_pieces(state) for state in states]
        check_old_states(states, "stream", same=("kind", "num_shards"), indexed=("rank",))
        first = states[0]
        if first.get("kind") != STATE_KIND:
            raise ValueError(
                f"reshard_states re-splits StreamPart states (kind {STATE_KIND!r}), got {first.get('kind')!r}"
            )
        num_shards, old_world_size = int(first["num_shards"]), len(states)
        check_world_size(world_size)
        last = max(int(state["epoch"]) for state in states)
        remainders: dict[int, list[dict[str, Any]]] = {}
        for rank, state in enumerate(states):
            pieces = copy.deepcopy(state["pieces"])
            for epoch in range(int(state["epoch"]) + 1, last + 1):
                pieces += regular_pieces(num_shards, rank, old_world_size, epoch)
            for piece in pieces:
                remainders.setdefault(int(piece["pass"]), []).append(piece)
        for pieces in remainders.values():
            pieces.sort(key=lambda piece: (piece["shards"], piece["residue"], piece["modulus"]))
        parts = bridge(remainders, world_size)
        return [
            {
                "kind": STATE_KIND,
                "layout": layout_for(num_shards, world_size),
                "num_shards": num_shards,
                "world_size": world_size,
                "rank": rank,
                "epoch": last,
                "pieces": [piece for _, pieces in part for piece in pieces],
                "kept": None,  # a bridge: the next regular pass is `last + 1`
            }
            for rank, part in enumerate(parts)
        ]


def layout_for(num_shards: int, world_size: int) -> str:
    """`"shards"` when every worker can read whole shards, `"stride"` otherwise."""
    return "shards" if num_shards >= world_size else "stride"


def regular_pieces(num_shards: int, rank: int, world_size: int, epoch: int) -> list[dict[str, Any]]:
    """Rank `rank`'s pieces of pass `epoch`: its shards, or one stride piece over the whole stream."""
    if layout_for(num_shards, world_size) == "shards":
        return [_piece(epoch, [shard]) for shard in range(rank, num_shards, world_size)]
    return [_piece(epoch, list(range(num_shards)), modulus=world_size, residue=rank)]


def _piece(epoch: int, shards: list[int], *, modulus: int = 1, residue: int = 0) -> dict[str, Any]:
    """Shards read in order keeping the examples `i % modulus == residue` (`i` counted over the piece); `rows` read
    of `shards[0]` and its `datasets` state `inner` (None: not opened, or only `rows` known)."""
    return {
        "pass": epoch,
        "shards": shards,
        "modulus": modulus,
        "residue": residue,
        "rows": 0,
        "seen": 0,
        "inner": None,
    }


def _with_pieces(state: dict[str, Any]) -> dict[str, Any]:
    """A state in the pieces format (a state saved before pieces existed held a queue of shards)."""
    if "pieces" in state:
        return state
    epoch, queue = int(state["epoch"]), [int(shard) for shard in state["queue"]]
    if state["layout"] == "shards":
        pieces = [_piece(epoch, [shard]) for shard in queue]
    else:
        pieces = [_piece(epoch, queue, modulus=int(state["world_size"]), residue=int(state["rank"]))] if queue else []
    if pieces:
        pieces[0].update(rows=int(state["rows"]), seen=int(state["seen"]), inner=state["inner"])
    rest = {key: value for key, value in state.items() if key not in ("queue", "rows", "seen", "inner")}
    return {**rest, "pieces": pieces}


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


register_part_kind(STATE_KIND, StreamPart)


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
