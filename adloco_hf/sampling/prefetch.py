"""Batches drawn ahead for the DataLoader's worker processes, kept exact while the batch size changes.

A `DataLoader` with `num_workers=N` and `prefetch_factor=p` draws its batches from the batch sampler in the main
process, up to `N × p` of them before training takes the first, and one more each time training takes one. AdLoCo's
samplers change their batch size at a round's end, after the round's last step took its batch: by then up to `N × p`
batches of the old size are in the loader processes' queues. Every batch a sampler plans is therefore recorded in
flight ([`PlannedBatches`], a part each sampler owns) with the sampler's position before it, until the training loop
receives it. A change of size marks every batch in flight stale and moves the sampler back to the position before the
first of them (its `rewind`: `AdaptiveBatchSampler` restores the position, `AdaptiveStreamSampler` puts their examples
back in front of its stream); the loader drops the stale batches as they arrive. So every step trains on the batch it
would with 0 loader processes, a change of size costs one refill of the queue (the stale batches were fetched and
collated for nothing), and the loader processes live on: nothing is respawned. The state a checkpoint saves is the
position before the first batch still in flight: what training consumed, not what the loader prefetched.

Batches arrive in the order they were planned (`in_order=True`, which AdLoCo requires), so the oldest batch in
flight is always the one the loader hands over next.
"""

import dataclasses
import functools
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any, Protocol

from torch.utils.data import DataLoader
from transformers.trainer_utils import seed_worker


__all__ = ["AdaptiveDataLoader", "AdaptiveSampler", "LoaderSettings", "PlannedBatches", "positive_batch_size"]


def positive_batch_size(value) -> int:
    """`value` as an int, refused unless it is a positive integer (a sampler's batch size)."""
    if int(value) != value or value < 1:
        raise ValueError(f"batch_size must be a positive integer, got {value}")
    return int(value)


@dataclasses.dataclass
class _Planned:
    before: Any  # the sampler's position before this batch was drawn
    batch: list  # what was drawn (a stream puts it back on a change of size)
    live: bool = True  # False once a change of size re-planned it: the loader drops it when it arrives


class PlannedBatches:
    """A sampler's batch size and the batches it planned that the training loop has not received yet, oldest first.

    Each adaptive sampler owns one and hands it its moves at construction: `position()` (where the sampler stands,
    before a batch is drawn), `rewind(before, batches)` (back to `before`, from where `batches` were drawn, which
    training never received), `draw()` (the next batch, at `batch_size`), and optionally `remember(position)` (keep
    what restoring a position behind the sampler's needs, when a loader draws ahead) and `received(consumed)`
    (training received a batch: `consumed` is the position before the batches still in flight). A change of
    `batch_size` re-plans the batches in flight: they are marked stale, and the sampler moves back before them.

    Example:
    ```python
    >>> drawn = []  # a sampler of consecutive numbers: its position is how many it drew
    >>> def draw():
    ...     drawn.extend(range(len(drawn), len(drawn) + planned.batch_size))
    ...     return drawn[-planned.batch_size :]
    >>> def rewind(before, batches):
    ...     del drawn[before:]
    >>> planned = PlannedBatches(2, position=lambda: len(drawn), rewind=rewind, draw=draw)
    >>> batches = planned.batches(keep_positions=True)
    >>> next(batches), next(batches)  # a loader draws ahead
    ([0, 1], [2, 3])
    >>> planned.take()  # training receives the first
    True
    >>> planned.batch_size = 3  # the second is stale: the loader drops it, and it is drawn again at the new size
    >>> planned.take(), next(batches)
    (False, [2, 3, 4])
    ```
    """

    def __init__(
        self,
        batch_size: int,
        *,
        position: Callable[[], Any],
        rewind: Callable[[Any, list[list]], None],
        draw: Callable[[], list],
        remember: Callable[[Any], None] | None = None,
        received: Callable[[Any], None] | None = None,
    ):
        self._batch_size = positive_batch_size(batch_size)
        self._planned: deque[_Planned] = deque()
        self._position, self._rewind, self._draw = position, rewind, draw
        self._remember, self._received = remember, received

    @property
    def batch_size(self) -> int:
        return self._batch_size

    @batch_size.setter
    def batch_size(self, value: int) -> None:
        value = positive_batch_size(value)
        if value != self._batch_size:  # batches drawn ahead at the old size are drawn again at the new one
            self._move_back(self._mark_stale())
        self._batch_size = value

    def __len__(self) -> int:
        return len(self._planned)

    def live(self) -> list[_Planned]:
        """The live batches in flight, oldest first (they are always the newest: stale ones were planned before)."""
        return [planned for planned in self._planned if planned.live]

    def batches(self, keep_positions: bool) -> Iterator[list]:
        """Batches drawn for a DataLoader, each in flight until `take`. `keep_positions`: the loader draws ahead
        (worker processes), so positions behind the sampler's may be asked for (`remember`)."""
        while True:
            before = self._position()
            if keep_positions and self._remember is not None:
                self._remember(before)
            batch = self._draw()
            self._planned.append(_Planned(before, batch))
            yield batch

    def take(self) -> bool:
        """The loader hands the oldest planned batch to training: True if it is still live, False if stale."""
        if not self._planned:
            raise RuntimeError("the DataLoader returned a batch that its adaptive sampler never planned")
        live = self._planned.popleft().live
        if self._received is not None:
            self._received(self.consumed_position())
        return live

    def consumed_position(self) -> Any:
        """The position before the first live batch in flight (what training consumed), or the sampler's own."""
        live = self.live()
        return live[0].before if live else self._position()

    def forget(self) -> None:
        """A new iteration of the loader: nothing in flight arrives any more, so the sampler draws it again."""
        live = self.live()
        self._planned.clear()
        self._move_back(live)

    def drop(self) -> None:
        """A loaded position replaces whatever was drawn ahead: forget it without moving the sampler."""
        self._planned.clear()

    def _mark_stale(self) -> list[_Planned]:
        live = self.live()
        for planned in live:
            planned.live = False
        return live

    def _move_back(self, planned: list[_Planned]) -> None:
        if planned:
            self._rewind(planned[0].before, [item.batch for item in planned])


