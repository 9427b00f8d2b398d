"""Workers that span several processes (`processes_per_worker` = G): which process belongs to which worker (pure).

Consecutive ranks of the launch form one worker: with P processes there are M = P / G workers, process r belongs
to worker r // G as its local rank r % G. Inside a worker the processes train one model replica as ordinary data
parallel (DDP over the worker's *intra* group, gradients all-reduced every step over the fast local links). Across
workers nothing is sent until a round ends; then local rank l of every worker of an instance all-reduces slice l of
the flat pseudo-gradient (`part_range`) over its *cross* group (`cross_ranks`), so each of the worker's G links
carries 1/G of the payload, and an intra all-gather gives every process of the worker the whole average.

Instances, merges and the rounds file count in worker ids; with G = 1 a worker id is its rank and nothing changes.
"""

import math
from dataclasses import dataclass


__all__ = ["WorkerLayout", "part_range", "part_ranges"]


def part_ranges(numel: int, parts: int) -> list[tuple[int, int]]:
    """`numel` elements cut into `parts` contiguous ranges of ⌈numel / parts⌉ (the last ones shorter or empty)."""
    if parts < 1:
        raise ValueError(f"cannot cut {numel} elements into {parts} parts")
    size = math.ceil(numel / parts) if numel else 0
    return [(min(i * size, numel), min((i + 1) * size, numel)) for i in range(parts)]


def part_range(numel: int, parts: int, index: int) -> tuple[int, int]:
    """The range `index` of `part_ranges(numel, parts)`."""
    return part_ranges(numel, parts)[index]


@dataclass(frozen=True)
class WorkerLayout:
    """The map between the launch's P processes and its M = P / G workers (G = `processes_per_worker`)."""

    world_size: int
    processes_per_worker: int = 1

    def __post_init__(self):
        g = self.processes_per_worker
        if isinstance(g, bool) or int(g) != g or g < 1:
            raise ValueError(f"processes_per_worker={g}: set an integer >= 1 (1: one process per worker).")
        if self.world_size % g:
            raise ValueError(
                f"processes_per_worker={g} does not divide the {self.world_size} processes of this launch: launch a "
                f"multiple of {g} processes (e.g. nodes × GPUs per node with processes_per_worker = GPUs per node), "
                "or choose processes_per_worker dividing the number of processes."
            )

    @property
    def num_workers(self) -> int:
        return self.world_size // self.processes_per_worker

    def worker_of(self, rank: int) -> int:
        return rank // self.processes_per_worker

    def local_rank(self, rank: int) -> int:
        return rank % self.processes_per_worker

    def rank(self, worker: int, local_rank: int = 0) -> int:
        return worker * self.processes_per_worker + local_rank

    def ranks_of(self, worker: int) -> tuple[int, ...]:
        """The global ranks of one worker's processes, ascending (its intra group)."""
        return tuple(self.rank(worker, local) for local in range(self.processes_per_worker))

    def ranks_of_workers(self, workers) -> tuple[int, ...]:
        """The global ranks of all processes of `workers`, ascending."""
        return tuple(r for w in sorted(workers) for r in self.ranks_of(w))

    def cross_ranks(self, workers, local_rank: int) -> tuple[int, ...]:
        """Local rank `local_rank` of each of `workers`, ascending: the cross-worker group of that local rank."""
        return tuple(self.rank(w, local_rank) for w in sorted(workers))

    def intra_groups(self) -> list[tuple[int, ...]]:
        """Every worker's ranks, in worker order (the order in which every process creates the intra groups)."""
        return [self.ranks_of(w) for w in range(self.num_workers)]
