"""Where a run stands after its rounds: the totals a worker saves in its checkpoints, the state users read as
`trainer.adloco_state`, and what one round's end did."""

from dataclasses import dataclass

from ..instances.merges import MergeResult
from .rows import RoundLine


__all__ = ["AdLoCoState", "RoundResult", "RunTotals", "StepEnd"]


@dataclass
class RunTotals:
    """Running totals of a worker's run, saved in its checkpoints (the keys of the `totals` entry)."""

    tokens: int = 0
    comm_bytes: int = 0
    skipped_rounds: int = 0
    merges: int = 0
    elapsed: float = 0.0


@dataclass(frozen=True)
class AdLoCoState:
    """Where an AdLoCo run stands (`trainer.adloco_state`), the same on every worker after each round.

    Attributes:
        rounds: completed rounds (outer steps).
        last_round_step: the Trainer's global step at which the last round ended (0 before the first).
        tokens: tokens trained by all workers together.
        comm_bytes: bytes sent by all workers together (outer steps, merges, the final merge).
        merges: merges so far.
        skipped_rounds: instance-rounds skipped for a non-finite pseudo-gradient.
        elapsed_seconds: training time, across resumes.
        num_instances: instances training now.
        batch_sizes: instance id → per-worker request for the next round.
        workers: instance id → its workers' global ranks.
        final_merged: whether the instances have been merged into the final model.
    """

    rounds: int
    last_round_step: int
    tokens: int
    comm_bytes: int
    merges: int
    skipped_rounds: int
    elapsed_seconds: float
    num_instances: int
    batch_sizes: dict[int, int]
    workers: dict[int, tuple[int, ...]]
    final_merged: bool = False


@dataclass(frozen=True)
class RoundResult:
    """What a round's end did: one line per instance that trained in it, and the merge, if any."""

    lines: list[RoundLine]
    merge: MergeResult | None = None
    preempted: bool = False  # some worker got SIGTERM/SIGINT: every worker stops after this round


@dataclass(frozen=True)
class StepEnd:
    """What the end of an inner step did on a worker: the round's end, if the step ended one, and whether training
    stops at this step (a preemption every worker agreed on)."""

    round: RoundResult | None = None
    stop: bool = False
