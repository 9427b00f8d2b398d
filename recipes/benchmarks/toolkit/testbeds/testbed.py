"""The links testbed (`links`, and any benchmark over slow links): one Linux network namespace per worker, joined by a
bridge, every link limited by `tc ... tbf` in both directions; building it, rate-limiting it, reading its counters and
removing it. Launching a run's machines on it is `machines.py`.

Worker K lives in namespace `{prefix}-wK` with its end `lnkK` of a veth pair (address `{subnet}.{10 + K}/24`, private
and used only inside these namespaces); the other end `lnkKb` is a port of the bridge `br0` in namespace
`{prefix}-br`. Both ends get a `tbf` root qdisc, so each limits one direction (egress of both ends). Building and
removing it needs root and iproute2; the plan and the commands are pure and tested without either.

Removal (`teardown`) deletes every namespace of the plan, whether or not `ip netns list` shows it, after killing
what still runs in it; the links, the bridge and the qdiscs go with the namespaces. `Testbed` removes them on every
exit of its `with` block (SIGTERM and SIGHUP become SystemExit, SIGINT is KeyboardInterrupt) and ignores these
signals while it removes them, so a second signal cannot stop the removal halfway.
"""

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass


__all__ = [
    "LATENCY_MS",
    "SAMPLE_SECONDS",
    "LinkPlan",
    "NamespacesUnavailable",
    "Sampler",
    "Testbed",
    "default_burst",
    "existing_namespaces",
    "kill_namespace_processes",
    "parse_rate",
    "setup_commands",
    "signals_ignored",
    "tbf_command",
    "tbf_commands",
    "Teardown",
    "teardown",
    "unavailable_reason",
]

LATENCY_MS = 50  # tbf's queue: at most this long a packet waits for tokens before it is dropped
SAMPLE_SECONDS = 0.25  # the counters' timeline
# The signals that must not interrupt the removal of the testbed.
TEARDOWN_SIGNALS = (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)


class NamespacesUnavailable(RuntimeError):
    """The testbed cannot be built here (not root, no `ip`/`tc`, `ip netns add` or `tbf` refused)."""


# ---- the plan and its commands (pure)
@dataclass(frozen=True)
class LinkPlan:
    """Names and addresses of the testbed: worker K in namespace `{prefix}-wK` with the link `lnkK` (address
    `{subnet}.{10 + K}/24`), its peer `lnkKb` on the bridge `br0` in namespace `{prefix}-br`."""

    workers: int = 4
    prefix: str = "adlk"
    subnet: str = "10.213.87"
    bridge: str = "br0"

    def __post_init__(self):
        if not 1 <= self.workers <= 200:
            raise ValueError(f"workers must be in 1..200, got {self.workers}")
        if not re.fullmatch(r"[a-z][a-z0-9-]{0,20}", self.prefix):
            raise ValueError(f"prefix must be lowercase letters, digits and '-' (<= 21 chars), got {self.prefix!r}")
        octets = self.subnet.split(".")
        if len(octets) != 3 or not all(o.isdigit() and 0 <= int(o) <= 255 for o in octets):
            raise ValueError(f"subnet must be the first three octets of a /24, e.g. '10.213.87', got {self.subnet!r}")

    def namespace(self, k: int) -> str:
        return f"{self.prefix}-w{k}"

    @property
    def bridge_namespace(self) -> str:
        return f"{self.prefix}-br"

    @property
    def namespaces(self) -> list[str]:
        return [self.bridge_namespace, *(self.namespace(k) for k in range(self.workers))]

    def veth(self, k: int) -> str:
        """Worker K's end of its link, inside its namespace (what GLOO_SOCKET_IFNAME names)."""
        return f"lnk{k}"

    def peer(self, k: int) -> str:
        """The bridge's end of worker K's link, inside the bridge namespace."""
        return f"lnk{k}b"

    def address(self, k: int) -> str:
        return f"{self.subnet}.{10 + k}"


def setup_commands(plan: LinkPlan) -> list[list[str]]:
    """The `ip` commands that build the testbed (no qdiscs yet): namespaces, loopbacks, bridge, links, addresses."""
    br = plan.bridge_namespace
    commands = [
        ["ip", "netns", "add", br],
        ["ip", "-n", br, "link", "set", "lo", "up"],
        ["ip", "-n", br, "link", "add", plan.bridge, "type", "bridge"],
        ["ip", "-n", br, "link", "set", plan.bridge, "up"],
    ]
    for k in range(plan.workers):
        ns, veth, peer = plan.namespace(k), plan.veth(k), plan.peer(k)
        commands += [
            ["ip", "netns", "add", ns],
            ["ip", "-n", ns, "link", "set", "lo", "up"],
            ["ip", "link", "add", veth, "netns", ns, "type", "veth", "peer", "name", peer, "netns", br],
            ["ip", "-n", ns, "addr", "add", f"{plan.address(k)}/24", "dev", veth],
            ["ip", "-n", ns, "link", "set", veth, "up"],
            ["ip", "-n", br, "link", "set", peer, "master", plan.bridge],
            ["ip", "-n", br, "link", "set", peer, "up"],
        ]
    return commands


