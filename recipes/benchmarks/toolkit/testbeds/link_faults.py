"""Faults of the links testbed's links (`testbed.py`): a link cut and restored, two groups of machines split apart and
joined again, a link slowed and given its rate back. Every change is recorded, with its time, and undone on exit.

A cut is a switch port going dark: the bridge's end of worker K's link (`lnkKb`, in the bridge namespace) is set
down with `ip link set ... down`, so worker K's own interface keeps its address and routes and sees its carrier go
(as a machine sees a cable pulled at the switch). A partition moves the ports of one side to a second bridge
(`br1`) in the same namespace: the machines of each side still reach each other, never the other side. A slowed
link gets a `tbf` of another rate on both its ends. Only the namespaces the testbed created are touched.

    with Testbed(plan) as testbed, LinkFaults(testbed) as faults:
        faults.cut(3)
        faults.restore(3)     # or leave it: the `with` block's exit restores every link and heals every split

The commands are pure (`cut_command`, `partition_commands` ...), tested without root.
"""

import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from recipes.benchmarks.toolkit.testbeds.testbed import LATENCY_MS, LinkPlan, Testbed, default_burst, tbf_command


__all__ = [
    "SPLIT_BRIDGE",
    "FaultEvent",
    "LinkFaults",
    "cut_command",
    "heal_commands",
    "partition_commands",
    "restore_command",
    "slow_commands",
]

SPLIT_BRIDGE = "br1"  # the second bridge of a partition, in the bridge namespace


def cut_command(plan: LinkPlan, k: int) -> list[str]:
    """Worker K's switch port set down: its link carries nothing, either way."""
    return ["ip", "-n", plan.bridge_namespace, "link", "set", plan.peer(k), "down"]


def restore_command(plan: LinkPlan, k: int) -> list[str]:
    return ["ip", "-n", plan.bridge_namespace, "link", "set", plan.peer(k), "up"]


def partition_commands(plan: LinkPlan, side: Sequence[int]) -> list[list[str]]:
    """A second bridge, and the ports of `side`'s workers moved onto it: `side` and the rest cannot reach each other."""
    br = plan.bridge_namespace
    commands = [
        ["ip", "-n", br, "link", "add", SPLIT_BRIDGE, "type", "bridge"],
        ["ip", "-n", br, "link", "set", SPLIT_BRIDGE, "up"],
    ]
    return commands + [["ip", "-n", br, "link", "set", plan.peer(k), "master", SPLIT_BRIDGE] for k in side]


def heal_commands(plan: LinkPlan, side: Sequence[int]) -> list[list[str]]:
    """`side`'s ports back on the testbed's bridge, and the second bridge deleted."""
    br = plan.bridge_namespace
    commands = [["ip", "-n", br, "link", "set", plan.peer(k), "master", plan.bridge] for k in side]
    return commands + [["ip", "-n", br, "link", "delete", SPLIT_BRIDGE]]


def slow_commands(plan: LinkPlan, k: int, rate_bits: int, burst_bytes: int | None = None) -> list[list[str]]:
    """Worker K's link at `rate_bits` both ways (its two ends' `tbf`, replaced)."""
    burst = default_burst(rate_bits) if burst_bytes is None else burst_bytes
    return [
        tbf_command(plan.namespace(k), plan.veth(k), rate_bits, burst, LATENCY_MS),
        tbf_command(plan.bridge_namespace, plan.peer(k), rate_bits, burst, LATENCY_MS),
    ]


@dataclass(frozen=True)
class FaultEvent:
    """One change of the links: `time.time()` when it took effect, what (`cut`, `restore`, `partition`, `heal`,
    `slow`, `unslow`) and on which workers."""

    time: float
    action: str
    workers: tuple[int, ...]
    detail: str = ""


@dataclass
class LinkFaults:
    """The faults applied to a `Testbed`'s links, undone on exit of the `with` block (however it ends).

    Args:
        testbed: the testbed whose links are changed (its `rate`, set by `Testbed.limit`, is the one a slowed link
            gets back).
        run: runs one command (default: `subprocess.run`, raising on failure), replaced in tests.
    """

    testbed: Testbed
    run: Callable[[list[str]], None] | None = None
    events: list[FaultEvent] = field(default_factory=list)
    _cut: set[int] = field(default_factory=set)
    _split: tuple[int, ...] | None = None
    _slowed: set[int] = field(default_factory=set)

    def __enter__(self) -> "LinkFaults":
        return self

    def __exit__(self, *exc) -> None:
        self.restore_all()

    @property
    def plan(self) -> LinkPlan:
        return self.testbed.plan

    def _apply(self, commands: list[list[str]], action: str, workers: Sequence[int], detail: str = "") -> FaultEvent:
        for command in commands:
            if self.run is not None:
                self.run(command)
            else:
                done = subprocess.run(command, capture_output=True, text=True, timeout=30)
                if done.returncode != 0:
                    raise RuntimeError(f"`{' '.join(command)}` failed: {done.stderr.strip()}")
        event = FaultEvent(time.time(), action, tuple(workers), detail)
        self.events.append(event)
        return event

    def cut(self, k: int) -> FaultEvent:
        """Worker K's link down (nothing passes until `restore`)."""
        event = self._apply([cut_command(self.plan, k)], "cut", [k])
        self._cut.add(k)
        return event

    def restore(self, k: int) -> FaultEvent:
        event = self._apply([restore_command(self.plan, k)], "restore", [k])
        self._cut.discard(k)
        return event

    def partition(self, side: Sequence[int]) -> FaultEvent:
        """`side`'s workers apart from the others (one split at a time)."""
        if self._split is not None:
            raise RuntimeError(f"workers {list(self._split)} are already split off; heal first")
        event = self._apply(partition_commands(self.plan, side), "partition", side)
        self._split = tuple(side)
        return event

    def heal(self) -> FaultEvent:
        side = self._split or ()
        event = self._apply(heal_commands(self.plan, side), "heal", side)
        self._split = None
        return event

    def slow(self, k: int, rate_bits: int) -> FaultEvent:
        """Worker K's link at `rate_bits` both ways, until `unslow`."""
        event = self._apply(slow_commands(self.plan, k, rate_bits), "slow", [k], f"{rate_bits}bit")
        self._slowed.add(k)
        return event

    def unslow(self, k: int) -> FaultEvent:
        """Worker K's link back at the testbed's rate (`Testbed.limit`'s)."""
        rate, burst, _ = self.testbed.rate
        event = self._apply(slow_commands(self.plan, k, rate, burst), "unslow", [k], f"{rate}bit")
        self._slowed.discard(k)
        return event

    def restore_all(self) -> None:
        """Every link restored, every split healed, every slowed link at the testbed's rate; each undo is tried even
        when another fails (the testbed's teardown removes the namespaces in any case)."""
        undo = [(self.restore, k) for k in sorted(self._cut)] + [(self.unslow, k) for k in sorted(self._slowed)]
        if self._split is not None:
            undo.append((lambda _: self.heal(), None))
        for action, k in undo:
            try:
                action(k)
            except (OSError, RuntimeError, subprocess.SubprocessError) as error:
                print(f"link faults: could not undo on worker {k}: {error}", flush=True)
