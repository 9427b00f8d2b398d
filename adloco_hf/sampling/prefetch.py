"""Batches drawn ahead for the DataLoader's worker processes, kept exact while the batch size changes.

A `DataLoader` with `num_workers=N` and `prefetch_factor=p` draws its batches from the batch sampler in the main
process, up to `N × p` of them before training takes the first, and one more each time training takes one. AdLoCo's
samplers change their batch size at a round's end, after the round's last step took its batch: by then up to `N × p`
batches of the old size are in the loader processes' queues. Every batch the sampler plans is therefore recorded in
flight ([`InFlight`]) with the sampler's position before it, until the training loop receives it. A change of size
marks every batch in flight stale and moves the sampler back to the position before the first of them (`rewind`:
`AdaptiveBatchSampler` restores the position, `AdaptiveStreamSampler` puts their examples back in front of its
stream); the loader drops the stale batches as they arrive. So every step trains on the batch it would with 0 loader
processes, a change of size costs one refill of the queue (the stale batches were fetched and collated for nothing),
and the loader processes live on: nothing is respawned. The state a checkpoint saves is the position before the
first batch still in flight: what training consumed, not what the loader prefetched.

Batches arrive in the order they were planned (`in_order=True`, which AdLoCo requires), so the oldest batch in
flight is always the one the loader hands over next.
"""

import dataclasses
import functools
from collections import deque
from collections.abc import Iterator
from typing import Any

from torch.utils.data import DataLoader
from transformers.trainer_utils import seed_worker


__all__ = ["AdaptiveDataLoader", "InFlight", "LoaderSettings", "PlansAhead"]


@dataclasses.dataclass
class _Planned:
    before: Any  # the sampler's position before this batch was drawn
    batch: list  # what was drawn (a stream puts it back on a change of size)
    live: bool = True  # False once a change of size re-planned it: the loader drops it when it arrives


class InFlight:
    """The batches a sampler has planned and the training loop has not received yet, oldest first."""

    def __init__(self):
        self._planned: deque[_Planned] = deque()

    def __len__(self) -> int:
        return len(self._planned)

    def add(self, before: Any, batch: list) -> None:
        self._planned.append(_Planned(before, batch))

    def take(self) -> bool:
        """The loader hands the oldest planned batch to training: True if it is still live, False if stale."""
        if not self._planned:
            raise RuntimeError("the DataLoader returned a batch that its adaptive sampler never planned")
        return self._planned.popleft().live

    def live(self) -> list[_Planned]:
        """The live batches in flight, oldest first (they are always the newest: stale ones were planned before)."""
        return [planned for planned in self._planned if planned.live]

    def consumed_position(self) -> Any:
        """The position before the first live batch in flight (what training consumed), or None when none is."""
        live = self.live()
        return live[0].before if live else None

    def replan(self) -> list[_Planned]:
        """Mark every live batch stale and return them (the sampler moves back before the first)."""
        live = self.live()
        for planned in live:
            planned.live = False
        return live

    def forget(self) -> list[_Planned]:
        """A new iteration of the loader: nothing in flight arrives any more. Returns the live batches."""
        live = self.live()
        self._planned.clear()
        return live


class PlansAhead:
    """What a sampler needs to be drawn ahead by a DataLoader's worker processes ([`AdaptiveDataLoader`]).

    A sampler using it sets `self._in_flight = InFlight()` and defines `_position()` (where it stands, before a batch
    is drawn), `_rewind(planned)` (back to before the first of those batches, which training never received) and
    `next_batch()`. Its `batch_size` setter calls `_replan()` when the size changes."""

    _in_flight: InFlight

    def planned_batches(self, keep_positions: bool = False) -> Iterator[list]:
        """Batches drawn for a DataLoader, each recorded in flight until `take_planned`. `keep_positions`: the
        loader draws ahead (worker processes), so positions behind the sampler's may be asked for (`_remember`)."""
        while True:
            before = self._position()
            if keep_positions:
                self._remember(before)
            batch = self.next_batch()
            self._in_flight.add(before, batch)
            yield batch

    def take_planned(self) -> bool:
        """The training loop receives the oldest planned batch; False: it is stale, drop it."""
        live = self._in_flight.take()
        self._consumed_moved()
        return live

    def forget_planned(self) -> None:
        """The loader starts a new iteration: what was in flight will not arrive, so draw it again."""
        self._rewind(self._in_flight.forget())

    def _replan(self) -> None:
        if getattr(self, "_in_flight", None) is not None:
            self._rewind(self._in_flight.replan())

    def _consumed_position(self) -> Any:
        position = self._in_flight.consumed_position()
        return self._position() if position is None else position

    def _remember(self, position: Any) -> None:
        """Hook: keep what restoring `position` needs (nothing for a position that is its own state)."""

    def _consumed_moved(self) -> None:
        """Hook: training received a batch; what was kept for positions before it can go."""


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


class _PlannedBatches:
    """The `batch_sampler` an [`AdaptiveDataLoader`] iterates: the sampler's `planned_batches`."""

    def __init__(self, sampler: PlansAhead, keep_positions: bool):
        self.sampler, self.keep_positions = sampler, keep_positions

    def __iter__(self) -> Iterator[list]:
        return self.sampler.planned_batches(self.keep_positions)


class AdaptiveDataLoader(DataLoader):
    """A `DataLoader` over an adaptive sampler (`sampler.py`, `stream_sampler.py`) whose batches may be prefetched by
    worker processes: each batch it yields is the one the sampler planned for that step, at the size of that step.

    `adaptive_sampler` is the sampler (the worker sets its `batch_size`; its `state_dict()` is what training
    consumed). Without worker processes it draws each batch when training asks for it, as a plain `DataLoader`.
    """

    def __init__(self, dataset, sampler: PlansAhead, *, collate_fn, settings: LoaderSettings, rank: int):
        keep = settings.num_workers > 0
        super().__init__(
            dataset,
            batch_sampler=_PlannedBatches(sampler, keep),
            collate_fn=collate_fn,
            **settings.dataloader_kwargs(rank),
        )
        self.adaptive_sampler = sampler

    def __iter__(self) -> Iterator:
        self.adaptive_sampler.forget_planned()  # an earlier iteration's batches in flight will never arrive
        return self._received(super().__iter__())

    def _received(self, batches: Iterator) -> Iterator:
        sampler = self.adaptive_sampler
        for batch in batches:
            if sampler.take_planned():
                yield batch
