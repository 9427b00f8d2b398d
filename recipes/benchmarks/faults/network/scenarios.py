"""The scenarios of `faults network` (pure): what each does to the links, when, under which launcher, and what it
expects.

A scenario is a list of `Action`s on the testbed's links (`toolkit.testbeds.link_faults`), each taking effect `delay` seconds
after an event of the run (`When`): the first worker entering a round's outer step or a merge at or after a step
(`phases-rank{R}.jsonl`), the furthest worker completing a step (`progress-rank{R}.jsonl`), or the previous action.
A link that is never restored stays down until the run has ended (the benchmark's exit restores every link).
"""

from dataclasses import dataclass, field


__all__ = [
    "BANDWIDTH",
    "CONFIG",
    "DEFAULT_TIMEOUTS",
    "LAUNCHERS",
    "SCENARIO_NAMES",
    "SLOW_FACTOR",
    "TIMEOUT_KEYS",
    "Action",
    "Scenario",
    "When",
    "flapping",
    "scenarios",
]

LAUNCHERS = ("accelerate", "torchrun")
# The runs' settings (the AdLoCoConfig overrides of `toolkit/worker/fault_run.py`): 4 workers in 2 instances that
# merge once, after round 3, into one instance of 4 (whose outer all-reduce is then the whole world's); a checkpoint
# every 2 rounds. The timeouts are the library's defaults: what a user gets.
CONFIG = dict(
    max_steps=80, inner_steps=10, save_steps=20, save_total_limit=3, num_instances=2, merge_every=3,
    per_device_train_batch_size=2, max_batch_size=4, batch_size_cap=4, eta=0.5, seed=3, optim="adamw_torch",
    learning_rate=3e-3, lr_batch_scaling="sqrt",
)  # fmt: skip
SLOW_FACTOR = 100  # a straggler's link: the testbed's rate / 100
# A straggler's link carries int4 pseudo-gradients, so that a round through 1 Mbit/s takes seconds, not minutes.
SLOW_CONFIG = {"pseudo_grad_compression": "int4"}
BANDWIDTH = "10mbit"  # every link's rate, both ways: a round's outer step takes seconds, a merge tens of seconds
# The library's default timeouts (worker_timeout 1800 s; peer_timeout then resolves to 45 s: common/liveness.py),
# where the other scenarios run the benchmark's --worker_timeout (30 s, the peer watch off).
DEFAULT_TIMEOUTS = {"worker_timeout": 1800.0, "ddp_timeout": 1800}
TIMEOUT_KEYS = ("worker_timeout", "ddp_timeout", "peer_timeout")


@dataclass(frozen=True)
class When:
    """When an action takes effect: `delay` seconds after `event`:

    - `"outer"` / `"merge"`: the first worker entering a round's outer step (its all-reduce) / a merge, at step
      `step` or later, in the run's current launch attempt;
    - `"step"`: the furthest worker having completed step `step` (its round's end included);
    - `"previous"`: the previous action.
    """

    event: str
    step: int = 0
    delay: float = 0.0

    def __post_init__(self):
        if self.event not in ("outer", "merge", "step", "previous"):
            raise ValueError(f"event must be outer, merge, step or previous, got {self.event!r}")
        if self.delay < 0 or self.step < 0:
            raise ValueError(f"delay and step must be >= 0, got {self.delay}, {self.step}")


@dataclass(frozen=True)
class Action:
    """One change of the links: `kind` (`cut`, `restore`, `partition`, `heal`, `slow`, `unslow`) on `workers`."""

    kind: str
    workers: tuple[int, ...]
    when: When

    def __post_init__(self):
        if self.kind not in ("cut", "restore", "partition", "heal", "slow", "unslow"):
            raise ValueError(f"unknown action {self.kind!r}")


@dataclass(frozen=True)
class Scenario:
    """A run of 4 machines with `actions` on their links.

    Args:
        name: its name on the command line and in the table.
        what: the fault, in words.
        actions: the changes of the links, in order.
        launcher: `accelerate` (`accelerate launch --max_restarts`, static rendezvous: a restart waits for every
            machine) or `torchrun` (`--rdzv-backend c10d --nnodes 3:4`: a restart goes on with the machines there).
        expect: `"no_restart"` (the run rides the fault out), `"restart"` (named, restarted, resumed from a
            checkpoint), or `"elastic"` (restarted without a machine: an elastic resume).
        config: AdLoCoConfig overrides of `CONFIG` (the reference run uses the same ones).
        bandwidth: every link's rate (`tc tbf`, both ways).
        deadline: seconds after which the benchmark stops the run (a scenario that needs it did not end by itself).
    """

    name: str
    what: str
    actions: tuple[Action, ...]
    launcher: str = "accelerate"
    expect: str = "no_restart"
    config: dict = field(default_factory=dict)
    bandwidth: str = BANDWIDTH
    deadline: float = 480.0

    def __post_init__(self):
        if self.launcher not in LAUNCHERS:
            raise ValueError(f"launcher must be one of {LAUNCHERS}, got {self.launcher!r}")
        if self.expect not in ("no_restart", "restart", "elastic"):
            raise ValueError(f"expect must be no_restart, restart or elastic, got {self.expect!r}")

    @property
    def reference_key(self) -> str:
        """Runs with the same launcher, links and config share one uninterrupted reference run."""
        # the timeouts do not change what an uninterrupted run computes
        overrides = "".join(f"-{k}={self.config[k]}" for k in sorted(self.config) if k not in TIMEOUT_KEYS)
        return f"{self.launcher}-{self.bandwidth}{overrides}"


