"""Measuring the startup profile (`batch/startup_profile.py`) before the first round, without changing training.

Every rank runs the same steps in the same order (they are collective):

1. global rank 0 looks the profile up in the cache (`batch/profile_cache.py`; not with a virtual clock) and tells the
   others whether it found it;
2. unless it did, every process times two forward/backward passes at each of the profile's sizes (the faster one
   counts: the first pass of a shape may include compiling it) and two all-reduces over every worker, of a small
   message and of 1/16 of its pseudo-gradient's payload (a barrier before each, so that none times the others'
   arrival);
3. every process takes one gradient-statistics estimate on a batch of two halves of the largest size (the inner
   steps' own statistics hooks: `batch/grad_stats.py`);
4. one all-gather: the profile is every rank's numbers taken at the slowest (or rank 0's cached ones), the same on
   every rank; each rank's statistics come back for the first request (`rounds/first_round.py`).

Training does not see any of it: the examples are not drawn from the sampler (`trainer/inner_step.py`'s
`StartupProbe`: its own generator), every random generator is put back as it was, the gradients are cleared, no
optimizer, scheduler or scaler steps. A run with the profile trains the same batches as one without it, bit for bit.
"""

import contextlib
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import torch
import torch.distributed as dist

from ..common.clock import Clock
from ..common.distributed import all_gather_rows, comm_device, is_distributed
from ..common.inputs import split_inputs
from ..common.rng import get_rng_state, set_rng_state
from .grad_stats import GradientStatisticsCollector
from .size_tests import GradientStatistics
from .startup_profile import (
    MAX_PROBE_BYTES,
    PROBE_FRACTION,
    SMALL_PROBE_BYTES,
    LinkFit,
    StartupProfile,
    fit_link,
)


__all__ = ["ProfilePlan", "StartupMeasurement", "StartupProbePasses", "measure_startup_profile"]


class StartupProbePasses(Protocol):
    """The Trainer's side (`trainer/inner_step.py`'s `StartupProbe`)."""

    model: torch.nn.Module

    def inputs(self, size: int) -> dict[str, Any]:
        """`size` examples that training does not draw, prepared as the Trainer prepares a batch."""

    def first_inputs(self) -> dict[str, Any]:
        """The dataset's first example as a batch (its shape, for the cache's key), drawing from no generator."""

    def forward_backward(self, inputs: dict[str, Any], samples: int, batch: int) -> torch.Tensor:
        """Forward and backward of `inputs` (`samples` of a step of `batch`)."""

    def zero_grad(self) -> None:
        """Clear the model's gradients."""


@dataclass(frozen=True)
class ProfilePlan:
    """What a startup profile measures.

    Attributes:
        sizes: the micro-batch sizes to time (`startup_profile.profile_sizes`), ascending.
        payload_bytes: what this process sends into its instance's all-reduce of pseudo-gradients.
        workers: the workers of the run (the link probe's ring).
        statistics: whether to take a gradient-statistics estimate (two halves of the largest size).
        key: what the profile depends on (`profile_cache.profile_key`), or None not to use the cache.
    """

    sizes: tuple[int, ...]
    payload_bytes: int
    workers: int
    statistics: bool
    key: dict | None


@dataclass(frozen=True)
class StartupMeasurement:
    """The agreed profile, and every rank's statistics estimate (in rank order; missing where none was taken)."""

    profile: StartupProfile
    statistics: list[GradientStatistics]


