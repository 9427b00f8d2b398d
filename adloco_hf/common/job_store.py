"""The job's key-value store, every call bounded by twice `worker_timeout` (docs/faults.md#timeouts).

The store (torchrun's or accelerate's rendezvous store) is where the workers beat their pulse (`common/pulse.py`),
count the points they entered (`common/distributed.py`, `common/collectives.py`) and agree on where to stop
(`worker/preemption.py`). torch's TCPStore client waits for a reply without a deadline: a machine whose link dies
while a call is on the wire waits until TCP gives up (`net.ipv4.tcp_retries2`, about 15 minutes), and every other call
of the process waits behind it for the client's lock. Such a worker never names the others, never exits, and its
launcher never gets to restart it or give up (issue 42's `down_for_good`).

So every call goes through a watchdog: a call not answered within the bound (2 × `worker_timeout`, `BOUND_FACTOR`,
or `peer_timeout` where the peer watch is on and that is shorter: `common/liveness.py`) means this machine has lost
the store (its link, or the store's host, is down for longer than the run tolerates). The watchdog says so on stderr and ends
the process with `STORE_LOST_EXIT_CODE`, the way torch's NCCL watchdog ends a process whose collective hung: the
launcher sees a failed worker and restarts it or gives up, as configured. None of the calls made here waits for a key
to appear (every `get` follows a `check`), so a healthy store answers each within a round trip.
"""

import contextlib
import os
import threading
import time
from collections.abc import Iterator

from .upstream import default_store, exit_now


__all__ = ["BOUND_FACTOR", "STORE_LOST_EXIT_CODE", "BoundedStore", "bound_store_calls", "job_store"]

# EX_TEMPFAIL (sysexits.h): a temporary failure, the launcher may try again.
STORE_LOST_EXIT_CODE = 75
# The bound is twice worker_timeout: TCP retransmits a lost segment after intervals that double (0.2, 0.4, ... s), so
# a call sent while a link is down is answered up to about twice the outage after it was sent. At 2 × worker_timeout
# an outage shorter than worker_timeout, which costs a round nothing, does not end a worker either.
BOUND_FACTOR = 2.0
_CALLS = ("add", "set", "get", "check", "compare_set", "delete_key", "num_keys")


class _Watchdog:
    """The process's calls in flight, each with its deadline, and the daemon thread that ends the process when one
    passes (it sleeps until the earliest deadline; with no call in flight, until the next call)."""

    def __init__(self):
        self._forget()
        os.register_at_fork(after_in_child=self._forget)  # a forked child has no watchdog thread: it starts its own

    def _forget(self) -> None:
        self._lock = threading.Condition()
        self._calls: dict[int, tuple[float, tuple]] = {}
        self._next = 0
        self._thread: threading.Thread | None = None

    @contextlib.contextmanager
    def watching(self, bound: float | None, call: tuple) -> Iterator[None]:
        """Watch the call described by `call` (rank, store, name, key, bound) for `bound` seconds (None: not at all)."""
        if bound is None:
            yield
            return
        with self._lock:
            token, self._next = self._next, self._next + 1
            self._calls[token] = (time.monotonic() + bound, call)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="adloco-store-watchdog", daemon=True)
                self._thread.start()
            if len(self._calls) == 1:  # the thread sleeps without a deadline; else an earlier one is already set
                self._lock.notify()
        try:
            yield
        finally:
            with self._lock:
                del self._calls[token]

    def _run(self) -> None:
        with self._lock:
            while True:
                now = time.monotonic()
                late = [call for deadline, call in self._calls.values() if deadline <= now]
                if late:
                    _store_lost(*late[0])
                earliest = min((deadline for deadline, _ in self._calls.values()), default=None)
                self._lock.wait(None if earliest is None else earliest - now)


def _store_lost(rank: int, store, name: str, key: str, bound: float) -> None:
    """End the process: written with os.write (no lock of Python's to wait for: the calling thread is stuck)."""
    message = (
        f"AdLoCo: rank {rank}: the job's store ({_address(store)}) did not answer {name}({key!r}) in {bound:g} s "
        f"({_bound_name}). This machine has lost the job's key-value store (its link, or the store's host, is down "
        f"longer than the run tolerates): ending this worker with exit code {STORE_LOST_EXIT_CODE} so that its "
        f"launcher restarts it or gives up; the other workers name it after {_named_after}. If the link's outages are "
        f"expected to last longer, raise {_raise} (docs/faults.md#timeouts).\n"
    )
    with contextlib.suppress(OSError):
        os.write(2, message.encode())
    exit_now(STORE_LOST_EXIT_CODE)


_WATCHDOG = _Watchdog()
_bound: float | None = None
_bound_name, _named_after, _raise = f"{BOUND_FACTOR:g} x worker_timeout", "worker_timeout", "worker_timeout"


def bound_store_calls(worker_timeout: float | None, peer_timeout: float = 0.0) -> None:
    """Bound every later call of the job's store (`job_store`) by `BOUND_FACTOR` × `worker_timeout` (None:
    unbounded), or by `peer_timeout` where it is on (> 0) and shorter: the others name this worker after
    `peer_timeout` (`common/liveness.py`), so it ends itself about then too."""
    global _bound, _bound_name, _named_after, _raise
    _bound = None if worker_timeout is None else BOUND_FACTOR * worker_timeout
    _bound_name, _named_after, _raise = f"{BOUND_FACTOR:g} x worker_timeout", "worker_timeout", "worker_timeout"
    if peer_timeout > 0 and (_bound is None or peer_timeout < _bound):
        _bound, _bound_name, _named_after, _raise = peer_timeout, "peer_timeout", "peer_timeout", "peer_timeout"


class BoundedStore:
    """A store whose calls (`add`, `set`, `get`, `check`, `compare_set`, ...) end the process when not answered within
    the bound set by `bound_store_calls` (module docstring). Everything else is the wrapped store's."""

    def __init__(self, store, rank: int):
        self.store, self.rank = store, rank

    def __getattr__(self, name: str):
        attribute = getattr(self.store, name)
        if name not in _CALLS:
            return attribute

        def call(*args):
            with _WATCHDOG.watching(_bound, (self.rank, self.store, name, _key(args), _bound)):
                return attribute(*args)

        return call


def _key(args: tuple) -> str:
    """The key a call names, for its message: its first argument, or the first of a list of keys (`check`)."""
    first = args[0] if args else ""
    return first if isinstance(first, str) else (first[0] if first else "")


def _address(store) -> str:
    """host:port of the TCPStore under `store` (the default store is a PrefixStore over it), or its type's name."""
    while not hasattr(store, "host") and hasattr(store, "underlying_store"):
        store = store.underlying_store
    host, port = getattr(store, "host", None), getattr(store, "port", None)
    return f"{host}:{port}" if host is not None else type(store).__name__


_cached: tuple[object, BoundedStore] | None = None


def job_store() -> BoundedStore | None:
    """The default process group's store, its calls bounded (the same object while the group's store is the same),
    or None without one."""
    global _cached
    raw = default_store()
    if raw is None:
        return None
    if _cached is None or _cached[0] is not raw:
        import torch.distributed as dist

        _cached = (raw, BoundedStore(raw, dist.get_rank() if dist.is_initialized() else 0))
    return _cached[1]
