"""What a worker sets up once, when training begins: its instance's initial weights and the largest micro-batch."""

from collections.abc import Callable

import torch

from ..batch.max_batch import find_max_batch_size
from ..common.distributed import broadcast_tensors
from ..instances.table import Instance
from .settings import WorkerSettings


__all__ = ["initialise_weights", "reinitialise", "resolve_max_batch_size"]


@torch.no_grad()
def initialise_weights(
    model: torch.nn.Module,
    mode: str,
    *,
    instance: Instance,
    rank: int,
    seed: int,
    group,
    src: int | None = None,
    intra_group=None,
    intra_src: int | None = None,
    shared_group=None,
) -> None:
    """Shared init (`mode="shared"`): rank 0's weights everywhere. Independent: instance i re-initialised with
    seed + i on its first worker and broadcast to its other workers over `group` (collective: every rank).

    With several processes per worker (`intra_group` given), the weights cross between workers once, between the
    workers' local ranks 0, and then go from each worker's local rank 0 (`intra_src`) to its other processes over
    `intra_group` (the fast local links): `rank` is this process's worker id (every process of the first worker
    re-initialises alike), `group` local rank 0's group over the instance's workers (None on the other local ranks),
    `src` its global rank in the first worker, and `shared_group` local rank 0's group over all workers (None on
    the other local ranks)."""
    tensors = list({t.data_ptr(): t for t in model.state_dict().values()}.values())
    if mode == "shared":
        if intra_group is None:
            broadcast_tensors(tensors, src=0)
            return
        if shared_group is not None:
            broadcast_tensors(tensors, src=0, group=shared_group)
        broadcast_tensors(tensors, src=intra_src, group=intra_group)
        return
    if rank == instance.first_worker:
        reinitialise(model, seed + instance.id)
    if len(instance.workers) > 1 and (group is not None or intra_group is None):
        broadcast_tensors(tensors, src=instance.first_worker if src is None else src, group=group)
    if intra_group is not None:
        broadcast_tensors(tensors, src=intra_src, group=intra_group)


def reinitialise(model: torch.nn.Module, seed: int) -> None:
    """Fresh weights for `model` from `seed` (an HF model is rebuilt from its config, others reset module by module)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        if hasattr(model, "config") and hasattr(model, "_init_weights"):
            model.load_state_dict(type(model)(model.config).state_dict())
        else:
            for module in model.modules():
                if hasattr(module, "reset_parameters"):
                    module.reset_parameters()


def resolve_max_batch_size(
    settings: WorkerSettings, params: list[torch.nn.Parameter], probe_step: Callable[[int], None]
) -> int:
    """`max_batch_size` as given, or found by probing (`"auto"`) with room kept for state allocated later."""
    if settings.start.rounds.max_batch_size is not None:
        return settings.start.rounds.max_batch_size
    reserve = 2 * sum(p.numel() * p.element_size() for p in params)  # AdamW's moments, allocated at the first step
    if settings.outer.state_device == "device":
        reserve += 4 * sum(p.numel() for p in params)  # the outer momentum, allocated at the first outer step
    return find_max_batch_size(
        probe_step, device=settings.device, memory_fraction=settings.start.memory_fraction, reserve_bytes=reserve
    )