def measure_startup_profile(
    plan: ProfilePlan,
    probe: StartupProbePasses,
    *,
    clock: Clock,
    collector: GradientStatisticsCollector,
    no_sync: Callable[[torch.nn.Module], contextlib.AbstractContextManager],
    link_group,
    device: torch.device,
    loss_scale: Callable[[], float],
    rank: int,
    cached: Callable[[], StartupProfile | None],
    store: Callable[[StartupProfile], None],
) -> StartupMeasurement:
    """The module docstring's steps (collective: every rank).

    Args:
        plan: what to measure.
        probe: the Trainer's passes on examples training does not draw.
        clock: the worker's clock (a virtual one prices what is announced).
        collector: the inner steps' statistics hooks.
        no_sync: a context that keeps a backward's gradient local to this process (DDP inside a worker).
        link_group: this local rank's group over every worker (the link probe's ring).
        device: the worker's device.
        loss_scale: the fp16 loss scale now (1 otherwise).
        rank: this process's global rank.
        cached: rank 0's cache lookup (called on rank 0 only, when `plan.key` is set).
        store: rank 0's cache write of a measured profile.
    """
    started = clock.now()
    found = cached() if rank == 0 and plan.key is not None else None
    hit = all_gather_rows([1.0 if found is not None else 0.0], device)[0][0] > 0
    rng = get_rng_state()
    try:
        with no_sync(probe.model), clock.synchronized():
            # The statistics first: they depend on the examples and the dropout masks drawn, which must not depend on
            # whether the timings were measured or read from the cache (a cached run decides as the first one did).
            stats = _statistics(probe, clock, collector, plan.sizes[-1], loss_scale) if plan.statistics else None
            probe.zero_grad()
            if hit:
                measured = [0.0] * (len(plan.sizes) + 2)
            else:
                measured = _passes_seconds(probe, clock, plan.sizes)
                measured += _link(plan, clock, link_group, device)
    finally:
        probe.zero_grad()
        set_rng_state(rng)  # dropout and anything else the passes drew
    if found is not None:
        measured = [s for _, s in found.passes] + ([0.0, 0.0] if found.link is None else
                                                   [found.link.hop_seconds, found.link.byte_seconds])  # fmt: skip
    row = measured + (stats or GradientStatistics.missing()).as_list()
    rows = all_gather_rows(row, device)
    width = len(measured)
    values = rows[0][:width] if hit else StartupProfile.agreed([r[:width] for r in rows])
    source = "measured" if not hit else found.source if found is not None else "rank 0's cache"
    profile = _profile(plan, values, source=source, seconds=clock.now() - started)
    if rank == 0 and not hit and plan.key is not None:
        store(profile)
    statistics = [GradientStatistics.from_list(r[width:]) for r in rows]
    return StartupMeasurement(profile=profile, statistics=statistics)


def _profile(plan: ProfilePlan, values: list[float], *, source: str, seconds: float) -> StartupProfile:
    n = len(plan.sizes)
    passes = tuple(zip(plan.sizes, values[:n]))
    hop, byte = values[n], values[n + 1]
    link = None if plan.workers <= 1 else LinkFit(hop, byte)
    return StartupProfile(
        passes=passes, link=link, payload_bytes=plan.payload_bytes, seconds=seconds, source=source, key=plan.key or {}
    )


def _passes_seconds(probe: StartupProbePasses, clock: Clock, sizes: tuple[int, ...], repeats: int = 2) -> list[float]:
    """Per size, the fastest of `repeats` passes (each on fresh examples, gradients cleared after): the sizes in turn,
    `repeats` times over, so that a machine whose load changes meanwhile slows every size alike; other work only ever
    adds time, so the fastest pass is the closest to the device's own."""
    best = [math.inf] * len(sizes)
    for _ in range(repeats):
        for index, size in enumerate(sizes):
            inputs = probe.inputs(size)
            start = clock.now()
            clock.passes((size,))
            probe.forward_backward(inputs, size, size)
            best[index] = min(best[index], clock.now() - start)
            probe.zero_grad()
    return best


def _link(plan: ProfilePlan, clock: Clock, group, device: torch.device) -> list[float]:
    """The ring's (hop, byte) seconds from two all-reduces over every worker ([0, 0] for a run of one worker)."""
    if plan.workers <= 1 or not is_distributed():
        return [0.0, 0.0]
    large = max(SMALL_PROBE_BYTES * 2, min(MAX_PROBE_BYTES, plan.payload_bytes // PROBE_FRACTION))
    points = [(SMALL_PROBE_BYTES, _all_reduce_seconds(SMALL_PROBE_BYTES, plan.workers, clock, group, device))]
    points.append((large, _all_reduce_seconds(large, plan.workers, clock, group, device)))
    fit = fit_link(points[0], points[1], plan.workers)
    return [fit.hop_seconds, fit.byte_seconds]


def _all_reduce_seconds(payload: int, workers: int, clock: Clock, group, device: torch.device, repeats: int = 2):
    """The fastest of `repeats` all-reduces of `payload` bytes (bfloat16) over `group`, each after a barrier."""
    buffer = torch.zeros(max(1, payload // 2), dtype=torch.bfloat16, device=comm_device(device))
    best = math.inf
    for _ in range(repeats):
        dist.barrier(group=group)
        start = clock.now()
        dist.all_reduce(buffer, group=group)
        clock.all_reduce(workers=workers, payload_bytes=buffer.numel() * buffer.element_size())
        best = min(best, clock.now() - start)
    return best


def _statistics(
    probe: StartupProbePasses,
    clock: Clock,
    collector: GradientStatisticsCollector,
    half: int,
    loss_scale: Callable[[], float],
) -> GradientStatistics | None:
    """One step's gradient statistics on two halves of `2 × half` fresh examples, as an inner step measures them."""
    inputs = probe.inputs(2 * half)
    chunks = split_inputs(inputs, [half, half])
    clock.passes((half, half))
    collector.start([0.5, 0.5], None)
    for index, chunk in enumerate(chunks):
        collector.begin_chunk(index)
        probe.forward_backward(chunk, half, 2 * half)
    return collector.finish(samples=2 * half, loss_scale=loss_scale())
