"""A real testbed for slow workers: chosen processes of a launch run in a cgroup with a CPU quota.

The benchmark creates one cgroup per launch (`cpu_quota_group`) under its own process's cgroup of the `cpu`
controller, with a quota of `cores` CPUs: cgroup v1's `cpu.cfs_quota_us` / `cpu.cfs_period_us`, or cgroup v2's
`cpu.max` ("quota period"). It hands the group's `cgroup.procs` path and the slow ranks to the workers in the
environment (`ENV_PROCS`, `ENV_RANKS`); a worker whose global rank is listed writes its own pid there before it
trains (`join_from_environment`), so the kernel throttles it, its threads and whatever it starts to `cores` CPUs
(0.25: a quarter of one core, whatever else the machine runs).

The group is removed on every exit path of the benchmark: when the launch ends or raises, on SIGTERM and SIGINT
(turned into exceptions while a group exists, so `finally` runs), at interpreter exit (`atexit`), and, for a
benchmark killed with SIGKILL, by the next one (`remove_stale_groups`: groups named after a process that no longer
exists). Removing a group first moves any process still in it back to the parent group.

Where cgroups cannot be made (not root, no `cpu` controller, a read-only `/sys/fs/cgroup`), `cpu_quota_group`
raises `CgroupUnavailable` with the reason, and the benchmarks skip the methods that need a slow worker, saying so.
"""

import atexit
import contextlib
import os
import signal
import time
from collections.abc import Iterator


__all__ = [
    "ENV_PROCS",
    "ENV_RANKS",
    "PREFIX",
    "CgroupUnavailable",
    "cpu_controller",
    "cpu_quota_group",
    "join_from_environment",
    "quota_lines",
    "remove_group",
    "remove_stale_groups",
]

ENV_PROCS = "ADLOCO_SLOW_CGROUP_PROCS"  # the group's cgroup.procs, for the slow workers to join
ENV_RANKS = "ADLOCO_SLOW_RANKS"  # the global ranks that join it, comma-separated
PREFIX = "adloco-slow-"  # group names: PREFIX + creator pid + "-" + a counter
PERIOD_US = 100_000
CGROUP_ROOT = "/sys/fs/cgroup"


class CgroupUnavailable(RuntimeError):
    """No cgroup with a CPU quota can be made on this machine (the message says why)."""


def quota_lines(cores: float, version: str, period_us: int = PERIOD_US) -> dict[str, str]:
    """The files (and values) that limit a group to `cores` CPUs: v1 `cpu.cfs_period_us` then `cpu.cfs_quota_us`
    (in that order: a quota above the old period is refused otherwise), v2 `cpu.max`."""
    if not cores > 0:
        raise ValueError(f"cores={cores}: a quota needs a positive number of CPUs (0.25: a quarter of one core)")
    quota = max(1000, round(cores * period_us))  # the kernel's smallest quota is 1 ms
    if version == "v1":
        return {"cpu.cfs_period_us": str(period_us), "cpu.cfs_quota_us": str(quota)}
    return {"cpu.max": f"{quota} {period_us}"}


def _own_cgroup(controller: str) -> str | None:
    """This process's cgroup path (relative) in the hierarchy of `controller` ('' for cgroup v2's), from
    /proc/self/cgroup; None when it is not listed."""
    with open("/proc/self/cgroup", encoding="utf-8") as f:
        for line in f:
            _, controllers, path = line.rstrip("\n").split(":", 2)
            if controller in controllers.split(",") or (controller == "" and controllers == ""):
                return path
    return None


def cpu_controller(root: str = CGROUP_ROOT) -> tuple[str, str]:
    """(the directory under which this process may make groups with a CPU quota, "v1" or "v2"). Raises
    `CgroupUnavailable` naming the reason when there is none."""
    if os.geteuid() != 0:
        raise CgroupUnavailable("a cgroup with a CPU quota needs root (run the benchmark with sudo)")
    for name in ("cpu", "cpu,cpuacct"):
        v1 = os.path.join(root, name)
        if os.path.isfile(os.path.join(v1, "cpu.cfs_quota_us")):
            own = _own_cgroup("cpu") or "/"
            return os.path.join(v1, own.lstrip("/")), "v1"
    for v2 in (root, os.path.join(root, "unified")):
        controllers = os.path.join(v2, "cgroup.controllers")
        if os.path.isfile(controllers):
            with open(controllers, encoding="utf-8") as f:
                if "cpu" in f.read().split():
                    own = _own_cgroup("") or "/"
                    return os.path.join(v2, own.lstrip("/")), "v2"
    raise CgroupUnavailable(
        f"no cgroup cpu controller under {root} (cgroup v1 {root}/cpu/cpu.cfs_quota_us, or cgroup v2 with 'cpu' in "
        "cgroup.controllers): see `mount | grep cgroup`"
    )


