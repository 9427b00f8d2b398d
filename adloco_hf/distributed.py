"""Thin, typed wrappers around `torch.distributed` used by the orchestration (all work without a process group)."""

import atexit
import datetime
import hashlib
import io
import re
import time
from collections.abc import Callable, Sequence

import torch
import torch.distributed as dist


__all__ = [
    "ProcessGroupCache",
    "WorkerMonitor",
    "WorkerTimeoutError",
    "all_gather_rows",
    "barrier",
    "broadcast_tensors",
    "check_models_match",
    "comm_device",
    "destroy_process_groups_at_exit",
    "get_rank",
    "get_world_size",
    "is_distributed",
    "recv_object_tensors",
    "recv_tensor",
    "send_object_tensors",
    "send_tensor",
    "tensors_fingerprint",
]


def is_distributed() -> bool:
    return dist.is_available() and dist.is_initialized()


def get_world_size() -> int:
    return dist.get_world_size() if is_distributed() else 1


def get_rank() -> int:
    return dist.get_rank() if is_distributed() else 0


def barrier() -> None:
    if is_distributed():
        dist.barrier()


_EXIT_HOOK_REGISTERED = False


def _destroy_process_groups() -> None:
    if is_distributed():
        try:
            dist.destroy_process_group()
        except Exception:  # noqa: BLE001 - the process is ending; nothing left to protect
            pass


def destroy_process_groups_at_exit() -> None:
    """Destroy every process group when the interpreter exits, if the script did not (`trainer.end()` does).

    A gloo group still alive at interpreter finalization can abort the process ("terminate called without an active
    exception", SIGABRT): its C++ threads release work objects that hold Python tensors after Python is gone. Measured
    here: 3 in 18 two-worker runs aborted after training had finished, none in 15 once the groups were destroyed while
    the interpreter was still alive. At exit the script is done with the other workers, and destroying a group sends
    them nothing (gloo closes its sockets, NCCL aborts its communicators, which PyTorch asks scripts to do before
    exiting anyway). Registered once per process.
    """
    global _EXIT_HOOK_REGISTERED
    if not _EXIT_HOOK_REGISTERED:
        atexit.register(_destroy_process_groups)
        _EXIT_HOOK_REGISTERED = True


def comm_device(default: torch.device) -> torch.device:
    """The device tensors must be on for collectives: CUDA for NCCL, CPU for gloo (which stages through host memory)."""
    if is_distributed() and dist.get_backend() == "nccl":
        return default if default.type == "cuda" else torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def all_gather_rows(row: Sequence[float], device: torch.device) -> list[list[float]]:
    """All-gather one float64 row per rank over the world; returns the rows in rank order."""
    local = torch.tensor([float(v) for v in row], dtype=torch.float64, device=comm_device(device))
    if not is_distributed():
        return [local.tolist()]
    gathered = [torch.empty_like(local) for _ in range(dist.get_world_size())]
    dist.all_gather(gathered, local)
    return [t.tolist() for t in gathered]


def broadcast_tensors(tensors: Sequence[torch.Tensor], src: int, group=None) -> None:
    """Broadcast tensors in place from global rank `src` inside `group` (the world when None)."""
    if not is_distributed():
        return
    for tensor in tensors:
        buffer = tensor.data.to(comm_device(tensor.device))
        dist.broadcast(buffer, src=src, group=group)
        if buffer is not tensor.data:
            tensor.data.copy_(buffer)


def send_tensor(tensor: torch.Tensor, dst: int) -> int:
    """Blocking send to global rank `dst`; returns the bytes sent."""
    buffer = tensor.contiguous().to(comm_device(tensor.device))
    dist.send(buffer, dst=dst)
    return buffer.numel() * buffer.element_size()


def recv_tensor(like: torch.Tensor, src: int) -> torch.Tensor:
    """Blocking receive into a new tensor shaped like `like` (on `like`'s device) from global rank `src`."""
    buffer = torch.empty(like.shape, dtype=like.dtype, device=comm_device(like.device))
    dist.recv(buffer, src=src)
    return buffer.to(like.device)


def send_object_tensors(obj, dst: int, device: torch.device) -> int:
    """Send a state dict (tensors and plain values) to `dst`: its byte length, then its bytes."""
    stream = io.BytesIO()
    torch.save(obj, stream)
    payload = torch.frombuffer(bytearray(stream.getvalue()), dtype=torch.uint8)
    sent = send_tensor(torch.tensor([payload.numel()], dtype=torch.int64, device=device), dst)
    return sent + send_tensor(payload.to(device), dst)


def recv_object_tensors(src: int, device: torch.device):
    """Receive what `send_object_tensors` sent; loaded with `weights_only=True` (no arbitrary code)."""
    size = int(recv_tensor(torch.empty(1, dtype=torch.int64, device=device), src).item())
    payload = recv_tensor(torch.empty(size, dtype=torch.uint8, device=device), src).cpu()
    return torch.load(io.BytesIO(payload.numpy().tobytes()), map_location=device, weights_only=True)


