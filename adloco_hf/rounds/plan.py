"""One plan per worker per round: what a worker's next round runs, decided once, at the round's end (pure).

An instance's request b (per worker) becomes, for each of its workers, everything the worker's round needs:

- switch mode's plan for each of the worker's G processes (`RoundRules.switch`, applied here and nowhere else in
  the package): b / G per process, capped at `max_batch_size` up to `switch_threshold` × it, accumulated in
  micro-batches above;
- the worker's share of the instance's samples per inner step: the request as switch mode runs it, or with
  `worker_batch_split="speed"` its share of the instance's total (`Instance.shares`), whole: accumulated in
  micro-batches above `max_batch_size`, never capped;
- the learning-rate factor (and the batch Adam's β, ε follow with `lr_batch_scaling="sqrt_adam"`): from the request
  as switch mode runs it, the same on every worker of the instance, so that their pseudo-gradients have the same
  expected size;
- its weight in the instance's average of pseudo-gradients: its share of the instance's samples, or None while every
  worker trains the same batch (the plain mean).

A round as a whole is one value, [`RoundPlan`]: the instance table it runs, every worker's `WorkerPlan`, its inner
steps H and the merge carried out before it. Two pure functions make one: [`first_plan`] (the first round of a run or
of a resume, from the table and the rules) and `rounds.decision.decide_round` (every next round, from the reports of
the round that ended); the worker applies it in one place (`RoundEnd.apply`), at the start and at every round's end.
The round's line reports the plan that ran next to the request for the next round.
"""

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from ..batch.lr_scaling import batch_ratio, lr_factor
from ..batch.switch_mode import BatchPlan, SwitchMode
from ..instances.table import Instance, MergePlan
from .rules import RoundRules


__all__ = ["RoundPlan", "WorkerPlan", "first_plan", "plan_instance", "plan_round", "process_plan"]


@dataclass(frozen=True)
class WorkerPlan:
    """One worker's next round, as the round's decision planned it.

    Attributes:
        instance: the instance the worker trains in the round.
        request: the instance's per-worker request b (a multiple of G).
        process: what each of the worker's G processes runs per inner step: the batch its sampler draws and how it
            is cut into micro-batches.
        share: the worker's samples per inner step (G × `process.batch_size`).
        batch_ratio: κ, the batch that the learning rate (and Adam's hyperparameters) follow over a process's
            initial request: the request as switch mode runs it per process, the same on every worker of the instance.
        lr_factor: the multiplier of the scheduler's base learning rates, from κ (1 with `lr_batch_scaling="none"`).
        sample_weight: the worker's weight in its instance's average of pseudo-gradients, or None for the plain mean
            (every worker trains the same batch).
    """

    instance: int
    request: int
    process: BatchPlan
    share: int
    batch_ratio: float
    lr_factor: float
    sample_weight: float | None = None

    @property
    def accumulates(self) -> bool:
        return self.process.accumulates


def process_plan(per_process: int, rules: RoundRules, *, capped: bool = True) -> BatchPlan:
    """Switch mode for one process: `per_process` samples per inner step as `plan_batch` runs them (`capped`: the
    request's band between `max_batch_size` and `switch_threshold` × it runs as `max_batch_size`; otherwise every
    sample runs, accumulated above `max_batch_size`)."""
    switch = rules.switch if capped else SwitchMode(rules.switch.max_batch_size, 1.0)
    return switch.plan(max(1, per_process))


def plan_instance(instance: Instance, rules: RoundRules) -> dict[int, WorkerPlan]:
    """The plan of every worker of `instance` for a round run with its current request and shares."""
    g = rules.processes_per_worker
    requested = process_plan(instance.batch_size // g, rules)
    used = g * requested.batch_size
    split = instance.split(used)
    equal = len(set(split)) == 1
    ratio = batch_ratio(requested.batch_size, rules.reference_batch_size)
    factor = lr_factor(rules.lr_batch_scaling, ratio)
    plans = {}
    for worker, share in zip(instance.workers, split):
        process = requested if share == used else process_plan(share // g, rules, capped=False)
        plans[worker] = WorkerPlan(
            instance=instance.id,
            request=instance.batch_size,
            process=process,
            share=g * process.batch_size,
            batch_ratio=ratio,
            lr_factor=factor,
            sample_weight=None if equal else share / sum(split),
        )
    return plans


def plan_round(instances: list[Instance], rules: RoundRules) -> dict[int, WorkerPlan]:
    """Every worker's plan (worker id → plan) for a round run by the instance table `instances`."""
    plans = {}
    for instance in instances:
        plans.update(plan_instance(instance, rules))
    return plans


@dataclass(frozen=True)
class RoundPlan:
    """A round, decided before it runs, the same on every rank (module docstring).

    Attributes:
        instances: the instance table the round runs (requests, workers, shares, each instance's averages).
        workers: every worker's plan for the round (worker id → [`WorkerPlan`]), made from `instances`.
        inner_steps: the round's inner steps H (None where the decision was not told H: the decision alone, in tests).
        merge: the merge carried out before the round, at the end of the round before it (None: none).
    """

    instances: tuple[Instance, ...]
    workers: Mapping[int, WorkerPlan]
    inner_steps: int | None
    merge: MergePlan | None = None

    def __post_init__(self):
        object.__setattr__(self, "instances", tuple(self.instances))
        object.__setattr__(self, "workers", MappingProxyType(dict(self.workers)))

    def worker(self, worker_id: int) -> WorkerPlan:
        """The plan of worker `worker_id`."""
        return self.workers[worker_id]


def first_plan(instances: list[Instance], rules: RoundRules, *, inner_steps: int) -> RoundPlan:
    """The plan of a run's first round, or of the first round after a resume: `instances` as they start (the initial
    requests or the startup profile's, `rounds/first_round.py`; a checkpoint's table on a resume), no merge."""
    return RoundPlan(instances=tuple(instances), workers=plan_round(instances, rules), inner_steps=inner_steps)