def flapping(k: int, step: int, down: float, up: float, seconds: float) -> tuple[Action, ...]:
    """Worker K's link down for `down` seconds and up for `up`, again and again for `seconds`, from step `step`."""
    actions, elapsed = [], 0.0
    while elapsed + down <= seconds:
        first = not actions
        actions.append(Action("cut", (k,), When("step", step) if first else When("previous", delay=up)))
        actions.append(Action("restore", (k,), When("previous", delay=down)))
        elapsed += down + up
    return tuple(actions)


def _scenarios(worker_timeout: float) -> list[Scenario]:
    brief = 5.0  # well under worker_timeout, and under a round's outer step at 10 Mbit/s
    long = worker_timeout + 30.0  # longer than worker_timeout: the worker is named, the run restarts
    return [
        Scenario(
            "down_in_allreduce",
            f"worker 3's link down {brief:g} s, 1 s into round 2's outer all-reduce",
            (Action("cut", (3,), When("outer", 20, 1.0)), Action("restore", (3,), When("previous", delay=brief))),
        ),
        Scenario(
            "down_in_merge",
            f"worker 1's link down {brief:g} s, 1 s into the merge after round 3",
            (Action("cut", (1,), When("merge", 30, 1.0)), Action("restore", (1,), When("previous", delay=brief))),
        ),
        Scenario(
            "down_then_back",
            f"worker 2's link down {long:g} s (> worker_timeout) mid-round 5, then back",
            (Action("cut", (2,), When("step", 45)), Action("restore", (2,), When("previous", delay=long))),
            expect="restart",
        ),
        Scenario(
            "down_for_good",
            "worker 3's link down for good mid-round 5 (torchrun c10d, --nnodes 3:4)",
            (Action("cut", (3,), When("step", 45)),),
            launcher="torchrun",
            expect="elastic",
            # the cut machine's worker ends 30 s after the fault (its store calls are bounded: common/job_store.py);
            # its launcher gives up only after torchrun's join_timeout (launch.JOIN_SECONDS) and its store's reads
            # across the dead link: the fault at about 100 s, + 30 s, + 240 s, + TCP's own retries (~15 minutes)
            deadline=1500.0,
        ),
        Scenario(
            "flapping",
            "worker 2's link down 3 s / up 3 s for 60 s, from step 15",
            flapping(2, 15, down=3.0, up=3.0, seconds=60.0),
        ),
        Scenario(
            "slow_link",
            f"worker 1's link {SLOW_FACTOR}x slower (100 to 1 Mbit/s) from step 50, equal batches",
            (Action("slow", (1,), When("step", 50)),),
            config=SLOW_CONFIG,
            bandwidth="100mbit",
        ),
        Scenario(
            "slow_link_speed_split",
            f"worker 1's link {SLOW_FACTOR}x slower from step 50, worker_batch_split='speed'",
            (Action("slow", (1,), When("step", 50)),),
            config={**SLOW_CONFIG, "worker_batch_split": "speed"},
            bandwidth="100mbit",
        ),
        Scenario(
            "partition",
            f"workers 2, 3 apart from 0, 1 for {long:g} s mid-round 5, then joined",
            (Action("partition", (2, 3), When("step", 45)), Action("heal", (2, 3), When("previous", delay=long))),
            expect="restart",
        ),
        Scenario(
            "down_then_back_defaults",
            "worker 2's link down 60 s mid-round 5, then back, under the default timeouts (worker_timeout 1800 s, "
            "peer_timeout 45 s)",
            (Action("cut", (2,), When("step", 45)), Action("restore", (2,), When("previous", delay=60.0))),
            expect="restart",
            config=DEFAULT_TIMEOUTS,
        ),
        Scenario(
            "flapping_defaults",
            "worker 2's link down 3 s / up 3 s for 60 s, from step 15, under the default timeouts",
            flapping(2, 15, down=3.0, up=3.0, seconds=60.0),
            config=DEFAULT_TIMEOUTS,
        ),
        Scenario(
            "store_host_down_defaults",
            "worker 0's link (the rendezvous and store host) down 60 s mid-round 5, then back, under the default "
            "timeouts",
            (Action("cut", (0,), When("step", 45)), Action("restore", (0,), When("previous", delay=60.0))),
            expect="restart",
            config=DEFAULT_TIMEOUTS,
        ),
        Scenario(
            "store_host_down",
            f"worker 0's link (the rendezvous and store host) down {long:g} s mid-round 5, then back",
            (Action("cut", (0,), When("step", 45)), Action("restore", (0,), When("previous", delay=long))),
            expect="restart",
        ),
    ]


def scenarios(worker_timeout: float) -> dict[str, Scenario]:
    """The scenarios by name, their outage lengths set from `worker_timeout` (the runs' worker_timeout)."""
    return {s.name: s for s in _scenarios(worker_timeout)}


SCENARIO_NAMES = tuple(scenarios(30.0))
