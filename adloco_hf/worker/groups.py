"""The process groups a worker talks over: inside the worker, across its instance, across all workers.

With `processes_per_worker` = G a worker is G consecutive processes (`common/layout.py`). Local rank l of a worker
talks to local rank l of the other workers (the instance's outer all-reduce, merges, the final merge), and to its own
worker's processes over the *intra* group (DDP's or FSDP's collectives, the weights' last hop). With G = 1 a worker
is one process and these are the familiar groups over ranks.

`torch.distributed.new_group` is collective over the whole world, so every rank creates the same groups in the same
order, members or not: `refresh` walks every instance in id order, and the intra groups are made all at once.
"""

from collections.abc import Iterable

from ..common.distributed import ProcessGroupCache
from ..common.layout import WorkerLayout
from ..instances.table import Instance


__all__ = ["WorkerGroups"]


class WorkerGroups:
    """Where this process sits among the workers (`layout`, `worker_id`, `local_rank`) and the groups it uses.

    Args:
        layout: the world cut into workers of G processes.
        rank: this process's global rank.
        timeout: seconds a collective may wait (`worker_timeout`).
        outer_overlap: the outer step's all-reduce runs beside the next round (`outer_overlap`): it then gets groups
            of its own (`outer`), so that it never shares one with the round's other collectives, even when an
            instance is the whole world.
    """

    def __init__(self, layout: WorkerLayout, rank: int, *, timeout: float | None, outer_overlap: bool):
        self.layout = layout
        self.rank = rank
        self.worker_id = layout.worker_of(rank)  # == rank with one process per worker
        self.local_rank = layout.local_rank(rank)
        self.processes_per_worker = layout.processes_per_worker
        self.cache = ProcessGroupCache(timeout=timeout)
        self.outer = ProcessGroupCache(timeout=timeout, own_world_group=True) if outer_overlap else self.cache
        self._intra = None

    @property
    def intra(self):
        """The process group of this worker's processes (None with one process per worker). Made on first use, with
        every worker's, in worker order on every rank (new_group is collective)."""
        if self.processes_per_worker == 1:
            return None
        if self._intra is None:
            for ranks in self.layout.intra_groups():
                self.cache.get(ranks)
            self._intra = self.cache.get(self.layout.ranks_of(self.worker_id))
        return self._intra

    @property
    def all_workers(self):
        """This local rank of every worker (the world with one process per worker)."""
        return self.cache.get(self.cross(range(self.layout.num_workers)))

    def cross(self, workers: Iterable[int]) -> tuple[int, ...]:
        """The global ranks of this local rank in `workers` (the workers themselves with one process per worker)."""
        return self.layout.cross_ranks(workers, self.local_rank)

    def instance(self, workers: Iterable[int]):
        """This local rank's group over an instance's `workers` (None for a worker alone)."""
        return self.cache.get(self.cross(workers))

    def refresh(self, instances: list[Instance]) -> None:
        """Create the groups of every instance (after the table changed), in id order on every rank: each local
        rank's group over the instance's workers, with G > 1 also the instance's processes (evaluation) and each
        local rank's group over all workers (final merge, merged-model evaluation)."""
        g = self.processes_per_worker
        for inst in sorted(instances, key=lambda x: x.id):
            for local in range(g):
                ranks = self.layout.cross_ranks(inst.workers, local)
                self.cache.get(ranks)
                self.outer.get(ranks)
            if g > 1:
                self.cache.get(self.layout.ranks_of_workers(inst.workers))
        if g > 1:
            for local in range(g):
                self.cache.get(self.layout.cross_ranks(range(self.layout.num_workers), local))