def tensors_fingerprint(named: Sequence[tuple[str, torch.Tensor]]) -> int:
    """A 63-bit hash of parameter names, shapes and dtypes, to compare models across ranks before any broadcast."""
    digest = hashlib.sha256()
    for name, tensor in named:
        digest.update(f"{name}:{tuple(tensor.shape)}:{tensor.dtype};".encode())
    return int.from_bytes(digest.digest()[:8], "big") >> 1


def check_models_match(model: torch.nn.Module, device: torch.device) -> None:
    """Compare parameter names, shapes and dtypes across ranks before a broadcast would hang on a mismatch."""
    named = list(model.state_dict().items())
    fingerprint = tensors_fingerprint(named)
    rows = all_gather_rows([fingerprint >> 32, fingerprint & 0xFFFFFFFF, len(named)], device)
    differing = [r for r, row in enumerate(rows) if row != rows[0]]
    if differing:
        raise ValueError(
            f"the model on rank(s) {differing} differs from rank 0's in parameter names, shapes or dtypes "
            f"(rank 0 has {int(rows[0][2])} tensors, rank {differing[0]} has {int(rows[differing[0]][2])}); "
            "every worker must build the same model, e.g. with the same config and seed"
        )


class WorkerTimeoutError(RuntimeError):
    """Some workers did not reach a synchronisation point in time (they died or hang)."""


class WorkerMonitor:
    """A deadline barrier over the world that names the workers that did not arrive.

    `monitored_barrier` (gloo) names missing ranks when they hang, but when a worker has exited its socket closes and
    gloo only reports "Connection closed by peer" with an address. So every worker also records, in the job's
    key-value store, how many checks it has reached; on failure rank 0 reads those counters until the deadline and
    names the ranks that are behind. Costs one store write per check (one per round).
    """

    def __init__(self, timeout: float):
        self.timeout = datetime.timedelta(seconds=timeout)
        self.group = dist.new_group(backend="gloo", timeout=self.timeout) if is_distributed() else None
        self._count = 0
        self._store = None
        if self.group is not None:
            try:  # the default store (torchrun's / accelerate's rendezvous); private but stable since torch 1.x
                self._store = dist.distributed_c10d._get_default_store()
            except Exception:  # pragma: no cover - only without a default store; the gloo message is used then
                self._store = None

    def _key(self, rank: int) -> str:
        return f"adloco/worker_monitor/{rank}"

    def _checked_in(self) -> None:
        if self._store is not None:
            self._store.set(self._key(dist.get_rank()), str(self._count))

    def _ranks_behind(self, deadline: float) -> list[int] | None:
        """Ranks that have not reached this check by `deadline` (None when the store cannot tell)."""
        if self._store is None or dist.get_rank() != 0:
            return None
        try:
            while True:
                behind = [
                    rank
                    for rank in range(dist.get_world_size())
                    if not self._store.check([self._key(rank)]) or int(self._store.get(self._key(rank))) < self._count
                ]
                if not behind or time.monotonic() >= deadline:
                    return behind or None
                time.sleep(0.1)
        except Exception:
            return None

    def check(self, where: str, hint: str | Callable[[], str] = "") -> None:
        """Barrier with a deadline; raises `WorkerTimeoutError` naming the missing ranks and `where`.

        `hint` (or what it returns, called only on failure) ends the message: what the user can do next.
        """
        if self.group is None or dist.get_world_size() == 1:
            return
        self._count += 1
        started = time.monotonic()
        self._checked_in()
        try:
            dist.monitored_barrier(group=self.group, timeout=self.timeout, wait_all_ranks=True)
        except RuntimeError as error:
            found = re.search(r"Ranks? ([\d, ]+) failed", str(error))
            behind = None if found else self._ranks_behind(started + self.timeout.total_seconds())
            if found:
                who = f"worker rank(s) {found.group(1).strip()}"
            elif behind:
                who = f"worker rank(s) {', '.join(map(str, behind))}"
            else:
                who = "another worker (rank 0's log names it)"
            raise WorkerTimeoutError(
                f"AdLoCo, {where}: {who} did not arrive within {self.timeout.total_seconds():g} s (dead or hung), "
                f"so this worker (rank {dist.get_rank()}) stops. {hint() if callable(hint) else hint}"
            ) from error


class ProcessGroupCache:
    """Process groups keyed by their sorted rank tuple, created collectively and kept for the run.

    `torch.distributed.new_group` must be called by every rank of the world in the same order, members or not, so
    callers walk the same list of rank tuples on every rank. The whole world maps to the default group and a single
    rank needs no group at all (None).
    """

    def __init__(self, timeout: float | None = None):
        self._groups: dict[tuple[int, ...], object] = {}
        self._timeout = None if timeout is None else datetime.timedelta(seconds=timeout)

    def get(self, ranks: Sequence[int]):
        key = tuple(sorted(int(r) for r in ranks))
        if not is_distributed() or len(key) <= 1:
            return None
        if key == tuple(range(dist.get_world_size())):
            return dist.group.WORLD
        if key not in self._groups:
            self._groups[key] = dist.new_group(list(key), timeout=self._timeout)
        return self._groups[key]

    def __len__(self) -> int:
        return len(self._groups)
