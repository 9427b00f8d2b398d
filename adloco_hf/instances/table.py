"""Multi-instance training (AdLoCo §4.1): the instance table, merge choice, worker redistribution (all pure).

Every rank computes these decisions from the same all-gathered numbers, so they agree without further messages.
The demand of an instance is d_i = b_i × workers(i) (its samples per inner step). A merge replaces two instances by
the one with the larger demand, with weights and outer momentum averaged in proportion to demand; it keeps its own
per-worker request and inherits the demand of both. Workers are then redistributed in proportion to demand.

An instance whose every round was skipped (non-finite pseudo-gradients) since the start still holds the weights it
started from: it enters a merge, and the final merge, with weight 0, since averaging those weights in would only
pull the other instance back towards its starting point (a run with one dead worker merged 9 % of the initial
weights into its trained instance). An instance with no progress since its last merge keeps its demand's weight:
its weights are that merge's, which hold the training before it (see `instances/health.py` for the warnings and the stop).
"""

import math
from dataclasses import dataclass, field, replace

from ..batch.controller import NoiseEstimate
from ..batch.throughput import ThroughputProfile
from ..config.choices import MERGE_BATCH_RULES


__all__ = [
    "Instance",
    "MERGE_BATCH_RULES",
    "final_merge_weights",
    "MergePlan",
    "choose_merge",
    "initial_instances",
    "instance_of",
    "merge_is_due",
    "plan_merge",
    "reassign_workers",
    "redistribute",
    "seat_counts",
]


@dataclass(frozen=True)
class Instance:
    """One row of the instance table.

    Attributes:
        id: stable identifier (instances keep their id through merges; merged-away ids are not reused).
        workers: its workers' ids, ascending; the first one is its *first worker*. A worker id is the global rank
            with one process per worker, else rank // processes_per_worker (`common/layout.py`).
        batch_size: b_i, its per-worker request.
        demand: d_i; by default b_i × workers, after a merge the sum of both demands.
        skipped_in_a_row: rounds skipped in a row (non-finite pseudo-gradient) up to the last one; a merge keeps
            the survivor's.
        rounds_since_merge: rounds since the start, or since it survived its last merge.
        trained: whether a round has moved its weights since the start (its own, or one of an instance merged
            into it).
        noise: the moving averages of its gradient statistics (`batch_controller.NoiseEstimate`).
        shares: with `worker_batch_split="speed"`, each worker's samples per inner step (in `workers` order), the
            instance's total split by speed (`batch/worker_split.py`); empty: every worker runs the request.
        throughput: the moving averages of its measured step and round costs (`batch/throughput.py`; kept with
            `batch_size_target="goodput"` only, empty otherwise).
    """

    id: int
    workers: tuple[int, ...]
    batch_size: int
    demand: float = field(default=-1.0)
    skipped_in_a_row: int = 0
    rounds_since_merge: int = 0
    trained: bool = False
    noise: NoiseEstimate = field(default_factory=NoiseEstimate)
    shares: tuple[int, ...] = ()
    throughput: ThroughputProfile = field(default_factory=ThroughputProfile)

    def __post_init__(self):
        if not self.workers:
            raise ValueError(f"instance {self.id} has no worker")
        if self.shares and len(self.shares) != len(self.workers):
            raise ValueError(f"instance {self.id} has {len(self.workers)} workers but {len(self.shares)} shares")
        order = sorted(range(len(self.workers)), key=lambda k: self.workers[k])
        object.__setattr__(self, "workers", tuple(self.workers[k] for k in order))
        if self.shares:
            object.__setattr__(self, "shares", tuple(int(self.shares[k]) for k in order))
        if self.demand < 0:
            object.__setattr__(self, "demand", float(self.batch_size * len(self.workers)))

    @property
    def first_worker(self) -> int:
        return self.workers[0]

    def with_batch_size(self, batch_size: int) -> "Instance":
        return replace(self, batch_size=batch_size, demand=float(batch_size * len(self.workers)))

    def after_round(
        self,
        batch_size: int,
        *,
        skipped: bool,
        noise: NoiseEstimate | None = None,
        throughput: ThroughputProfile | None = None,
    ) -> "Instance":
        """The row after a round that was (or was not) skipped, with the next request (and the averages of its
        statistics and step costs)."""
        return replace(
            self.with_batch_size(batch_size),
            skipped_in_a_row=self.skipped_in_a_row + 1 if skipped else 0,
            rounds_since_merge=self.rounds_since_merge + 1,
            trained=self.trained or not skipped,
            noise=self.noise if noise is None else noise,
            throughput=self.throughput if throughput is None else throughput,
        )

    def split(self, used: int) -> tuple[int, ...]:
        """Each worker's samples per inner step (in `workers` order) when the request runs as `used` samples per
        worker: its `shares` while they split exactly the instance's total (`used` × workers), else `used` each."""
        if self.shares and sum(self.shares) == used * len(self.workers):
            return self.shares
        return (used,) * len(self.workers)

    @property
    def made_no_progress(self) -> bool:
        """Every round since the start, or since its last merge, was skipped (and there was at least one)."""
        return 0 < self.rounds_since_merge <= self.skipped_in_a_row

    def to_row(self) -> list:
        """The row a checkpoint stores (`from_row` reads it back)."""
        row = [self.id, self.batch_size, self.demand, list(self.workers)]
        row += [self.skipped_in_a_row, self.rounds_since_merge, self.trained, self.noise.to_list()]
        row += [self.throughput.to_list()]
        return row + [list(self.shares)] if self.shares else row

    @classmethod
    def from_row(cls, row: list) -> "Instance":
        """A checkpoint's row; one written before the skip counts existed reads as trained, with none skipped, one
        written before the step costs were kept with an empty profile, and one without shares (an equal split, or
        written before shares existed) with none."""
        instance_id, batch_size, demand, workers, *health = row
        skipped, since_merge, trained, *noise = health or (0, 0, True)
        shares = tuple(int(x) for x in noise[2]) if len(noise) > 2 else ()
        return cls(
            instance_id,
            tuple(workers),
            int(batch_size),
            float(demand),
            int(skipped),
            int(since_merge),
            bool(trained),
            NoiseEstimate.from_list(noise[0] if noise else None),
            shares=shares,
            throughput=ThroughputProfile.from_list(noise[1] if len(noise) > 1 else None),
        )