_RATE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(bit|bps)?\s*$", re.IGNORECASE)


def parse_rate(text: str) -> int:
    """A tc rate (`10mbit`, `1gbit`, `500kbit`, `12.5mbps` = bytes/s, a bare number = bit/s) in bits per second."""
    match = _RATE.match(str(text))
    if not match:
        raise ValueError(f"not a rate: {text!r} (e.g. 10mbit, 100mbit, 1gbit)")
    number, prefix, unit = match.groups()
    value = float(number) * {"": 1, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12}[prefix.lower()]
    if (unit or "bit").lower() == "bps":
        value *= 8
    if value <= 0:
        raise ValueError(f"a rate must be positive: {text!r}")
    return int(round(value))


def default_burst(rate_bits: int) -> int:
    """tbf's bucket in bytes: at least 64 KiB (what DESIGN §9 measured at 100 Mbit/s), and 4 ms of traffic at high
    rates so the bucket refills between timer ticks."""
    return max(64 * 1024, rate_bits // 8 // 250)


def tbf_command(namespace: str, device: str, rate_bits: int, burst_bytes: int, latency_ms: int) -> list[str]:
    """`tc qdisc replace ... root tbf` on one end of a link: limits that end's egress."""
    return [
        "ip", "netns", "exec", namespace, "tc", "qdisc", "replace", "dev", device, "root", "tbf",
        "rate", f"{rate_bits}bit", "burst", str(burst_bytes), "latency", f"{latency_ms}ms",
    ]  # fmt: skip


def tbf_commands(plan: LinkPlan, rate_bits: int, burst_bytes: int, latency_ms: int = LATENCY_MS) -> list[list[str]]:
    """Both directions of every link: the worker's egress (upload) and the bridge port's egress (download)."""
    commands = []
    for k in range(plan.workers):
        commands.append(tbf_command(plan.namespace(k), plan.veth(k), rate_bits, burst_bytes, latency_ms))
        commands.append(tbf_command(plan.bridge_namespace, plan.peer(k), rate_bits, burst_bytes, latency_ms))
    return commands


# ---- the testbed (root only)
def _run(command: Sequence[str], check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(list(command), capture_output=True, text=True, timeout=60, check=check)


def existing_namespaces() -> set[str] | None:
    """The network namespaces `ip netns list` shows; None when the listing failed (then nothing is known)."""
    try:
        out = _run(["ip", "netns", "list"]).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return {line.split()[0] for line in out.splitlines() if line.strip()}


def _namespace_pids(namespace: str) -> list[int]:
    try:
        out = _run(["ip", "netns", "pids", namespace], check=False).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return [int(p) for p in out.split() if p.isdigit()]


def kill_namespace_processes(namespace: str, grace: float = 5.0) -> None:
    """SIGTERM, then SIGKILL, to the processes running in one of the testbed's namespaces (our launches)."""
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 2.0)):
        pids = _namespace_pids(namespace)
        if not pids:
            return
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline and _namespace_pids(namespace):
            time.sleep(0.1)


_ABSENT = ("No such file or directory", "does not exist")


@dataclass
class Teardown:
    """What `teardown` did: the namespaces it deleted, and `{namespace: error}` for those it failed to delete."""

    removed: list[str]
    failed: dict[str, str]


def teardown(plan: LinkPlan) -> Teardown:
    """Remove the plan's namespaces (and with them the links, the bridge and the qdiscs).

    Every namespace of the plan is deleted (after its processes are killed) whether or not `ip netns list` shows
    it, so a failed listing cannot leave the testbed behind. A namespace that does not exist is skipped silently;
    every other failure is printed to stderr and returned in `failed`."""
    removed, failed = [], {}
    for namespace in plan.namespaces:
        kill_namespace_processes(namespace)
        command = ["ip", "netns", "delete", namespace]
        try:
            done = _run(command, check=False)
        except (OSError, subprocess.SubprocessError) as error:
            failed[namespace] = f"{type(error).__name__}: {error}"
        else:
            if done.returncode == 0:
                removed.append(namespace)
            elif not any(text in (done.stderr or "") for text in _ABSENT):
                failed[namespace] = (done.stderr or "").strip() or f"exit {done.returncode}"
        if namespace in failed:
            print(f"teardown: `{' '.join(command)}` failed: {failed[namespace]}", file=sys.stderr, flush=True)
    return Teardown(removed, failed)