class AdaptiveSampler(Protocol):
    """What an [`AdaptiveDataLoader`] uses of its sampler (`AdaptiveBatchSampler`, `AdaptiveStreamSampler`): its
    `planned` batches; the worker sets its `batch_size` and saves its `state_dict()`."""

    batch_size: int

    @property
    def planned(self) -> PlannedBatches: ...

    def state_dict(self) -> dict[str, Any]: ...


@dataclasses.dataclass(frozen=True)
class LoaderSettings:
    """The Trainer's `dataloader_*` settings that AdLoCo's training loader honours (built once by `from_args`).

    `num_workers` is `dataloader_num_workers`: loader processes, not AdLoCo workers."""

    num_workers: int = 0
    prefetch_factor: int | None = None
    persistent_workers: bool = False
    pin_memory: bool = False
    multiprocessing_context: str | None = None

    @classmethod
    def from_args(cls, args) -> "LoaderSettings":
        return cls(
            num_workers=args.dataloader_num_workers,
            prefetch_factor=args.dataloader_prefetch_factor,
            persistent_workers=args.dataloader_persistent_workers,
            pin_memory=args.dataloader_pin_memory,
            multiprocessing_context=getattr(args, "dataloader_multiprocessing_context", None),
        )

    def dataloader_kwargs(self, rank: int) -> dict[str, Any]:
        """`DataLoader` arguments; each loader process seeded as the Trainer seeds its own (`seed_worker`)."""
        kwargs: dict[str, Any] = {"num_workers": self.num_workers, "pin_memory": self.pin_memory}
        if self.num_workers > 0:
            kwargs.update(
                prefetch_factor=self.prefetch_factor,
                persistent_workers=self.persistent_workers,
                multiprocessing_context=self.multiprocessing_context,
                worker_init_fn=functools.partial(seed_worker, num_workers=self.num_workers, rank=rank),
            )
        return kwargs


class _LoaderBatches:
    """The `batch_sampler` an [`AdaptiveDataLoader`] iterates: the sampler's planned batches."""

    def __init__(self, planned: PlannedBatches, keep_positions: bool):
        self.planned, self.keep_positions = planned, keep_positions

    def __iter__(self) -> Iterator[list]:
        return self.planned.batches(self.keep_positions)


class AdaptiveDataLoader(DataLoader):
    """A `DataLoader` over an adaptive sampler (`sampler.py`, `stream_sampler.py`) whose batches may be prefetched by
    worker processes: each batch it yields is the one the sampler planned for that step, at the size of that step.

    `adaptive_sampler` is the sampler (the worker sets its `batch_size`; its `state_dict()` is what training
    consumed). Without worker processes it draws each batch when training asks for it, as a plain `DataLoader`.
    """

    def __init__(self, dataset, sampler: AdaptiveSampler, *, collate_fn, settings: LoaderSettings, rank: int):
        keep = settings.num_workers > 0
        super().__init__(
            dataset,
            batch_sampler=_LoaderBatches(sampler.planned, keep),
            collate_fn=collate_fn,
            **settings.dataloader_kwargs(rank),
        )
        self.adaptive_sampler = sampler

    def __iter__(self) -> Iterator:
        self.adaptive_sampler.planned.forget()  # an earlier iteration's batches in flight will never arrive
        return self._received(super().__iter__())

    def _received(self, batches: Iterator) -> Iterator:
        planned = self.adaptive_sampler.planned
        for batch in batches:
            if planned.take():
                yield batch
