"""A worker's checkpoint state: what `Worker.state_dict` writes into `adloco/rank-R.pt`, and how `Worker.start`
restores it.

The Trainer loads a checkpoint before the model, optimizer and sampler are set up, so `Worker.load_state_dict` only
keeps the state; `start` applies it (`restore`) once its parts exist. A checkpoint written by another number of
workers arrives re-split for this rank (`checkpoint/elastic.py`); the worker then settles its instance's φ and draws
random generators of its own.
"""

from typing import Any

from transformers import set_seed

from ..common.rng import get_rng_state
from ..sampling.stream_sampler import check_sampler_kind
from .groups import WorkerGroups
from .inner_steps import InnerSteps
from .outer_sync import OuterSync
from .plan_follower import PlanFollower
from .replicas.replica import ReplicaParallel
from .round_state import RoundState
from .training import TrainingObjects


__all__ = ["restore", "state_dict"]


def state_dict(
    *,
    groups: WorkerGroups,
    rounds: RoundState,
    training: TrainingObjects,
    replica: ReplicaParallel,
    outer: OuterSync,
    follower: PlanFollower,
    steps: InnerSteps,
) -> dict[str, Any]:
    """This worker's resume state: the rounds and the instance table, φ and momentum, the inner optimizer, the
    sampler, the scaler, the rates before scaling, random states and the round so far."""
    scaler = training.scaler
    return {
        "world_size": groups.layout.world_size,
        "rank": groups.rank,
        "processes_per_worker": groups.processes_per_worker,
        **rounds.state_dict(),
        **follower.state_dict(),
        "global_model": outer.global_model.state_dict(),
        "inner_optimizer": replica.optimizer_state(training.optimizer),
        "sampler": training.sampler.state_dict(),
        "scaler": None if scaler is None else scaler.state_dict(),
        "rng": get_rng_state(),
        "round": steps.state_dict(replica.part(training.model)),
    }


def restore(
    state: dict[str, Any],
    *,
    groups: WorkerGroups,
    rounds: RoundState,
    training: TrainingObjects,
    replica: ReplicaParallel,
    outer: OuterSync,
    follower: PlanFollower,
    steps: InnerSteps,
    seed: int,
) -> None:
    """Apply a kept checkpoint state (from `start`, once the instance table and φ exist)."""
    check_sampler_kind(state["sampler"], training.sampler)  # a stream's position cannot restore a map-style run
    saved_g, g = int(state.get("processes_per_worker", 1)), groups.processes_per_worker
    if saved_g != g:
        raise ValueError(
            f"the checkpoint was written with processes_per_worker={saved_g}, this run has "
            f"processes_per_worker={g}: resume with processes_per_worker={saved_g}"
        )
    rounds.load_state_dict(state)
    follower.load_state_dict(state)
    global_model = outer.global_model
    global_model.load_state_dict(state["global_model"])
    global_model.restore_params()
    replica.load_optimizer_state(training.optimizer, state["inner_optimizer"])
    training.sampler.load_state_dict(state["sampler"])
    if training.scaler is not None and state["scaler"] is not None:
        training.scaler.load_state_dict(state["scaler"])
    steps.load_state_dict(state.get("round"), replica.part(training.model))
    steps.rng_to_restore = state.get("rng")  # right before the first inner step, see `common/rng.py`
    if state.get("elastic") is not None:
        # After an elastic resume every worker of an instance holds the same φ (overlapped: the average in flight
        # applied, the offset dropped), the compression residual of the old ring is dropped, and a new rank gets
        # random generators of its own (seeded by seed, rank and step), not the shared initial ones.
        global_model.settle()
        global_model.reset_error_feedback()
        if steps.rng_to_restore is None:
            set_seed(hash((seed, groups.rank, rounds.last_synced_step)) % 2**32)
            steps.rng_to_restore = get_rng_state()
