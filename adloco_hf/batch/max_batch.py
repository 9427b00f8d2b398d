"""`max_batch_size="auto"`: the largest micro-batch whose forward, backward and optimizer step fit in memory.

On CUDA the probe runs real forward/backward passes of the training model on batches built from the training data,
with the caching allocator capped at this worker's share of the free memory (`memory_fraction` × free memory /
workers sharing the GPU), and with the memory the optimizer and outer state will take reserved up front. Sizes are
doubled until one fails, then bisected, catching out-of-memory errors the way accelerate's
`find_executable_batch_size` and Composer's auto-microbatching do. The workers on a machine then agree on the
smallest result. Without CUDA, "auto" means `CPU_AUTO_MAX_BATCH_SIZE`.
"""

import gc
import logging
import os
import socket
import zlib
from collections.abc import Callable

import torch

from ..common.distributed import all_gather_rows
from ..config.choices import CPU_AUTO_MAX_BATCH_SIZE


__all__ = ["find_max_batch_size", "is_out_of_memory", "search_max_batch_size", "workers_sharing_device"]

logger = logging.getLogger(__name__)


def is_out_of_memory(error: BaseException) -> bool:
    """True for the errors a too-large batch raises on an accelerator."""
    if isinstance(error, torch.OutOfMemoryError):
        return True
    message = str(error)
    return isinstance(error, RuntimeError) and any(
        text in message for text in ("CUDA out of memory", "CUBLAS_STATUS_ALLOC_FAILED", "CUDNN_STATUS_NOT_SUPPORTED")
    )


def search_max_batch_size(fits: Callable[[int], bool], *, upper: int) -> int:
    """Largest b in [1, upper] with `fits(b)`, assuming fitting is monotone: doubling, then bisection.

    Returns 0 when even a batch of one does not fit.
    """
    if upper < 1:
        raise ValueError(f"upper must be >= 1, got {upper}")
    good, size = 0, 1
    while size <= upper and fits(size):
        good, size = size, size * 2
    if good == 0:
        return 0
    bad = min(size, upper + 1)  # the first size known not to fit (or just past the range)
    while bad - good > 1:
        middle = (good + bad) // 2
        if fits(middle):
            good = middle
        else:
            bad = middle
    return good


def workers_sharing_device() -> int:
    """How many local processes accelerate maps to this process's GPU (process k uses GPU k mod device_count)."""
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", 1))
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    count = max(torch.cuda.device_count(), 1) if torch.cuda.is_available() else 1
    return sum(1 for r in range(local_world) if r % count == local_rank % count)


def _machine_id() -> float:
    return float(zlib.crc32(socket.gethostname().encode()))


def find_max_batch_size(
    run_step: Callable[[int], None],
    *,
    device: torch.device,
    memory_fraction: float,
    reserve_bytes: int,
    upper: int = 4096,
) -> int:
    """Search the largest micro-batch on this device and agree on it with the other workers of this machine.

    Args:
        run_step: runs forward and backward on a batch of the given size and clears the gradients afterwards.
        device: this worker's device; without CUDA the documented CPU default is returned.
        memory_fraction: share of the free memory to plan for, split among the workers sharing the GPU.
        reserve_bytes: memory still to come that the probe cannot see (optimizer and outer state).
        upper: the largest size tried.
    """
    if device.type != "cuda":
        found = CPU_AUTO_MAX_BATCH_SIZE
    else:
        found = _search_cuda(run_step, device, memory_fraction, reserve_bytes, upper)
    rows = all_gather_rows([found, _machine_id()], device)
    mine = _machine_id()
    agreed = int(min(row[0] for row in rows if row[1] == mine))
    if agreed < 1:
        raise RuntimeError(
            "max_batch_size='auto' found that not even one sample fits in memory on this machine; use a smaller "
            "model, bf16/fp16, outer_state_device='cpu' or fewer workers per GPU"
        )
    return agreed


def _search_cuda(run_step, device: torch.device, memory_fraction: float, reserve_bytes: int, upper: int) -> int:
    free, total = torch.cuda.mem_get_info(device)
    budget = free * memory_fraction / workers_sharing_device()
    torch.cuda.set_per_process_memory_fraction(
        min(1.0, (torch.cuda.memory_allocated(device) + budget) / total), device
    )

    def fits(size: int) -> bool:
        reserve = None
        try:
            reserve = torch.empty(max(reserve_bytes, 0), dtype=torch.uint8, device=device)
            run_step(size)
            torch.cuda.synchronize(device)
            return True
        except Exception as error:  # noqa: BLE001 - only out-of-memory errors mean "does not fit"
            if not is_out_of_memory(error):
                raise
            return False
        finally:
            del reserve
            gc.collect()
            torch.cuda.empty_cache()

    try:
        found = search_max_batch_size(fits, upper=upper)
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0, device)
    logger.info("max_batch_size='auto' found %d on %s (budget %.1f GiB)", found, device, budget / 2**30)
    return found
