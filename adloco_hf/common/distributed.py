"""Thin, typed wrappers around `torch.distributed` used by the orchestration (all work without a process group)."""

import atexit
import contextlib
import datetime
import hashlib
import io
import re
import threading
import time
from collections.abc import Callable, Iterator, Sequence

import torch
import torch.distributed as dist

from .job_store import job_store


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
    "stop_waiting_for_workers",
    "tensors_fingerprint",
]

# Seconds a worker that learns that another one stopped on an error waits before raising its own: torchrun (and
# accelerate launch) report the first worker to exit as the root cause and stop the others (polling every 0.1 s by
# default), so the failing worker is the one blamed. Without such a launcher the others raise after this wait.
PEER_FAILURE_GRACE_SECONDS = 10.0
_MAX_QUOTED = 2000  # characters of another worker's error quoted in a WorkerTimeoutError

# Set once this process is asked to stop (SIGTERM or SIGINT: `worker/preemption.py` calls
# `stop_waiting_for_workers`). A worker whose collective failed may wait up to `worker_timeout` to learn which worker
# failed (the store's counters, a posted error). When a worker dies, the launcher stops the others with SIGTERM and
# kills them after its shutdown timeout (torchrun: 30 s): a worker that went on waiting was killed without its
# message, 30 s later. With the request, it names the workers that are behind at once and exits with its error.
_stop_waiting = threading.Event()


def stop_waiting_for_workers(stop: bool = True) -> None:
    """Cut short the waits of [`WorkerMonitor`]'s failure diagnosis in this process (`stop=False`: wait again)."""
    if stop:
        _stop_waiting.set()
    else:
        _stop_waiting.clear()


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


def all_gather_rows(row: Sequence[float], device: torch.device, group=None) -> list[list[float]]:
    """All-gather one float64 row per rank over the world; returns the rows in rank order.

    `group`: a gloo group of the whole world to gather on instead of the default group (the rows stay on the CPU).
    """
    on = torch.device("cpu") if group is not None else comm_device(device)
    local = torch.tensor([float(v) for v in row], dtype=torch.float64, device=on)
    if not is_distributed():
        return [local.tolist()]
    gathered = [torch.empty_like(local) for _ in range(dist.get_world_size())]
    dist.all_gather(gathered, local, group=group)
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


def send_tensor(tensor: torch.Tensor, dst: int, group=None) -> int:
    """Blocking send to global rank `dst` (over `group`, the default group when None); returns the bytes sent."""
    buffer = tensor.contiguous().to(comm_device(tensor.device))
    dist.send(buffer, dst=dst, group=group)
    return buffer.numel() * buffer.element_size()


def recv_tensor(like: torch.Tensor, src: int, group=None) -> torch.Tensor:
    """Blocking receive into a new tensor shaped like `like` (on `like`'s device) from global rank `src`."""
    buffer = torch.empty(like.shape, dtype=like.dtype, device=comm_device(like.device))
    dist.recv(buffer, src=src, group=group)
    return buffer.to(like.device)


def send_object_tensors(obj, dst: int, device: torch.device, group=None) -> int:
    """Send a state dict (tensors and plain values) to `dst`: its byte length, then its bytes."""
    stream = io.BytesIO()
    torch.save(obj, stream)
    payload = torch.frombuffer(bytearray(stream.getvalue()), dtype=torch.uint8)
    sent = send_tensor(torch.tensor([payload.numel()], dtype=torch.int64, device=device), dst, group)
    return sent + send_tensor(payload.to(device), dst, group)


def recv_object_tensors(src: int, device: torch.device, group=None):
    """Receive what `send_object_tensors` sent; loaded with `weights_only=True` (no arbitrary code)."""
    size = int(recv_tensor(torch.empty(1, dtype=torch.int64, device=device), src, group).item())
    payload = recv_tensor(torch.empty(size, dtype=torch.uint8, device=device), src, group).cpu()
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
    """Some workers did not reach a synchronisation point in time: they died, hang, or stopped on an error of their
    own (the message then quotes it)."""