@contextlib.contextmanager
def signals_ignored(signals: Sequence[int] = TEARDOWN_SIGNALS) -> Iterator[None]:
    """Ignore `signals` inside the block (main thread only; elsewhere a no-op) and restore the previous handlers
    after it."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {}
    try:
        for sig in signals:
            previous[sig] = signal.signal(sig, signal.SIG_IGN)
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, signal.SIG_DFL if handler is None else handler)


def unavailable_reason() -> str | None:
    """Why the testbed cannot be built here, or None."""
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        return "network namespaces need root (run as root, e.g. sudo)"
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return f"`{tool}` (iproute2) is not installed"
    return None


class Testbed:
    """The namespaces, links, bridge and qdiscs of a `LinkPlan`, removed on every exit of the `with` block (and on
    SIGTERM/SIGHUP, turned into SystemExit; SIGINT is KeyboardInterrupt). Leftovers with the same names are removed
    first. While it removes them, SIGTERM, SIGHUP and SIGINT are ignored. Raises `NamespacesUnavailable` where they
    cannot be built."""

    SIGNALS = (signal.SIGTERM, signal.SIGHUP)

    def __init__(self, plan: LinkPlan):
        self.plan = plan
        self.rate: tuple[int, int, int] | None = None
        self.teardown: Teardown | None = None
        self._handlers: dict = {}

    def __enter__(self) -> "Testbed":
        reason = unavailable_reason()
        if reason:
            raise NamespacesUnavailable(reason)
        if threading.current_thread() is threading.main_thread():
            for sig in self.SIGNALS:
                self._handlers[sig] = signal.signal(sig, self._on_signal)
        try:
            with signals_ignored():
                leftovers = teardown(self.plan)
            if leftovers.removed:
                print(f"removed leftover namespaces: {' '.join(leftovers.removed)}", flush=True)
            for command in setup_commands(self.plan):
                done = _run(command, check=False)
                if done.returncode != 0:
                    raise NamespacesUnavailable(f"`{' '.join(command)}` failed: {done.stderr.strip()}")
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc) -> None:
        try:
            with signals_ignored():
                self.teardown = teardown(self.plan)
        finally:
            for sig, handler in self._handlers.items():
                signal.signal(sig, signal.SIG_DFL if handler is None else handler)
            self._handlers.clear()

    @staticmethod
    def _on_signal(signum, frame):
        raise SystemExit(128 + signum)

    def limit(self, rate_bits: int, burst: int, latency_ms: int = LATENCY_MS) -> None:
        """Rate-limit every link, both ways (replaces the previous limit)."""
        for command in tbf_commands(self.plan, rate_bits, burst, latency_ms):
            done = _run(command, check=False)
            if done.returncode != 0:
                raise NamespacesUnavailable(f"`{' '.join(command)}` failed: {done.stderr.strip()}")
        self.rate = (rate_bits, burst, latency_ms)

    def counters(self) -> list[dict]:
        """Per worker: the `tx_bytes` and `rx_bytes` of its end of the link (in its namespace)."""
        out = []
        for k in range(self.plan.workers):
            stats = f"/sys/class/net/{self.plan.veth(k)}/statistics"
            text = _run(
                ["ip", "netns", "exec", self.plan.namespace(k), "cat", f"{stats}/tx_bytes", f"{stats}/rx_bytes"]
            )
            tx, rx = (int(v) for v in text.stdout.split())
            out.append({"tx": tx, "rx": rx})
        return out

    def bridge_counters(self) -> tuple[list[int], list[int]]:
        """Worker-side (tx, rx) of every link, read in one call on the bridge's ends (their rx is the worker's tx)."""
        files = []
        for k in range(self.plan.workers):
            stats = f"/sys/class/net/{self.plan.peer(k)}/statistics"
            files += [f"{stats}/rx_bytes", f"{stats}/tx_bytes"]
        values = [
            int(v) for v in _run(["ip", "netns", "exec", self.plan.bridge_namespace, "cat", *files]).stdout.split()
        ]
        return values[0::2], values[1::2]


class Sampler(threading.Thread):
    """Samples the links' counters every `interval` seconds: `[[time.time(), [tx per worker], [rx per worker]]]`."""

    def __init__(self, testbed: Testbed, interval: float = SAMPLE_SECONDS):
        super().__init__(daemon=True)
        self.testbed, self.interval = testbed, interval
        self.timeline: list[list] = []
        self.stopped = threading.Event()

    def sample(self) -> None:
        try:
            tx, rx = self.testbed.bridge_counters()
        except (OSError, subprocess.SubprocessError, ValueError):
            return
        self.timeline.append([time.time(), tx, rx])

    def run(self) -> None:
        while not self.stopped.is_set():
            self.sample()
            self.stopped.wait(self.interval)

    def stop(self) -> list[list]:
        self.stopped.set()
        self.join()
        self.sample()
        return self.timeline