def initial_instances(num_workers: int, num_instances: int, batch_size: int) -> list[Instance]:
    """K instances over P workers, worker r in instance r mod K."""
    if not 1 <= num_instances <= num_workers:
        raise ValueError(
            f"num_instances={num_instances} needs between 1 and {num_workers} (the number of workers) instances; "
            f"lower num_instances or launch at least {num_instances} processes"
        )
    return [Instance(i, tuple(range(i, num_workers, num_instances)), batch_size) for i in range(num_instances)]


def instance_of(instances: list[Instance], rank: int) -> Instance:
    for instance in instances:
        if rank in instance.workers:
            return instance
    raise KeyError(f"rank {rank} belongs to no instance")


def merge_is_due(outer_step: int, merge_every: int, num_instances: int) -> bool:
    return merge_every > 0 and num_instances > 1 and outer_step % merge_every == 0


def choose_merge(instances: list[Instance], policy: str = "smallest_pair") -> tuple[int, int]:
    """The pair to merge, as (survivor id, merged-away id).

    `smallest_pair` takes the two instances with the smallest demand (the paper's policy); `largest_smallest` the
    largest with the smallest. Ties go to the lower id. The survivor is the one with the larger demand (the lower id
    on a tie).
    """
    if len(instances) < 2:
        raise ValueError("merging needs at least two instances")
    by_demand = sorted(instances, key=lambda inst: (inst.demand, inst.id))
    if policy == "smallest_pair":
        a, b = by_demand[0], by_demand[1]
    elif policy == "largest_smallest":
        a = by_demand[0]
        b = sorted((i for i in instances if i.id != a.id), key=lambda inst: (-inst.demand, inst.id))[0]
    else:
        raise ValueError(f"unknown merge_policy {policy!r}")
    survivor, merged = sorted((a, b), key=lambda inst: (-inst.demand, inst.id))
    return survivor.id, merged.id


def seat_counts(demands: dict[int, float], num_workers: int) -> dict[int, int]:
    """Workers per instance in proportion to demand: largest remainder, at least one each, ties to the lower id."""
    if len(demands) > num_workers:
        raise ValueError(f"{len(demands)} instances cannot share {num_workers} workers")
    total = sum(demands.values())
    quota = {i: num_workers * d / total for i, d in demands.items()}
    seats = {i: max(1, math.floor(q)) for i, q in quota.items()}
    while sum(seats.values()) < num_workers:
        best = min(seats, key=lambda i: (-(quota[i] - seats[i]), i))
        seats[best] += 1
    while sum(seats.values()) > num_workers:
        candidates = [i for i in seats if seats[i] > 1]
        worst = min(candidates, key=lambda i: (quota[i] - seats[i], -i))
        seats[worst] -= 1
    return seats


def redistribute(
    instances: list[Instance],
    num_workers: int,
    keep_order: dict[int, list[int]] | None = None,
    unassigned: tuple[int, ...] | list[int] = (),
) -> list[Instance]:
    """Reassign all workers in proportion to demand, moving as few as possible.

    Each instance keeps its current workers up to its new seat count, in `keep_order` (default: ascending rank);
    the released workers and the `unassigned` ones (in no instance yet), in ascending order, fill the instances
    that need more, in id order. Demands and requests are unchanged.
    """
    seats = seat_counts({inst.id: inst.demand for inst in instances}, num_workers)
    order = {inst.id: list((keep_order or {}).get(inst.id, inst.workers)) for inst in instances}
    kept = {i: workers[: seats[i]] for i, workers in order.items()}
    released = sorted([w for i, workers in order.items() for w in workers[seats[i] :]] + list(unassigned))
    for inst in sorted(instances, key=lambda x: x.id):
        while len(kept[inst.id]) < seats[inst.id]:
            kept[inst.id].append(released.pop(0))
    # A split by speed belongs to the workers it was planned for: an instance whose workers change runs equal shares
    # until the next round's end plans again.
    return [
        replace(inst, workers=workers, shares=inst.shares if workers == inst.workers else ())
        for inst in instances
        for workers in [tuple(sorted(kept[inst.id]))]
    ]