class WorkerMonitor:
    """The synchronisation points of a run, each bounded by `timeout`, naming on every rank the workers that failed.

    Three kinds of points, all on a gloo group whose timeout is `timeout`: [`check`] (a barrier), [`gather_rows`] (an
    all-gather of a few numbers) and [`watch`] (around other collectives, e.g. a merge's messages). Every rank calls
    them in the same order.

    Naming the missing workers: `monitored_barrier` names them on rank 0 only, and when a worker has exited its
    socket closes and gloo only reports "Connection closed by peer" with an address. So every worker records, in the
    job's key-value store, how many points it has entered; on failure every rank reads those counters until the
    deadline and names the ranks that are behind. A worker that stops on an error of its own posts it there first
    ([`report`]): the others quote it, and wait `PEER_FAILURE_GRACE_SECONDS` before raising, so that the launcher,
    which reports the first worker to exit as the root cause, blames the one that failed. Costs one store write per
    point (a few per round).

    With `connect=False` (a worker before training starts) there is no group: `check` is a plain barrier and
    `gather_rows` a plain all-gather, without deadline.
    """

    _created = 0  # monitors made by this process: every rank makes them in the same order (new_group is collective)

    def __init__(self, timeout: float, connect: bool = True):
        self.timeout = datetime.timedelta(seconds=timeout)
        connect = connect and is_distributed()  # not connected: plain barriers and gathers, no deadline (collective)
        self.group = dist.new_group(backend="gloo", timeout=self.timeout) if connect else None
        self._count = 0
        self._store = None
        self._prefix = self._key_prefix(connect)
        if self.group is not None:
            self._store = job_store()  # without one, the gloo message is used

    @classmethod
    def _key_prefix(cls, connect: bool) -> str:
        """The store keys' prefix of a new monitor: a new one for each connected monitor, since the store outlives a
        monitor and a second train() must not read the first's keys."""
        if connect:
            cls._created += 1
        return f"adloco/worker_monitor/{cls._created}"

    @property
    def active(self) -> bool:
        return self.group is not None and dist.get_world_size() > 1

    @property
    def message_group(self):
        """The group for a merge's point-to-point messages: this monitor's (bounded by `timeout`) when the world's
        backend is gloo anyway; None (the default group) with NCCL, whose tensors stay on the GPU."""
        return self.group if self.active and dist.get_backend() == "gloo" else None

    def _key(self, rank: int) -> str:
        return f"{self._prefix}/{rank}"

    def _failure_key(self, rank: int) -> str:
        return f"{self._prefix}/failed/{rank}"

    def _checked_in(self) -> None:
        if self._store is not None:
            self._store.set(self._key(dist.get_rank()), str(self._count))

    def report(self, error: BaseException) -> None:
        """Post why this worker stops, so that the others' errors name this worker and quote `error` (call it before
        raising `error`; a `WorkerTimeoutError` is only the echo of another worker's failure and is not posted)."""
        if self._store is None or isinstance(error, WorkerTimeoutError):
            return
        with contextlib.suppress(Exception):
            self._store.set(self._failure_key(dist.get_rank()), f"{type(error).__name__}: {error}"[:_MAX_QUOTED])

    def _diagnose(self, deadline: float, wait: bool) -> tuple[dict[int, str], list[int] | None]:
        """(errors other workers posted, ranks that have not entered this point), from the store; while some are
        behind and none posted an error, read again until `deadline` (`wait`). Nothing known without a store."""
        if self._store is None:
            return {}, None
        me, world = dist.get_rank(), dist.get_world_size()
        try:
            while True:
                failed = {
                    rank: self._store.get(self._failure_key(rank)).decode(errors="replace")
                    for rank in range(world)
                    if rank != me and self._store.check([self._failure_key(rank)])
                }
                behind = [
                    rank
                    for rank in range(world)
                    if not self._store.check([self._key(rank)]) or int(self._store.get(self._key(rank))) < self._count
                ]
                if failed or not behind or not wait or time.monotonic() >= deadline or _stop_waiting.is_set():
                    return failed, behind or None
                _stop_waiting.wait(0.1)
        except Exception:
            return {}, None

    def someone_ahead(self) -> bool:
        """Whether any worker has already entered a point this worker has not reached (from the store counters)."""
        if self._store is None:
            return False
        try:
            for rank in range(dist.get_world_size()):
                key = self._key(rank)
                if self._store.check([key]) and int(self._store.get(key)) > self._count:
                    return True
        except Exception:
            return False
        return False

    @contextlib.contextmanager
    def watch(self, where: str, hint: str | Callable[[], str] = "", *, _always: bool = False) -> Iterator[None]:
        """Around collectives that every rank enters here, on groups bounded by `timeout`: when one fails (gloo's
        timeout, or a closed connection), raise `WorkerTimeoutError` naming the workers that failed or never came.
        An error no worker explains (nobody behind, nothing posted) is raised as it was.

        `hint` (or what it returns, called only on failure) ends the message: what the user can do next.
        """
        if not self.active:
            yield
            return
        self._count += 1
        started = time.monotonic()
        self._checked_in()
        try:
            yield
        except WorkerTimeoutError:
            raise
        except RuntimeError as error:  # what gloo raises for a timeout or a lost connection
            stop = self._stopped(where, hint, error, started, _always)
            if stop is None:
                raise
            raise stop from error

    def _stopped(
        self, where: str, hint: str | Callable[[], str], error: RuntimeError, started: float, always: bool
    ) -> WorkerTimeoutError | None:
        """The error that names who made this point fail; None when nobody can be named and `always` is False."""
        found = re.search(r"Ranks? ([\d, ]+) failed", str(error))  # rank 0's monitored_barrier names them
        failed, behind = self._diagnose(started + self.timeout.total_seconds(), wait=found is None)
        timeout = f"did not arrive within {self.timeout.total_seconds():g} s (dead or hung)"
        if _stop_waiting.is_set() and time.monotonic() < started + self.timeout.total_seconds():
            timeout = "did not arrive (dead or hung: this worker was asked to stop while it waited for them)"
        quoted = "".join(f" Rank {rank}'s error: {message}" for rank, message in sorted(failed.items()))
        if failed:
            _stop_waiting.wait(PEER_FAILURE_GRACE_SECONDS)  # the launcher should see that worker exit first, blame it
            who = f"worker rank(s) {', '.join(map(str, sorted(failed)))} failed"
        elif found:
            who = f"worker rank(s) {found.group(1).strip()} {timeout}"
        elif behind:
            who = f"worker rank(s) {', '.join(map(str, behind))} {timeout}"
        elif always:
            who = f"another worker {timeout}"
        else:
            return None
        return WorkerTimeoutError(
            f"AdLoCo, {where}: {who}, so this worker (rank {dist.get_rank()}) stops.{quoted} "
            f"{hint() if callable(hint) else hint}"
        )

    def check(self, where: str, hint: str | Callable[[], str] = "") -> None:
        """Barrier with a deadline; raises `WorkerTimeoutError` naming the missing ranks and `where` (see `watch`)."""
        if not self.active:
            barrier()
            return
        with self.watch(where, hint, _always=True):
            dist.monitored_barrier(group=self.group, timeout=self.timeout, wait_all_ranks=True)

    def gather_rows(self, row: Sequence[float], where: str, hint: str | Callable[[], str] = "") -> list[list[float]]:
        """`all_gather_rows` with a deadline, on this monitor's group; a missing rank is named as in `check`."""
        with self.watch(where, hint, _always=True):
            return all_gather_rows(row, torch.device("cpu"), group=self.group if self.active else None)

    def gather_objects(self, obj, where: str, hint: str | Callable[[], str] = "") -> list:
        """`all_gather_object` with a deadline, on this monitor's group; a missing rank is named as in `check`."""
        gathered: list = [None] * get_world_size()
        if not is_distributed():
            gathered[0] = obj
        elif not self.active:
            dist.all_gather_object(gathered, obj)
        else:
            with self.watch(where, hint, _always=True):
                dist.all_gather_object(gathered, obj, group=self.group)
        return gathered


class ProcessGroupCache:
    """Process groups keyed by their sorted rank tuple, created collectively and kept for the run.

    `torch.distributed.new_group` must be called by every rank of the world in the same order, members or not, so
    callers walk the same list of rank tuples on every rank. The whole world maps to the default group (unless
    `own_world_group`: a group of its own, for traffic that runs beside the default group's, such as an overlapped
    outer step's) and a single rank needs no group at all (None).
    """

    def __init__(self, timeout: float | None = None, *, own_world_group: bool = False):
        self._groups: dict[tuple[int, ...], object] = {}
        self._timeout = None if timeout is None else datetime.timedelta(seconds=timeout)
        self._own_world_group = own_world_group

    def get(self, ranks: Sequence[int]):
        key = tuple(sorted(int(r) for r in ranks))
        if not is_distributed() or len(key) <= 1:
            return None
        if key == tuple(range(dist.get_world_size())) and not self._own_world_group:
            return dist.group.WORLD
        if key not in self._groups:
            self._groups[key] = dist.new_group(list(key), timeout=self._timeout)
        return self._groups[key]

    def __len__(self) -> int:
        return len(self._groups)
