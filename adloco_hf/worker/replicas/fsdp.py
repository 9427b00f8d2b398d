"""`worker_parallelism="fsdp"`: a worker's G processes shard one model replica with FSDP2 (`fully_shard`).

The model is sharded over the worker's *intra* group only (never across workers, which talk once per round): each
decoder layer (`model._no_split_modules`) is one FSDP unit, the root (embeddings, tied head, norm) another. Every
parameter becomes a DTensor split along dim 0 (`Shard(0)`, uneven rows allowed: `torch.chunk`'s cut), and the inner
optimizer, created after the sharding, holds this process's shard of the moments only.

AdLoCo then works on the local shards (`local_shards`): φ, the outer momentum and the pseudo-gradient of process
(w, l) are those of shard l, which the same local rank l of every other worker holds too, so the instance's
all-reduce, merges and the final merge run per local rank on 1/G of the model without any change. Writing a model
(`merged/`, `merges/`, the Trainer's checkpoint model files) gathers full tensors inside the worker
(`full_state_dict`, collective over the worker's processes); a resume copies each process's rows back
(`load_full_state_dict`). [`FSDPReplica`] is this layout behind the worker's `ReplicaParallel` interface.
"""

import torch

from ...common.distributed import broadcast_tensors
from ...instances.table import Instance
from ...outer.step import GlobalModel
from .replica import ReplicaParallel


__all__ = [
    "FSDPReplica",
    "LocalOptimizerState",
    "full_state_dict",
    "full_values",
    "is_sharded",
    "load_full_state_dict",
    "local_optimizer_state",
    "local_shards",
    "reshard",
    "sharded_optimizer_state",
    "shard_model",
]


def shard_model(model: torch.nn.Module, group, wrap_classes=None) -> None:
    """`fully_shard` each module whose class name is in `wrap_classes` (default: `model._no_split_modules`), then the
    root, over `group` (this worker's processes). Collective over `group`; call it before the optimizer exists."""
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import fully_shard

    device = next(model.parameters()).device
    mesh = DeviceMesh.from_group(group, device.type)
    names = set(wrap_classes if wrap_classes is not None else getattr(model, "_no_split_modules", None) or ())
    for module in list(model.modules()):
        if module is not model and type(module).__name__ in names:
            fully_shard(module, mesh=mesh)
    fully_shard(model, mesh=mesh)


def _dtensor():
    from torch.distributed.tensor import DTensor

    return DTensor


def is_sharded(model: torch.nn.Module) -> bool:
    DTensor = _dtensor()
    return any(isinstance(p, DTensor) for p in model.parameters())


def reshard(model: torch.nn.Module) -> None:
    """Put every FSDP unit back in its sharded state (FSDP2 leaves the root unsharded after a forward without
    backward, e.g. evaluation): the registered parameters are the sharded DTensors again."""
    from torch.distributed.fsdp import FSDPModule

    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.reshard()


@torch.no_grad()
def local_shards(params: list[torch.Tensor]) -> list[torch.Tensor]:
    """This process's shard of each parameter: the DTensor's local tensor, which aliases the parameter's storage
    (in-place writes are the parameter's); plain tensors as they are."""
    DTensor = _dtensor()
    return [p.to_local() if isinstance(p, DTensor) else p for p in params]


@torch.no_grad()
def full_values(params: list[torch.Tensor], values: list[torch.Tensor]) -> list[torch.Tensor]:
    """The full tensors of which `values` are this process's shards (laid out like `params`' local shards), on the
    CPU. Collective over each parameter's mesh (the worker's processes)."""
    DTensor = _dtensor()
    out = []
    for p, value in zip(params, values):
        if isinstance(p, DTensor):
            local = value.reshape(p.to_local().shape).to(p.to_local().device, p.dtype)
            sharded = DTensor.from_local(local, p.device_mesh, p.placements, shape=p.shape, stride=p.stride())
            out.append(sharded.full_tensor().cpu())
        else:
            out.append(value.detach().cpu())
    return out


@torch.no_grad()
def full_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The model's state dict with every DTensor gathered to a full CPU tensor (collective over the worker)."""
    DTensor = _dtensor()
    return {
        name: (t.full_tensor() if isinstance(t, DTensor) else t).detach().cpu()
        for name, t in model.state_dict().items()
    }


