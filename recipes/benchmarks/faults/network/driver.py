"""One scenario carried out: its machines launched on the testbed, each action applied to the links when its event
comes, the run watched until every machine's launcher has ended (or the scenario's deadline), every link restored."""

import os
import shutil
import time
from dataclasses import dataclass, field

from recipes.benchmarks.faults.network.launch import POLL_SECONDS, Machines
from recipes.benchmarks.faults.network.phases import Phases
from recipes.benchmarks.faults.network.scenarios import Action, Scenario
from recipes.benchmarks.faults.progress import Progress
from recipes.benchmarks.toolkit.testbeds.link_faults import FaultEvent, LinkFaults
from recipes.benchmarks.toolkit.testbeds.testbed import Testbed


__all__ = ["Watched", "event_time", "run_scenario", "worker_spec"]


def worker_spec(out: str, probe: str, scenario: Scenario, config: dict, world_size: int) -> dict:
    """The fault run's spec (`toolkit/worker/fault_run.py`): resume automatically, record steps and phases, fresh
    data throughout."""
    config = {**config, **scenario.config}
    sizes = [world_size - 1, world_size] if scenario.launcher == "torchrun" else [world_size]
    return {
        "output_dir": out,
        "world_size": sizes,
        "probe_dir": probe,
        "config": config,
        "dropout": 0.1,
        "model": {"hidden_size": 256, "layers": 4},
        "resume": "auto",
        "progress": True,
        "phases": True,
        "num_samples": config["max_steps"] * config["batch_size_cap"] * world_size,
    }


@dataclass
class Watched:
    """What a scenario's run left: the machines' exit codes, the link changes, the steps, phases and log lines."""

    scenario: Scenario
    out: str
    started: float
    ended: float
    codes: list[int | None]
    events: list[FaultEvent]
    progress: Progress
    phases: Phases
    lines: list[tuple[float, int, str]]
    stopped_at_deadline: bool = False
    actions_left: list[Action] = field(default_factory=list)


def event_time(action: Action, progress: Progress, phases: Phases, previous: float | None) -> float | None:
    """When `action`'s event happened (before its delay), or None while it has not."""
    when = action.when
    if when.event == "previous":
        return previous
    attempt = progress.attempt()
    if when.event in ("outer", "merge"):
        return phases.first_begin(when.event, when.step, attempt)
    for points in progress.steps.get(attempt, {}).values():
        hit = [t for s, t in points if s >= when.step]
        if hit:
            return min(hit)
    return None


def run_scenario(testbed: Testbed, scenario: Scenario, folder: str, config: dict, *, actions: bool = True) -> Watched:
    """Launch the scenario's machines in `folder`, apply its actions (none with `actions=False`: the reference run),
    and watch until every launcher has ended or the deadline passed (then every process of the run is killed)."""
    shutil.rmtree(folder, ignore_errors=True)
    out, probe = os.path.join(folder, "run"), os.path.join(folder, "probe")
    os.makedirs(probe)
    world = testbed.plan.workers
    spec = worker_spec(out, probe, scenario, config, world)
    progress, phases = Progress(probe, world), Phases(probe, world)
    pending = list(scenario.actions) if actions else []
    with LinkFaults(testbed) as faults:
        machines = Machines(testbed.plan, scenario.launcher, spec, folder, scenario.deadline + 60, scenario.name)
        try:
            stopped = _watch(machines, faults, pending, progress, phases, machines.started + scenario.deadline)
        except BaseException:  # an error or Ctrl-C: no launch of this scenario runs on into the next one
            machines.stop()
            raise
        for thread in machines.threads:
            thread.join()
        events = list(faults.events)
    progress.read()
    phases.read()
    machines.logs.read()
    return Watched(
        scenario, out, machines.started, time.time(), machines.codes, events, progress, phases,
        machines.logs.lines, stopped, pending,
    )  # fmt: skip


def _watch(machines: Machines, faults: LinkFaults, pending: list, progress, phases, deadline: float) -> bool:
    """Apply each pending action when its event has come, until every launch has ended; True when the deadline
    passed first (every process of the run then killed)."""
    previous: float | None = None
    while machines.running():
        time.sleep(POLL_SECONDS)
        progress.read()
        phases.read()
        machines.logs.read()
        while pending:
            at = event_time(pending[0], progress, phases, previous)
            if at is None or time.time() < at + pending[0].when.delay:
                break
            previous = _apply(faults, pending.pop(0)).time
        if time.time() > deadline:
            machines.stop()
            return True
    return False


def _apply(faults: LinkFaults, action: Action) -> FaultEvent:
    k = action.workers[0] if action.workers else None
    if action.kind == "cut":
        return faults.cut(k)
    if action.kind == "restore":
        return faults.restore(k)
    if action.kind == "partition":
        return faults.partition(action.workers)
    if action.kind == "heal":
        return faults.heal()
    rate, _, _ = faults.testbed.rate
    if action.kind == "slow":
        from recipes.benchmarks.faults.network.scenarios import SLOW_FACTOR

        return faults.slow(k, rate // SLOW_FACTOR)
    return faults.unslow(k)
