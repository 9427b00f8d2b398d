"""A worker's set-up, once, when training begins (`Worker.start`): its parts, made from what the Trainer hands it.

Every rank runs the same steps in the same order (process groups are created collectively): check the model, make
the inner steps and the plan follower (which refuses an optimizer or scheduler the settings cannot scale), then
either start afresh (instance table, initial weights, the largest micro-batch) or restore a checkpoint's state
(`saved_state.py`); with the goodput rule's startup profile, measure it (or read it from the cache) and set every
instance's first request from it (a resumed run reads it from its checkpoint); the first round's plan is applied
last, by the worker (`RoundEnd.apply`: the one place a round's plan takes effect, here and at every round's end).
"""

import json
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from ..batch import profile_cache
from ..batch.profiling import ProfilePlan, StartupProbePasses, measure_startup_profile
from ..batch.startup_profile import StartupProfile, profile_sizes
from ..common.clock import Clock
from ..common.distributed import WorkerMonitor, check_models_match, is_distributed
from ..common.logs import get_logger
from ..instances.table import Instance, initial_instances, instance_of
from ..outer.step import GlobalModel
from ..reporting.run_log import RunLog
from ..rounds.first_round import FirstRound, first_round
from ..rounds.plan import RoundPlan, first_plan
from ..rounds.rules import RoundRules
from . import saved_state
from .groups import WorkerGroups
from .initialise import resolve_max_batch_size
from .inner_steps import InnerSteps
from .merging import WorkerMerges
from .outer_sync import OuterSync
from .plan_follower import PlanFollower
from .preemption import Preemption
from .replicas.replica import ReplicaParallel
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
    first_plan: RoundPlan  # the first round's plan (of the run, or after a resume), which the worker applies


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
    startup_probe: StartupProbePasses | None = None,
) -> RoundParts:
    """Make (or restore) this worker's parts when training begins (collective: every rank)."""
    model = training.model
    check_models_match(model, settings.device)
    steps = InnerSteps(settings.steps, training, replica, rounds, clock)
    follower = PlanFollower(settings.steps, training)
    if resume is None:
        start = settings.start
        g = groups.processes_per_worker
        table = initial_instances(groups.layout.num_workers, start.num_instances, g * start.rounds.initial_batch_size)
        groups.refresh(table)
        replica.initialise_weights(model, instance_of(table, groups.worker_id))
    else:
        table = [Instance.from_row(row) for row in resume["instances"]]
        groups.refresh(table)
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
    if settings.profile.enabled and rounds.startup_profile is None and startup_probe is not None:
        profiled = take_startup_profile(
            table,
            settings,
            groups,
            replica,
            rounds,
            training,
            steps,
            outer,
            rules(),
            clock,
            startup_probe,
            fresh=resume is None,
        )
        if profiled is not None:
            table = profiled.instances
        if groups.rank == 0:
            log_startup_profile(
                rounds.startup_profile, profiled, run_log, settings.start.rounds.initial_batch_size * g
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
    first = first_plan(table, rules(), inner_steps=rounds.inner_steps)
    return RoundParts(
        training=training, steps=steps, outer=outer, merges=merges, round_end=round_end, first_plan=first
    )


def take_startup_profile(
    table: list[Instance],
    settings: WorkerSettings,
    groups: WorkerGroups,
    replica: ReplicaParallel,
    rounds: RoundState,
    training: TrainingObjects,
    steps: InnerSteps,
    outer: OuterSync,
    rules: RoundRules,
    clock: Clock,
    probe: StartupProbePasses,
    *,
    fresh: bool,
) -> FirstRound | None:
    """Measure the goodput rule's startup profile (or read it from the cache) into `rounds`, and on a fresh start
    choose every instance's first request in `table` from it (collective: every rank). Returns the first round's
    table and choices (None on a resume, whose requests are the checkpoint's)."""
    controller, g = rules.controller, groups.processes_per_worker
    top = (
        rules.switch.max_batch_size
        if controller.cap is None
        else min(rules.switch.max_batch_size, controller.cap // g)
    )
    sizes = profile_sizes(max(1, controller.floor // g // 2), max(1, top))
    phi = outer.global_model  # what this process sends into an all-reduce: its slice of Δ, if it has one
    payload = phi.reduce.payload_bytes(phi.numel if phi.part is None else phi.part[1] - phi.part[0], 2)
    workers = groups.layout.num_workers
    cacheable = type(clock) is Clock  # a virtual clock's prices are its own, never the machine's
    key = None
    if cacheable:
        key = profile_cache.profile_key(
            model_config=_model_config(training.model),
            device=_device_name(settings.device),
            precision=settings.profile.precision,
            sequence_length=_sequence_length(probe),
            compiled=settings.profile.compiled,
            workers=workers,
            processes_per_worker=g,
            payload_bytes=payload,
            sizes=tuple(sizes),
            backend=settings.profile.backend,
            hosts=_hosts(),
        )
    plan = ProfilePlan(
        sizes=tuple(sizes),
        payload_bytes=payload,
        workers=workers,
        statistics=fresh and settings.profile.statistics and not replica.sharded,
        key=key,
    )
    measured = measure_startup_profile(
        plan,
        probe,
        clock=clock,
        collector=steps.collector,
        no_sync=replica.no_sync,
        link_group=groups.all_workers,
        device=settings.device,
        loss_scale=training.loss_scale,
        rank=groups.rank,
        cached=lambda: profile_cache.load_profile(key),
        store=lambda profile: profile_cache.save_profile(profile, key),
    )
    rounds.startup_profile = measured.profile
    if not fresh:
        return None
    return first_round(table, measured.statistics, measured.profile, rules, inner_steps=rounds.inner_steps)


def _model_config(model: torch.nn.Module) -> str:
    """What identifies the model's computation: its configuration, or its parameters' shapes and dtypes."""
    config = getattr(getattr(model, "module", model), "config", None)
    if config is not None and hasattr(config, "to_json_string"):
        return config.to_json_string(use_diff=False)
    return json.dumps([[name, list(p.shape), str(p.dtype)] for name, p in model.named_parameters()])


def _device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"{device.type}:{torch.get_num_threads()} threads"


def _sequence_length(probe: StartupProbePasses) -> int:
    ids = probe.first_inputs().get("input_ids")
    return int(ids.shape[-1]) if ids is not None and ids.dim() > 0 else 0


def _hosts() -> list[str]:
    """Every rank's host name (collective), so that a profile of the links is not read on other machines."""
    name = socket.gethostname()
    if not is_distributed():
        return [name]
    names: list = [None] * dist.get_world_size()
    dist.all_gather_object(names, name)
    return [str(n) for n in names]


def log_startup_profile(profile: StartupProfile, first: FirstRound | None, run_log: RunLog, initial: int) -> None:
    """Rank 0: one line (where the profile came from and what it cost, what it measured, the first requests) and
    `adloco_startup_profile.json`."""
    origin = f"measured in {profile.seconds:.2f} s" if profile.source == "measured" else f"read from {profile.source}"
    text = f"startup profile ({origin}): {profile.describe()}"
    requests = {}
    if first is not None:
        for inst in first.instances:
            scale = first.noise_scales.get(inst.id)
            requests[inst.id] = {"batch_size": inst.batch_size, "noise_scale": scale, "initial": initial}
        text += "; first requests " + ", ".join(
            f"instance {i}: {initial} -> {r['batch_size']}" for i, r in requests.items()
        )
    logger.info(text)
    run_log.record_profile({**profile.to_json(), "first_requests": requests})


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
    cap = f", at most {start.rounds.batch_size_cap}" if start.rounds.batch_size_cap else ""
    instances = f"{len(rounds.instances)} instance{'s' * (len(rounds.instances) != 1)}"
    logger.info(
        f"AdLoCo: {workers}, {instances}, max_steps {rounds.max_steps} in {count} of "
        f"{rounds.inner_steps} inner steps, batch {start.rounds.initial_batch_size} per worker at the start"
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