def _shard_of(full: torch.Tensor, t) -> torch.Tensor:
    """The rows of `full` that DTensor `t` (Shard(0) over a 1-D mesh) holds on this process: `torch.chunk`'s cut."""
    mesh = t.device_mesh
    chunks = torch.chunk(full, mesh.size(), dim=0)
    index = mesh.get_local_rank()
    local = t.to_local()
    piece = chunks[index] if index < len(chunks) else full[:0]
    if piece.shape != local.shape:
        raise ValueError(
            f"shard {index} of a {tuple(full.shape)} tensor is {tuple(piece.shape)}, not {tuple(local.shape)}"
        )
    return piece


@torch.no_grad()
def load_full_state_dict(model: torch.nn.Module, full: dict[str, torch.Tensor]) -> list[str]:
    """Copy full tensors (a checkpoint's model files) into the sharded model, each process its own rows; returns the
    model's names that `full` lacks. No communication."""
    DTensor = _dtensor()
    missing = []
    for name, t in model.state_dict().items():
        if name not in full:
            missing.append(name)
            continue
        if isinstance(t, DTensor):
            local = t.to_local()
            local.copy_(_shard_of(full[name], t).to(local.device, local.dtype))
        else:
            t.copy_(full[name].to(t.device, t.dtype))
    return missing


def local_optimizer_state(state: dict) -> dict:
    """An optimizer's state dict with every DTensor replaced by this process's shard (plain tensors, no mesh in the
    file: `rank-R.pt` holds this process's shard of the moments)."""
    DTensor = _dtensor()
    return {
        **state,
        "state": {
            index: {k: (v.to_local().detach().clone() if isinstance(v, DTensor) else v) for k, v in values.items()}
            for index, values in state["state"].items()
        },
    }


def sharded_optimizer_state(state: dict, optimizer: torch.optim.Optimizer) -> dict:
    """The inverse of `local_optimizer_state` for `optimizer` (whose parameters are this run's DTensors): each saved
    shard shaped like its parameter's local shard becomes a DTensor laid out like the parameter."""
    DTensor = _dtensor()
    params = [p for group in optimizer.param_groups for p in group["params"]]
    out = {}
    for index, values in state["state"].items():
        p = params[int(index)]
        restored = {}
        for k, v in values.items():
            if isinstance(p, DTensor) and torch.is_tensor(v) and not isinstance(v, DTensor) and v.dim() > 0:
                if tuple(v.shape) == tuple(p.to_local().shape):
                    v = DTensor.from_local(
                        v.to(p.to_local().device),
                        p.device_mesh,
                        p.placements,
                        run_check=False,
                        shape=p.shape,
                        stride=p.stride(),
                    )
            restored[k] = v
        out[index] = restored
    return {**state, "state": out}


class LocalOptimizerState:
    """An optimizer seen through `local_optimizer_state`: what a point-to-point merge sends to a joining worker (the
    same local rank of the joiner holds the same shard) is plain tensors, loaded back as DTensors."""

    def __init__(self, optimizer: torch.optim.Optimizer):
        self.optimizer = optimizer

    def state_dict(self) -> dict:
        return local_optimizer_state(self.optimizer.state_dict())

    def load_state_dict(self, state: dict) -> None:
        self.optimizer.load_state_dict(sharded_optimizer_state(state, self.optimizer))


