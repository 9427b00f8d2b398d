"""The instance table of a round run by the workers that are alive (live recovery, issue 52; pure).

The round quorum (`quorum/`) names the workers of each round. [`table_for_members`] turns the last round's table
into this round's:

- **A worker that left** (dead, or its link down) is taken out of its instance, and the instance keeps its total
  batch per inner step: its request per worker becomes b' = G ⌈b M / (G M')⌉ for M workers before and M' alive, so the
  live workers train at least the samples the batch rule chose (at most G − 1 more per worker, every process drawing
  a whole 1/G). Shares of `worker_batch_split="speed"` are resized to the new total, or dropped where they cannot be.
- **An instance whose last worker left is merged away**: its φ and outer momentum lived only on its workers, so
  nothing alive holds its progress since its last merge, and continuing it from an older state would train
  samples twice. Its statistics go with it; the job goes on with the other instances (as after a merge). When no
  worker of the last round is alive, nothing holds the model: the job resumes from its checkpoint instead (an error).
- **A worker that joins** (a restart, a replacement, a new machine) goes to the live instance with the fewest workers
  (ties: the lowest id), whose φ it heals from, and that instance's total batch is re-split over one more worker.
"""

from collections.abc import Iterable
from dataclasses import dataclass, replace

from ..batch.worker_split import resize_split
from .table import Instance


__all__ = ["MembershipChange", "table_for_members"]


@dataclass(frozen=True)
class MembershipChange:
    """A round's table after its members changed.

    Attributes:
        instances: the table the round runs (only live workers, every live worker in one instance).
        left: the workers taken out, ascending.
        joined: the workers added, ascending, each with the instance it joined (worker id → instance id).
        lost: the instances merged away because none of their workers is alive, ascending.
    """

    instances: tuple[Instance, ...]
    left: tuple[int, ...] = ()
    joined: dict[int, int] | None = None
    lost: tuple[int, ...] = ()

    @property
    def changed(self) -> bool:
        return bool(self.left or self.joined or self.lost)


def _resplit(instance: Instance, workers: tuple[int, ...], unit: int) -> Instance:
    """`instance` run by `workers`, its total batch kept (rounded up to whole requests of `unit` samples)."""
    if workers == instance.workers:
        return instance
    total = instance.batch_size * len(instance.workers)
    request = unit * -(-total // (unit * len(workers)))
    shares = ()
    if instance.shares:
        kept = [share for worker, share in zip(instance.workers, instance.shares) if worker in workers]
        if len(kept) == len(workers):  # no joiner: the live workers' speeds still say how to split
            shares = resize_split(kept, request * len(workers), unit=unit, minimum=unit) or ()
    # demand=-1: the row's own default, the request × its workers (`Instance.__post_init__`)
    return replace(instance, workers=workers, batch_size=request, demand=-1.0, shares=shares)


def table_for_members(
    instances: Iterable[Instance], members: Iterable[int], *, processes_per_worker: int = 1
) -> MembershipChange:
    """The table of a round run by `members` (worker ids), from the last round's `instances` (module docstring)."""
    alive = set(members)
    if not alive:
        raise ValueError("a round has at least one member: the worker that asks")
    table = sorted(instances, key=lambda inst: inst.id)
    seated = {w for inst in table for w in inst.workers}
    left = tuple(sorted(seated - alive))
    live = [(inst, tuple(w for w in inst.workers if w in alive)) for inst in table]
    lost = tuple(inst.id for inst, workers in live if not workers)
    seats = {inst.id: list(workers) for inst, workers in live if workers}
    if not seats:
        raise ValueError(
            f"no worker of the last round is alive (it had {sorted(seated)}; now {sorted(alive)}): nothing alive "
            "holds the model to heal from. Resume the job from its last checkpoint."
        )
    joined = {}
    for worker in sorted(alive - seated):
        target = min(seats, key=lambda i: (len(seats[i]), i))
        seats[target].append(worker)
        joined[worker] = target
    unit = processes_per_worker
    rows = tuple(_resplit(inst, tuple(sorted(seats[inst.id])), unit) for inst in table if inst.id in seats)
    return MembershipChange(instances=rows, left=left, joined=joined or None, lost=lost)
