"""`RoundState`: where a worker stands among the rounds: the instance table, this worker's plan, the round's bounds
and the run's totals. The same on every worker after each round (every rank takes the same decisions)."""

import time
from dataclasses import asdict, dataclass, field
from typing import Any

from ..batch.startup_profile import StartupProfile
from ..instances.table import Instance, instance_of
from ..rounds.plan import WorkerPlan
from ..rounds.state import AdLoCoState, RunTotals


__all__ = ["RoundState"]


@dataclass
class RoundState:
    """The rounds so far, as one worker holds them.

    Attributes:
        inner_steps: H of the current round (it grows with `inner_steps_rule="outer_noise"`).
        max_steps: the Trainer's `max_steps` (the last round may be short).
        outer_step: rounds completed.
        last_synced_step: the Trainer's step at the end of the last round (0 before the first).
        instances: the instance table.
        plan: this worker's plan for the current round (None before training starts).
        max_batch_size: a process's largest micro-batch, resolved when training starts (`"auto"` probes it).
        totals: the run's running totals.
        started: `time.time()` when this process started training (elapsed seconds add up across resumes).
        final_merged: whether the instances have been merged into the final model.
        startup_profile: the goodput rule's step and link costs measured before the first round (None without one:
            `batch/startup_profile.py`); checkpointed, so a resumed run decides from the same numbers.
    """

    inner_steps: int
    max_steps: int = 0
    outer_step: int = 0
    last_synced_step: int = 0
    instances: list[Instance] = field(default_factory=list)
    plan: WorkerPlan | None = None
    max_batch_size: int | None = None
    totals: RunTotals = field(default_factory=RunTotals)
    started: float = field(default_factory=time.time)
    final_merged: bool = False
    startup_profile: StartupProfile | None = None

    def instance_of(self, worker_id: int) -> Instance:
        """The instance `worker_id` trains now."""
        return instance_of(self.instances, worker_id)

    def is_round_end(self, step: int) -> bool:
        """Whether the round ends after `step` inner steps: at every multiple of the round's H (which divides
        `max_inner_steps`, and so every save and evaluation step), or at max_steps (the last round may be short)."""
        return step % self.inner_steps == 0 or step >= self.max_steps

    def steps_to_round_end(self, step: int) -> int:
        """Inner steps from `step` to the end of its round (0 at a round's end)."""
        if step == self.last_synced_step:
            return 0
        next_end = min(-(-step // self.inner_steps) * self.inner_steps, self.max_steps)
        return next_end - step

    def elapsed(self) -> float:
        """Training seconds across resumes."""
        return self.totals.elapsed + time.time() - self.started

    def snapshot(self) -> AdLoCoState:
        """Where the run stands (see [`AdLoCoState`])."""
        return AdLoCoState(
            rounds=self.outer_step,
            last_round_step=self.last_synced_step,
            tokens=self.totals.tokens,
            comm_bytes=self.totals.comm_bytes,
            merges=self.totals.merges,
            skipped_rounds=self.totals.skipped_rounds,
            elapsed_seconds=self.elapsed(),
            num_instances=len(self.instances),
            batch_sizes={i.id: i.batch_size for i in self.instances},
            workers={i.id: i.workers for i in self.instances},
            final_merged=self.final_merged,
        )

    def state_dict(self) -> dict[str, Any]:
        """The entries of a worker's checkpoint state that are the rounds' (`worker/saved_state.py`)."""
        return {
            "outer_step": self.outer_step,
            "last_synced_step": self.last_synced_step,
            "inner_steps": self.inner_steps,
            "instances": [i.to_row() for i in self.instances],
            "max_batch_size": self.max_batch_size,
            "totals": {**asdict(self.totals), "elapsed": self.elapsed()},
            "startup_profile": None if self.startup_profile is None else self.startup_profile.to_json(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """The inverse of `state_dict` (the instance table is read when training starts, before this)."""
        self.outer_step = int(state["outer_step"])
        self.last_synced_step = int(state["last_synced_step"])
        self.inner_steps = int(state.get("inner_steps", self.inner_steps))  # older checkpoints: a fixed H
        self.max_batch_size = int(state["max_batch_size"])
        self.totals = RunTotals(**state["totals"])
        self.started = time.time()
        profile = state.get("startup_profile")  # None: written without one (or before the profile existed)
        if profile is not None:
            self.startup_profile = StartupProfile.from_json(profile).with_origin(source="checkpoint")