class FSDPReplica(ReplicaParallel):
    """`worker_parallelism="fsdp"`: the worker's processes shard the replica; φ, the outer momentum and the
    pseudo-gradient of local rank l are those of its shard l (see [`ReplicaParallel`])."""

    sharded = True
    keeps_local_gradients = False  # the statistics are read from the synced shards (two halves), never local

    def shard(self, model: torch.nn.Module) -> None:
        shard_model(model, self.groups.intra)

    def reshard(self, model: torch.nn.Module) -> None:
        reshard(model)

    def check_settings(self) -> None:
        # max_batch_size="auto" on a GPU
        if self.settings.start.rounds.max_batch_size is None and self.settings.device.type == "cuda":
            raise ValueError(
                "max_batch_size='auto' probes batches until one runs out of memory, which a sharded forward "
                "(worker_parallelism='fsdp', collective inside the worker) cannot survive on one process alone: "
                "set max_batch_size to the largest micro-batch per process, or worker_parallelism='ddp'."
            )

    @torch.no_grad()
    def initialise_weights(self, model: torch.nn.Module, instance: Instance) -> None:
        """`initialise_weights` shard by shard: every local rank sends its own shard over its groups."""
        groups, settings = self.groups, self.settings
        group = groups.instance(instance.workers) if len(instance.workers) > 1 else None
        shards = local_shards(list(model.state_dict().values()))
        tensors = list({t.data_ptr(): t for t in shards if t.numel()}.values())  # tied weights once
        if settings.start.instance_init == "shared":
            broadcast_tensors(tensors, src=groups.layout.rank(0, groups.local_rank), group=groups.all_workers)
            return
        if groups.worker_id == instance.first_worker:
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(settings.seed + instance.id)
                fresh = type(model)(model.config).state_dict()
            load_full_state_dict(model, fresh)
        if len(instance.workers) > 1:
            broadcast_tensors(tensors, src=groups.layout.rank(instance.first_worker, groups.local_rank), group=group)

    def attach(self, global_model: GlobalModel) -> None:
        global_model.shard_over(self.groups.intra)

    def part(self, model: torch.nn.Module) -> list[torch.Tensor]:
        reshard(model)
        return local_shards([p for p in model.parameters() if p.requires_grad])

    def positions(self, model: torch.nn.Module) -> tuple[list[int], int]:
        """Each shard's first element in the whole flat model: the shard holds rows [r, r + n) of its parameter (the
        cut of `torch.chunk`, `_shard_of`), contiguous in the row-major flat order."""
        DTensor = _dtensor()
        starts, offset = [], 0
        for p in (q for q in model.parameters() if q.requires_grad):
            if isinstance(p, DTensor) and p.dim() > 0 and p.shape[0] > 0:
                rows = [len(chunk) for chunk in torch.chunk(torch.arange(p.shape[0]), p.device_mesh.size())]
                before = sum(rows[: p.device_mesh.get_local_rank()])
                starts.append(offset + before * (p.numel() // p.shape[0]))
            else:
                starts.append(offset)
            offset += p.numel()
        return starts, offset

    @property
    def statistics_group(self):
        return self.groups.intra  # two halves from the synced shards (grad_stats.py)

    def statistics_samples(self, samples: int) -> int:
        # Each half's gradient is the mean over the worker's processes, a group of G × its samples.
        return samples * self.groups.processes_per_worker

    @property
    def reports_statistics(self) -> bool:
        # The worker's processes measured the same statistics (sums over the shards): local rank 0 reports them.
        return self.groups.local_rank == 0

    def optimizer_state(self, optimizer: torch.optim.Optimizer) -> dict:
        return local_optimizer_state(optimizer.state_dict())

    def load_optimizer_state(self, optimizer: torch.optim.Optimizer, state: dict) -> None:
        optimizer.load_state_dict(sharded_optimizer_state(state, optimizer))

    def merge_optimizer(self, optimizer: torch.optim.Optimizer):
        # The optimizer's shards travel as plain tensors (point-to-point merges send them to joiners).
        return LocalOptimizerState(optimizer)

    def full_values(self, trainable: list[torch.nn.Parameter], views: list[torch.Tensor]) -> list[torch.Tensor]:
        return full_values(trainable, views)

    def full_state_dict(self, model: torch.nn.Module) -> dict[str, torch.Tensor]:
        reshard(model)
        return full_state_dict(model)

    def full_save_state(self, model: torch.nn.Module, views: list[torch.Tensor]) -> dict[str, torch.Tensor]:
        """The full state dict (CPU, the model's dtypes) with `views` in its trainables; collective over the worker's
        processes."""
        base = self.full_state_dict(model)
        named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        for name, value in zip([n for n, _ in named], self.full_values([p for _, p in named], views)):
            base[name] = value.to(base[name].dtype).contiguous()
        return base

    def merge_gather(self, full_save_state):
        return full_save_state  # every process of worker 0 (the writer) holds its shard: gathered before writing
