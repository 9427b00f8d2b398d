"""A worker's set-up, once, when training begins (`Worker.start`): its parts, made from what the Trainer hands it.

Every rank runs the same steps in the same order (process groups are created collectively): check the model, make
the inner steps and the plan follower (which refuses an optimizer or scheduler the settings cannot scale), then
either start afresh (instance table, initial weights, the largest micro-batch) or restore a checkpoint's state
(`saved_state.py`); the first round's plan is applied last, by the worker.
"""

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..common.clock import Clock
from ..common.distributed import WorkerMonitor, check_models_match
from ..common.logs import get_logger
from ..instances.table import Instance, initial_instances
from ..outer.step import GlobalModel
from ..reporting.run_log import RunLog
from ..rounds.rules import RoundRules
from . import saved_state
from .groups import WorkerGroups
from .initialise import resolve_max_batch_size
from .inner_steps import InnerSteps
from .merging import WorkerMerges
from .outer_sync import OuterSync
from .plan_follower import PlanFollower
from .preemption import Preemption
from .replica import ReplicaParallel
from .round_end import RoundEnd
from .round_state import RoundState
from .settings import WorkerSettings
from .training import TrainingObjects


__all__ = ["RoundParts", "start_parts"]

logger = get_logger(__name__)


@dataclass(frozen=True)
class RoundParts:
    """The parts of a worker that exist once training has begun, each owning its state."""

    training: TrainingObjects
    steps: InnerSteps
    outer: OuterSync
    merges: WorkerMerges
    round_end: RoundEnd


def start_parts(
    *,
    settings: WorkerSettings,
    groups: WorkerGroups,
    replica: ReplicaParallel,
    monitor: WorkerMonitor,
    preemption: Preemption,
    run_log: RunLog,
    rounds: RoundState,
    training: TrainingObjects,
    resume: dict[str, Any] | None,
    rules: Callable[[], RoundRules],
    clock: Clock,
    hint: Callable[[], str],
    probe_step: Callable[[int], None],
) -> RoundParts:
    """Make (or restore) this worker's parts when training begins (collective: every rank)."""
    model = training.model
    check_models_match(model, settings.device)
    steps = InnerSteps(settings.steps, training, replica, rounds, clock)
    follower = PlanFollower(settings.steps, training, settings.start.initial_batch_size)
    if resume is None:
        start = settings.start
        g = groups.processes_per_worker
        rounds.instances = initial_instances(
            groups.layout.num_workers, start.num_instances, g * start.initial_batch_size
        )
        groups.refresh(rounds.instances)
        replica.initialise_weights(model, rounds.instance_of(groups.worker_id))
    else:
        rounds.instances = [Instance.from_row(row) for row in resume["instances"]]
        groups.refresh(rounds.instances)
    global_model = GlobalModel.from_settings(
        replica.part(model), settings.outer, device=settings.device, positions=replica.positions(model)
    )
    replica.attach(global_model)
    outer = OuterSync(global_model, groups, replica, training)
    if resume is None:
        replica.check_settings()
        rounds.max_batch_size = resolve_max_batch_size(settings, training.trainable(), probe_step)
        rounds.started = time.time()
    else:
        saved_state.restore(
            resume,
            groups=groups,
            rounds=rounds,
            training=training,
            replica=replica,
            outer=outer,
            follower=follower,
            steps=steps,
            seed=settings.seed,
        )
    merges = WorkerMerges(settings, groups, monitor, outer, replica, training, steps, hint, clock)
    round_end = RoundEnd(
        groups=groups,
        replica=replica,
        monitor=monitor,
        run_log=run_log,
        rounds=rounds,
        steps=steps,
        outer=outer,
        merges=merges,
        follower=follower,
        rules=rules,
        preemption=preemption,
        clock=clock,
        hint=hint,
    )
    return RoundParts(training=training, steps=steps, outer=outer, merges=merges, round_end=round_end)


def log_start(
    settings: WorkerSettings,
    groups: WorkerGroups,
    rounds: RoundState,
    rules: RoundRules,
    run_log: RunLog,
    resume: dict[str, Any] | None,
    global_step: int,
) -> None:
    """Rank 0: the run log's start (or resume) line and the run's shape on the console."""
    run_log.start(
        resumed_outer_step=None if resume is None else rounds.outer_step,
        resumed_global_step=None if resume is None else global_step,
    )
    if resume is not None and resume.get("elastic") is not None:
        log_elastic(run_log, resume["elastic"], rounds.outer_step, global_step)
    num_workers, g = groups.layout.num_workers, groups.processes_per_worker
    workers = f"{num_workers} worker{'s' * (num_workers != 1)}" + (f" of {g} processes" if g > 1 else "")
    # The Trainer's banner keeps its true lines (steps, parameters); this one says the rest (trainer/round_console.py).
    start = settings.start
    fixed = rules.inner_steps_rule == "fixed"
    count = f"{-(-rounds.max_steps // rounds.inner_steps)} rounds" if fixed else "rounds"
    cap = f", at most {start.batch_size_cap}" if start.batch_size_cap else ""
    instances = f"{len(rounds.instances)} instance{'s' * (len(rounds.instances) != 1)}"
    logger.info(
        f"AdLoCo: {workers}, {instances}, max_steps {rounds.max_steps} in {count} of "
        f"{rounds.inner_steps} inner steps, batch {start.initial_batch_size} per worker at the start"
        f"{cap} (batch-size test {settings.steps.batch_size_test}), micro-batches of at most {rounds.max_batch_size}"
    )


def log_elastic(run_log: RunLog, elastic: dict[str, Any], outer_step: int, global_step: int) -> None:
    """Rank 0: the elastic resume in the log (WARNING) and as a line of `adloco_resumes.jsonl`."""
    logger.warning(
        f"elastic resume: {elastic['checkpoint']} was written by {elastic['from_workers']} workers, this run has "
        f"{elastic['to_workers']}; " + "; ".join(elastic["lines"])
    )
    keys = ("checkpoint", "from_workers", "to_workers", "workers_before", "workers_after", "optimizer_sources")
    line = {"global_step": global_step, "outer_step": outer_step, **{key: elastic[key] for key in keys}}
    line["data"] = "map-style: every sample of the passes started is drawn exactly once by old and new workers"
    run_log.record_resume(line)
