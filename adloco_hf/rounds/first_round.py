"""The first round's requests from the startup profile (pure; the same on every rank).

Without a profile the goodput rule runs its first round at the initial request (`per_device_train_batch_size`) and
learns the step times and the noise as it goes. With one (`goodput_timing="startup"` or `"startup_live"`,
`batch/startup_profile.py`), every instance starts at the request of the highest goodput under the profile's step and
round costs for its number of workers and the noise scale of one gradient-statistics estimate on its workers'
probe batches. The reference of the statistical efficiency and the base of the learning-rate scaling stay the
initial request; the request stays within [`batch_size_floor`, the cap or the rule's own bound], with the rule's
hysteresis against keeping the initial request. The estimate is used for this choice only: the instance's moving
averages of the statistics start with the first round's, measured on the weights being trained.
"""

import math
from dataclasses import dataclass, replace

from ..batch.goodput import GoodputChoice
from ..batch.size_tests import GradientStatistics, pool_statistics
from ..batch.startup_profile import StartupProfile
from ..instances.table import Instance
from .decision import goodput_choice
from .rules import RoundRules


__all__ = ["FirstRound", "first_round"]


@dataclass(frozen=True)
class FirstRound:
    """The instance table the first round runs, and per instance the noise scale of the startup estimate and the
    goodput rule's choice (None: the initial request stays, for want of a noise scale or a timing)."""

    instances: list[Instance]
    noise_scales: dict[int, float]
    choices: dict[int, GoodputChoice | None]


def first_round(
    instances: list[Instance],
    statistics: list[GradientStatistics],
    profile: StartupProfile,
    rules: RoundRules,
    *,
    inner_steps: int,
) -> FirstRound:
    """Every instance's first request (module docstring).

    Args:
        instances: the initial table (every instance at the initial request).
        statistics: every rank's startup estimate, in rank order (`GradientStatistics.missing()` where none).
        profile: the run's startup profile.
        rules: the round's settings.
        inner_steps: H of the first round.
    """
    g = rules.processes_per_worker
    live = rules.controller.goodput_timing == "startup_live"
    table, scales, choices = [], {}, {}
    for inst in instances:
        members = [statistics[w * g + local] for w in inst.workers for local in range(g)]
        pooled = pool_statistics(members)
        scale = pooled.variance / pooled.signal if pooled.workers and pooled.signal > 0 else math.nan
        scales[inst.id] = scale
        choice = goodput_choice(inst, scale, profile.step_model(len(inst.workers)), rules, inner_steps=inner_steps)
        choices[inst.id] = choice
        first = inst if choice is None else inst.with_batch_size(g * math.ceil(choice.request / g))
        if live:  # the rounds' timings average from the profile's
            first = replace(first, throughput=profile.throughput_profile(len(inst.workers)))
        table.append(first)
    return FirstRound(instances=table, noise_scales=scales, choices=choices)
