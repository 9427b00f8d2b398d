"""`worker_parallelism="ddp"` (and the one-process worker): every process of a worker holds the whole replica.

The worker's G processes train one replica through DDP over the worker's intra group (`Trainer._wrap_model`). They
hold the same φ and outer momentum; local rank l all-reduces slice l of the pseudo-gradient with local rank l of the
instance's other workers and the slices are all-gathered inside the worker (`GlobalModel.split_over`), so each of the
worker's G links carries 1/G of the payload. With G = 1 all of this reduces to a plain process.
"""

import torch
import torch.distributed as dist

from ...instances.table import Instance
from ...outer.step import GlobalModel
from ..initialise import initialise_weights
from .replica import ReplicaParallel


__all__ = ["DDPReplica"]


class DDPReplica(ReplicaParallel):
    """Every process holds the whole replica: φ is the trainable parameters (see [`ReplicaParallel`])."""

    def initialise_weights(self, model: torch.nn.Module, instance: Instance) -> None:
        # Between workers the weights travel once, local rank 0 to local rank 0, then inside each worker.
        groups = self.groups
        lead = groups.local_rank == 0
        several = groups.processes_per_worker > 1
        initialise_weights(
            model,
            self.settings.start.instance_init,
            instance=instance,
            rank=groups.worker_id,
            seed=self.settings.seed,
            group=groups.instance(instance.workers) if len(instance.workers) > 1 and lead else None,
            src=groups.layout.rank(instance.first_worker, 0),
            intra_group=groups.intra,
            intra_src=groups.layout.rank(groups.worker_id, 0),
            shared_group=groups.all_workers if several and lead else None,
        )

    def attach(self, global_model: GlobalModel) -> None:
        global_model.split_over(self.groups.intra, self.groups.processes_per_worker, self.groups.local_rank)

    def part(self, model: torch.nn.Module) -> list[torch.Tensor]:
        return [p for p in model.parameters() if p.requires_grad]

    @property
    def keeps_local_gradients(self) -> bool:
        # Each process's own gradient is what the size tests measure across the worker's processes.
        return self.groups.processes_per_worker > 1

    @torch.no_grad()
    def sync_gradients(self, params: list[torch.nn.Parameter]) -> None:
        """One all-reduce over the intra group, the mean DDP would have computed: every process of the worker ends
        with the same `.grad`."""
        grads = [p.grad for p in params if p.grad is not None]
        if not grads:
            return
        flat = torch.cat([g.reshape(-1).to(torch.float32) for g in grads])
        dist.all_reduce(flat, group=self.groups.intra)
        flat.div_(self.groups.processes_per_worker)
        offset = 0
        for g in grads:
            g.copy_(flat[offset : offset + g.numel()].view_as(g))
            offset += g.numel()