def reassign_workers(instances: list[Instance], num_workers: int) -> list[Instance]:
    """The instance table for another number of workers (an elastic resume, `checkpoint/elastic.py`).

    Ranks from `num_workers` on leave their instance; every instance keeps its remaining workers (ascending) up to
    its seat count for the new number of workers (`seat_counts`, by demand) and the ranks left over or new fill
    the instances short of seats, as `redistribute` does after a merge. An instance left with no worker gets one.
    Demands and requests are unchanged.
    """
    if len(instances) > num_workers:
        raise ValueError(
            f"{len(instances)} instances cannot share {num_workers} workers: every instance needs a worker; resume "
            f"with at least {len(instances)} workers, or let merges leave at most {num_workers} instances first"
        )
    keep = {inst.id: [w for w in inst.workers if w < num_workers] for inst in instances}
    seated = {w for workers in keep.values() for w in workers}
    unassigned = [rank for rank in range(num_workers) if rank not in seated]
    return redistribute(instances, num_workers, keep, unassigned)


@dataclass(frozen=True)
class MergePlan:
    """One merge: who merges into whom with which weights, and the table afterwards."""

    survivor: int
    merged: int
    weights: tuple[float, float]  # (survivor, merged), summing to 1
    demands: tuple[float, float]
    before: tuple[Instance, ...]
    after: tuple[Instance, ...]


def plan_merge(
    instances: list[Instance],
    *,
    policy: str,
    num_workers: int,
    batch_rule: str = "paper",
    processes_per_worker: int = 1,
    cap: int | None = None,
) -> MergePlan:
    """Choose a pair, weigh it by demand, and redistribute the workers over the remaining instances.

    `batch_rule="paper"`: the survivor keeps its per-worker request while it gains workers, so its total batch grows
    by the ratio of its workers (the paper's code). `"preserve_total"`: every instance keeps its total batch
    (request × workers before the merge; the survivor's for the merged one), and its per-worker request becomes
    ⌈total / workers after⌉: the tests ask for a total, and a merge adds workers, not noise. With
    `processes_per_worker` = G > 1 that request is rounded up to a multiple of G (each process draws 1/G of it). An
    instance that loses workers would see its request rise: `cap` (the controller's, a multiple of G) bounds that
    rise as it bounds the tests' growth (a request already above it is kept, never lowered).
    """
    if batch_rule not in MERGE_BATCH_RULES:
        raise ValueError(f"unknown merge_batch_rule {batch_rule!r}; choose one of {MERGE_BATCH_RULES}")
    survivor_id, merged_id = choose_merge(instances, policy)
    table = {inst.id: inst for inst in instances}
    survivor, merged = table[survivor_id], table[merged_id]
    total = survivor.demand + merged.demand
    weights = (survivor.demand / total, merged.demand / total)
    if survivor.trained != merged.trained:  # the untrained one holds its starting weights (module docstring)
        weights = (1.0, 0.0) if survivor.trained else (0.0, 1.0)
    combined = Instance(
        survivor.id,
        survivor.workers + merged.workers,
        survivor.batch_size,
        demand=total,
        skipped_in_a_row=survivor.skipped_in_a_row,
        trained=survivor.trained or merged.trained,
        noise=NoiseEstimate.combine(survivor.noise, merged.noise, weights),
        throughput=ThroughputProfile.combine(survivor.throughput, merged.throughput, weights),
    )
    remaining = [combined if inst.id == survivor.id else inst for inst in instances if inst.id != merged.id]
    # The survivor's own workers stay first: the merged-away instance's workers change instance anyway.
    after = redistribute(remaining, num_workers, {survivor.id: list(survivor.workers) + list(merged.workers)})
    if batch_rule == "preserve_total":
        totals = {inst.id: inst.batch_size * len(inst.workers) for inst in instances}
        g = processes_per_worker
        requests = {inst.id: g * max(1, math.ceil(totals[inst.id] / len(inst.workers) / g)) for inst in after}
        if cap is not None:
            requests = {i: min(request, max(cap, table[i].batch_size)) for i, request in requests.items()}
        after = [replace(inst, batch_size=requests[inst.id]) for inst in after]
    return MergePlan(
        survivor=survivor.id,
        merged=merged.id,
        weights=weights,
        demands=(survivor.demand, merged.demand),
        before=tuple(instances),
        after=tuple(after),
    )


def final_merge_weights(instances: list[Instance]) -> dict[int, float]:
    """Instance id → its weight in the final merge: demand-weighted over the instances that have trained (over all
    of them when none has); an instance that never trained gets 0 (module docstring)."""
    counted = {inst.id for inst in instances if inst.trained} or {inst.id for inst in instances}
    total = sum(inst.demand for inst in instances if inst.id in counted)
    return {inst.id: inst.demand / total if inst.id in counted else 0.0 for inst in instances}