def _stop_on_signal(signum, frame):
    raise SystemExit(128 + signum)  # runs every `finally` on the way out, which removes the groups


_counter = iter(range(1 << 30))
_live: set[str] = set()
_previous_handlers: dict[int, object] = {}


def _remove_live() -> None:
    for path in sorted(_live):
        remove_group(path)


atexit.register(_remove_live)


@contextlib.contextmanager
def cpu_quota_group(cores: float, *, root: str = CGROUP_ROOT) -> Iterator[str]:
    """A new cgroup limited to `cores` CPUs, for the duration of the block; yields its `cgroup.procs` path. Removed
    on leaving the block however it is left (module docstring). Raises `CgroupUnavailable` when none can be made."""
    parent, version = cpu_controller(root)
    remove_stale_groups(parent)
    path = os.path.join(parent, f"{PREFIX}{os.getpid()}-{next(_counter)}")
    try:
        os.mkdir(path)
    except OSError as error:
        raise CgroupUnavailable(f"cannot create {path}: {error}") from error
    _live.add(path)
    installed = _install_signal_handlers()
    try:
        if version == "v2":
            _enable_cpu_controller(parent)
        for name, value in quota_lines(cores, version).items():
            with open(os.path.join(path, name), "w", encoding="utf-8") as f:
                f.write(value)
        yield os.path.join(path, "cgroup.procs")
    finally:
        remove_group(path)
        _live.discard(path)
        if installed:
            _restore_signal_handlers()


def _enable_cpu_controller(parent: str) -> None:
    """cgroup v2: the cpu controller must be enabled in the parent's `cgroup.subtree_control` for `cpu.max`."""
    control = os.path.join(parent, "cgroup.subtree_control")
    with open(control, encoding="utf-8") as f:
        if "cpu" in f.read().split():
            return
    try:
        with open(control, "w", encoding="utf-8") as f:
            f.write("+cpu")
    except OSError as error:
        raise CgroupUnavailable(f"cannot enable the cpu controller in {control}: {error}") from error


def _install_signal_handlers() -> bool:
    """While a group exists, SIGTERM and SIGINT end the benchmark through `finally` (main thread only)."""
    if _previous_handlers:
        return False
    try:
        for signum in (signal.SIGTERM, signal.SIGINT):
            _previous_handlers[signum] = signal.signal(signum, _stop_on_signal)
    except ValueError:  # not the main thread: atexit and `finally` still remove the group
        _previous_handlers.clear()
        return False
    return True


def _restore_signal_handlers() -> None:
    for signum, handler in _previous_handlers.items():
        signal.signal(signum, handler)
    _previous_handlers.clear()


def remove_group(path: str, *, attempts: int = 50) -> None:
    """Move every process left in the group at `path` to its parent group, then remove it (nothing if it is gone)."""
    parent_procs = os.path.join(os.path.dirname(path), "cgroup.procs")
    for _ in range(attempts):
        if not os.path.isdir(path):
            return
        try:
            with open(os.path.join(path, "cgroup.procs"), encoding="utf-8") as f:
                pids = [line.strip() for line in f if line.strip()]
            for pid in pids:
                with contextlib.suppress(OSError):  # it may have exited meanwhile
                    with open(parent_procs, "w", encoding="utf-8") as f:
                        f.write(pid)
            os.rmdir(path)
            return
        except OSError:
            time.sleep(0.1)  # a process was still leaving (rmdir: EBUSY)
    raise RuntimeError(f"could not remove the cgroup {path}: processes keep entering it")


def remove_stale_groups(parent: str) -> list[str]:
    """Remove the groups a benchmark killed with SIGKILL left behind (named after a process that is gone)."""
    removed = []
    for name in sorted(os.listdir(parent)) if os.path.isdir(parent) else []:
        if not name.startswith(PREFIX):
            continue
        creator = name[len(PREFIX) :].split("-", 1)[0]
        if creator.isdigit() and not os.path.exists(f"/proc/{creator}"):
            remove_group(os.path.join(parent, name))
            removed.append(name)
    return removed


def join_from_environment(rank: int) -> bool:
    """In a worker: join the slow group when the benchmark listed this global rank (`ENV_RANKS`); whether it did."""
    procs, ranks = os.environ.get(ENV_PROCS), os.environ.get(ENV_RANKS, "")
    if not procs or str(rank) not in ranks.split(","):
        return False
    with open(procs, "w", encoding="utf-8") as f:
        f.write(str(os.getpid()))
    return True
