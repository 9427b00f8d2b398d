"""`ReplicaParallel`: how a worker's G processes hold its one model replica, behind one interface.

AdLoCo never looks inside a worker: it needs, on each process, the tensors its φ mirrors, the group its gradient
statistics are summed over, and the inner optimizer's state as plain tensors. Two variants provide them, chosen once
from `worker_parallelism` when the `Worker` is made:

- [`DDPReplica`] (`ddp.py`, also the one-process worker): every process holds the whole replica; φ is the trainable
  parameters, and each local rank all-reduces its 1/G slice of the pseudo-gradient across workers.
- [`FSDPReplica`] (`fsdp.py`): the processes shard the replica (FSDP2); φ is this process's shards, all-reduced with
  the same shard of the other workers, and a model is written after gathering the full tensors inside the worker.
"""

import contextlib
from collections.abc import Callable

import torch

from ...instances.table import Instance
from ...outer.step import GlobalModel
from ..groups import WorkerGroups
from ..settings import WorkerSettings


__all__ = ["ReplicaParallel"]


class ReplicaParallel:
    """The intra-worker parallelism of one process: what differs between DDP and FSDP inside a worker. The defaults
    are those of a replica that every process holds whole; a variant overrides what it changes.

    Args:
        settings: the worker's settings ([`WorkerSettings`]).
        groups: this process's place among the workers and its process groups.
    """

    sharded: bool = False
    """The worker's processes hold shards of the replica (FSDP), not copies: models are gathered before writing."""

    def __init__(self, settings: WorkerSettings, groups: WorkerGroups):
        self.settings = settings
        self.groups = groups

    # ---- set-up ----
    def shard(self, model: torch.nn.Module) -> None:
        """Lay the model out over the worker's processes (collective; before the optimizer exists). Nothing to do
        unless sharded."""

    def reshard(self, model: torch.nn.Module) -> None:
        """Every unit back to the layout φ mirrors (after a forward without backward). Nothing to do unless sharded."""

    def check_settings(self) -> None:
        """Refuse settings this variant cannot run (called when training starts afresh)."""

    def initialise_weights(self, model: torch.nn.Module, instance: Instance) -> None:
        """`instance_init`: the same weights on every worker of `instance` (collective: every rank)."""
        raise NotImplementedError

    def attach(self, global_model: GlobalModel) -> None:
        """Tell the outer step how this process's part of φ relates to the worker's other processes."""
        raise NotImplementedError

    def part(self, model: torch.nn.Module) -> list[torch.Tensor]:
        """What AdLoCo's φ mirrors on this process (aliases of the parameters' storage)."""
        raise NotImplementedError

    def positions(self, model: torch.nn.Module) -> tuple[list[int], int] | None:
        """Where the tensors of `part` lie in the whole flat model (each one's first element, and the model's size),
        for the fragments of Streaming DiLoCo; None when `part` is the whole model."""
        return None

    # ---- inner steps ----
    statistics_group = None
    """The group a step's gradient statistics are summed over (each process measured a shard), or None."""

    keeps_local_gradients: bool = False
    """Whether a statistics step keeps each process's own gradient until `sync_gradients` (see
    `Worker.local_gradient_step`)."""

    def no_sync(self, model: torch.nn.Module):
        """A context in which the backward of `model` leaves its gradient local to this process: DDP's `no_sync`
        for a worker of several processes, nothing to turn off for a bare model."""
        if isinstance(model, torch.nn.parallel.DistributedDataParallel):
            return model.no_sync()
        return contextlib.nullcontext()

    def sync_gradients(self, params: list[torch.nn.Parameter]) -> None:
        """The worker's mean gradient from its processes' own, after a step that kept them local."""
        raise NotImplementedError(f"{type(self).__name__} never keeps local gradients")

    def statistics_samples(self, samples: int) -> int:
        """The samples behind each half of a split statistics step, from this process's `samples`."""
        return samples

    @property
    def reports_statistics(self) -> bool:
        """Whether this process's round statistics go into its report (all processes of a worker may hold the same
        numbers)."""
        return True

    # ---- optimizer state and writing models ----
    def optimizer_state(self, optimizer: torch.optim.Optimizer) -> dict:
        """The inner optimizer's state dict as this process saves it."""
        return optimizer.state_dict()

    def load_optimizer_state(self, optimizer: torch.optim.Optimizer, state: dict) -> None:
        """The inverse of `optimizer_state`."""
        optimizer.load_state_dict(state)

    def merge_optimizer(self, optimizer: torch.optim.Optimizer):
        """The inner optimizer as a merge sends and receives it (`state_dict` / `load_state_dict`)."""
        return optimizer

    def full_values(self, trainable: list[torch.nn.Parameter], views: list[torch.Tensor]) -> list[torch.Tensor]:
        """The trainable parameters' full values from `views` of a φ of this process."""
        return views

    def full_state_dict(self, model: torch.nn.Module) -> dict[str, torch.Tensor] | None:
        """The model's full state dict when it must be gathered (sharded); None: the model holds it already."""
        return None

    def full_save_state(self, model: torch.nn.Module, views: list[torch.Tensor]) -> dict[str, torch.Tensor]:
        """The full state dict whose trainable parameters hold `views` (a φ of this process): what a folder holds.
        Only a sharded replica needs it (otherwise φ is the full model already)."""
        raise NotImplementedError(f"{type(self).__name__} writes φ as it is")

    def merge_gather(
        self, full_save_state: Callable[[torch.Tensor], dict[str, torch.Tensor]]
    ) -> Callable[[torch.Tensor], dict[str, torch.Tensor]] | None:
        """What a merge calls to turn a merged φ into the model it writes; None: φ is the full model already."""
        return None
