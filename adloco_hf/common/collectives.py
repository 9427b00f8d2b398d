"""The trainer's public collectives, entered together: a worker that calls one alone fails at once, naming the rule.

`evaluate()`, `save_merged_model()`, `push_merged_to_hub()`, `end()` ... are collective: every worker must call
them, in the same order. A script that calls one under `if trainer.is_world_process_zero():` used to wait for the
others in a collective they never entered, until `worker_timeout` (30 minutes by default) or forever. Now every
worker, as it enters one, posts in the job's key-value store how many it has entered and which, then reads the
others' posts:

* all of them at the same one (or past it): go on;
* one of them at another collective (`end()` while this worker is in `evaluate()`): raise at once, on both;
* one of them exited (its post says so, written at interpreter exit) before reaching it: raise at once;
* one of them not there yet, still busy (it may be writing a large file on its own): wait, up to `timeout`
  (`worker_timeout`), then raise naming it.

The check costs a few store reads when the workers arrive together. It runs only for the outermost public call
(`push_to_hub` runs `push_merged_to_hub`, training runs `evaluate`: checked once, at the outer call).
"""

import atexit
import contextlib
import functools
import json
import time
from collections.abc import Callable

from .distributed import get_rank, get_world_size, is_distributed
from .job_store import job_store


__all__ = ["CollectiveCallError", "collective", "enter_collective", "post_exit"]

_PREFIX = "adloco/collectives"
_POLL_SECONDS = 0.05


class CollectiveCallError(RuntimeError):
    """A worker entered a collective that another worker did not (it called another one, exited, or never came)."""


class _Entries:
    """This process's count of collectives entered, the store it posts to, and whether its exit was posted."""

    count = 0
    store = None
    rank = 0  # kept: at exit the process group may be gone, and get_rank() with it
    name: str | None = None
    exit_hooked = False
    exit_posted = False


def _default_store():
    return job_store()  # the rendezvous store, its calls bounded (torchrun's / accelerate's), as WorkerMonitor uses it


def _key(rank: int) -> str:
    return f"{_PREFIX}/{rank}"


def _post(exited: bool = False) -> None:
    _Entries.store.set(_key(_Entries.rank), json.dumps([_Entries.count, _Entries.name, exited]))


def _read(store, rank: int) -> tuple[int, str | None, bool]:
    if not store.check([_key(rank)]):
        return 0, None, False
    count, name, exited = json.loads(store.get(_key(rank)))
    return int(count), name, bool(exited)


def post_exit() -> None:
    """Post that this worker is leaving (at interpreter exit, or when its process groups are destroyed at exit), so
    that a worker waiting for it in a collective fails at once instead of waiting `worker_timeout`."""
    if _Entries.store is None or _Entries.exit_posted:
        return
    _Entries.exit_posted = True
    with contextlib.suppress(Exception):
        _post(exited=True)


def _connect() -> bool:
    store = _default_store()
    if store is not _Entries.store:  # a new process group (a new job's store): its own count
        _Entries.store, _Entries.rank, _Entries.count, _Entries.name = store, get_rank(), 0, None
        _Entries.exit_posted = False
        with contextlib.suppress(Exception):  # a worker that never enters one still says when it leaves
            _post()
    if store is not None and not _Entries.exit_hooked:
        _Entries.exit_hooked = True
        atexit.register(post_exit)
    return store is not None


def watch_exit() -> None:
    """Start posting this worker's exit (called when its trainer is built): a worker that leaves without calling a
    collective the others wait in is then seen leaving."""
    if is_distributed() and get_world_size() > 1:
        _connect()


def _rule(name: str) -> str:
    return (
        f"{name} is collective: every worker must call it, in the same order as the other collectives (never under "
        "`if trainer.is_world_process_zero():` or `if rank == 0:`; to act on one worker, call it on all and act on "
        "the result on one)"
    )


def enter_collective(name: str, timeout: float) -> None:
    """Wait until every worker has entered the collective `name` (e.g. "evaluate()"), at most `timeout` seconds.

    Raises:
        CollectiveCallError: another worker called another collective, exited without calling this one, or did not
            arrive within `timeout`; the message names it and the rule.
    """
    if not is_distributed() or get_world_size() == 1 or not _connect():
        return
    store, me, world = _Entries.store, get_rank(), get_world_size()
    _Entries.count += 1
    _Entries.name = name
    count = _Entries.count
    _post()
    deadline = time.monotonic() + timeout
    while True:
        elsewhere, exited, behind = {}, [], []
        for rank in range(world):
            if rank == me:
                continue
            theirs, other, gone = _read(store, rank)
            if theirs > count or (theirs == count and other == name):
                continue  # here, or already past it (which it could only be once this worker arrived)
            if theirs == count:
                elsewhere[rank] = other
            elif gone:
                exited.append(rank)
            else:
                behind.append(rank)
        if elsewhere:
            called = "; ".join(f"rank {rank} called {other}" for rank, other in sorted(elsewhere.items()))
            raise CollectiveCallError(
                f"{_rule(name)}. This worker (rank {me}) called {name} as its collective number {count}, but {called}."
            )
        if exited:
            raise CollectiveCallError(
                f"{_rule(name)}. Rank(s) {', '.join(map(str, exited))} exited without calling it, so this worker "
                f"(rank {me}) stops instead of waiting for them."
            )
        if not behind:
            return
        if time.monotonic() >= deadline:
            raise CollectiveCallError(
                f"{_rule(name)}. Rank(s) {', '.join(map(str, behind))} did not arrive within {timeout:g} s "
                f"(worker_timeout), so this worker (rank {me}) stops."
            )
        time.sleep(_POLL_SECONDS)


def collective(name: str, when: Callable[..., bool] | None = None, timeout: Callable[[object], float] | None = None):
    """Decorate a trainer method that every worker must call: its outermost call enters `name` first
    (`enter_collective`, within `timeout(self)` seconds, by default `self.args.worker_timeout`). `when(self, *args,
    **kwargs)` says whether this call is collective (e.g. `save_model` only with FSDP inside a worker)."""

    def decorate(method):
        @functools.wraps(method)
        def checked(self, *args, **kwargs):
            depth = getattr(self, "_collective_depth", 0)
            if depth == 0 and (when is None or when(self, *args, **kwargs)):
                enter_collective(name, timeout(self) if timeout else self.args.worker_timeout)
            self._collective_depth = depth + 1
            try:
                return method(self, *args, **kwargs)
            finally:
                self._collective_depth = depth

        return checked

    return decorate
