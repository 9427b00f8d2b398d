"""How merges are carried out (`MergeSettings`, read from the config once) and where a process takes part in one
(`MergePlace`): what `merges.merge_at_round_end` is handed besides the plan and the weights."""

from dataclasses import dataclass

from ..common.distributed import ProcessGroupCache
from ..common.layout import WorkerLayout
from ..config.choices import MERGE_TRANSPORTS


__all__ = ["MergePlace", "MergeSettings"]


@dataclass(frozen=True)
class MergeSettings:
    """How merges are carried out (`AdLoCoConfig`'s merge settings, read once).

    Attributes:
        transport: `merge_transport`: `"all_reduce"` or `"point_to_point"` (module docstring).
        payload: `merge_payload`: `"float32"`, or `"compact"` (φ in bfloat16, the momentum in int8 blocks of
            `block_size`) for the all-reduce transport; point-to-point merges send float32.
        block_size: the values per int8 scale of a compact momentum.
        save: merges are saved (`save_merges`): the merged φ goes to global rank 0, which writes it.
        with_momentum: the outer SGD has momentum, merged with φ.
    """

    transport: str = "all_reduce"
    payload: str = "float32"
    block_size: int = 256
    save: bool = True
    with_momentum: bool = True

    def __post_init__(self):
        if self.transport not in MERGE_TRANSPORTS:
            raise ValueError(f"merge_transport={self.transport!r}: choose one of {list(MERGE_TRANSPORTS)}")


@dataclass(frozen=True)
class MergePlace:
    """Where this process takes part in a merge.

    Attributes:
        worker: its worker id (the instance table's; the global rank with one process per worker).
        rank: its global rank (None: `worker`, one process per worker); the merged φ is returned on rank 0 only.
        local_rank: its place among its worker's processes: every local rank carries the merge out over its own
            ranks (`layout`), on the same data.
        layout: the world cut into workers of several processes (None: one process per worker).
        groups: the run's process groups, created collectively (None: groups of this merge only).
    """

    worker: int
    rank: int | None = None
    local_rank: int = 0
    layout: WorkerLayout | None = None
    groups: ProcessGroupCache | None = None

    @property
    def global_rank(self) -> int:
        return self.worker if self.rank is None else self.rank
