"""`ProcessSplit`: how a worker's G processes share φ's outer step (one process per worker: nothing is split).

With DDP inside a worker (`GlobalModel.split_over`) each process all-reduces only its 1/G slice of Δ across workers
and the slices are all-gathered inside the worker ([`ProcessSplit.gather`]), so each of the worker's G links carries
1/G of the payload. With FSDP's shards (`GlobalModel.shard_over`) Δ is reduced as it is and only the norms are
summed over the worker's processes ([`ProcessSplit.whole_norms`]), so that all of them report the whole model's.
"""

import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from ..common.distributed import comm_device


__all__ = ["ProcessSplit"]


@dataclass(frozen=True)
class ProcessSplit:
    """How a worker's G processes share φ's outer step (module docstring).

    Attributes:
        intra_group: the worker's processes' group, over which the reduced slices are all-gathered (`split_over`).
        parts: G, the slices the pseudo-gradient's all-reduce is split into (1: not split).
        local_rank: this process's slice.
        norm_group: with FSDP's shards, the group the norms are summed over (`shard_over`; None: φ is whole here).
    """

    intra_group: Any = None
    parts: int = 1
    local_rank: int = 0
    norm_group: Any = None

    def gather(self, part_mean: torch.Tensor, size: int) -> torch.Tensor:
        """The whole of a flat tensor of `size` elements from every process's averaged slice of it (this process's:
        `part_mean`), all-gathered over the worker's processes (float32, a new tensor)."""
        chunk = -(-size // self.parts)
        mine = torch.zeros(chunk, dtype=torch.float32, device=comm_device(part_mean.device))
        mine[: part_mean.numel()].copy_(part_mean)
        gathered = [torch.empty_like(mine) for _ in range(self.parts)]
        dist.all_gather(gathered, mine, group=self.intra_group)
        return torch.cat(gathered)[:size]

    def whole_norms(self, norm: float, local_sq: float, device: torch.device) -> tuple[float, float]:
        """With sharded parameters: the whole model's ‖Δ‖ and ‖Δ_w‖² from every process's shard (one all-reduce)."""
        if self.norm_group is None:
            return norm, local_sq
        sums = torch.tensor([norm * norm, local_sq], dtype=torch.float64, device=comm_device(device))
        dist.all_reduce(sums, group=self.norm_group)
        return math.sqrt(float(sums[0])), float(sums[1])
