"""`WorkerSettings`: what a worker reads of the run's settings, read from `AdLoCoConfig` once, when it is made.

The worker and its parts (`inner_steps.py`, `round_end.py`, `outer_sync.py`, the replicas, ...) read these typed
values, never the config: a setting has one place where it is read (`from_args`) and cannot change during a run.
The round's decision reads its own, [`RoundRules`] (`rounds/rules.py`), built once the largest micro-batch and the
data shard are known; the outer step reads [`OuterSettings`] (`outer/settings.py`), held here.
"""

from dataclasses import dataclass

import torch

from ..instances.merge_settings import MergeSettings
from ..outer.settings import OuterSettings
from ..rounds.rules import RoundSettings


__all__ = ["ProfileSettings", "StartSettings", "StepSettings", "WorkerSettings"]


@dataclass(frozen=True)
class StartSettings:
    """How training starts: the instances, their first weights, the largest micro-batch's probe; the first
    requests, H and the configured micro-batch limit are the round's settings (`rounds`)."""

    num_instances: int
    instance_init: str  # "shared" or "independent" initial weights
    memory_fraction: float  # of free GPU memory, for max_batch_size="auto"
    rounds: RoundSettings  # the initial request, H, the cap, switch mode (`rounds/rules.py`, their one reader)

    @classmethod
    def from_args(cls, args, rounds: RoundSettings) -> "StartSettings":
        """From an `AdLoCoConfig` and its round settings."""
        return cls(
            num_instances=args.num_instances,
            instance_init=args.instance_init,
            memory_fraction=args.memory_fraction,
            rounds=rounds,
        )


@dataclass(frozen=True)
class ProfileSettings:
    """The goodput rule's startup profile (`batch/startup_profile.py`): whether one is measured before the first
    round, and what it depends on beside the model and the launch (its cache key)."""

    enabled: bool  # batch_size_target="goodput" with goodput_timing "startup" or "startup_live"
    statistics: bool  # one gradient-statistics estimate too (not in Adam's metric: no moments before a step)
    precision: str  # "bf16", "fp16" or "fp32"
    compiled: bool  # torch_compile
    backend: str  # the workers' process group

    @classmethod
    def from_args(cls, args) -> "ProfileSettings":
        """From an `AdLoCoConfig`."""
        goodput = args.batch_size_target == "goodput"
        return cls(
            enabled=goodput and args.goodput_timing != "live",
            statistics=args.noise_preconditioner != "adam",
            precision="bf16" if args.bf16 else "fp16" if args.fp16 else "fp32",
            compiled=bool(args.torch_compile),
            backend=str(args.ddp_backend or "default"),
        )


@dataclass(frozen=True)
class StepSettings:
    """What the inner steps read (`steps.py`): how a request is cut into micro-batches, which gradient statistics a
    step measures and in which metric, and how the inner optimizer follows the batch."""

    batch_size_test: str  # "none": no statistics are measured
    noise_preconditioner: str  # "adam": statistics in Adam's metric
    lr_batch_scaling: str
    # batch_size_target="goodput" measuring on the rounds (goodput_timing other than "startup"): time every step's
    # passes for the throughput model
    time_steps: bool = False

    @classmethod
    def from_args(cls, args) -> "StepSettings":
        """From an `AdLoCoConfig`."""
        return cls(
            batch_size_test=args.batch_size_test,
            noise_preconditioner=args.noise_preconditioner,
            lr_batch_scaling=args.lr_batch_scaling,
            time_steps=args.batch_size_target == "goodput" and args.goodput_timing != "startup",
        )


@dataclass(frozen=True)
class WorkerSettings:
    """A worker's settings: its processes and their failures, the run's, how training starts (`start`), the inner
    steps' (`steps`), the outer step's (`outer`) and the merges' (`merges`).

    Built by [`WorkerSettings.from_args`] in `Worker.__init__`, once per run; the Trainer's own settings that the
    worker needs (`output_dir`, `seed`, the device) are read there too.
    """

    # the worker's processes, and what happens when something fails
    processes_per_worker: int  # G
    worker_parallelism: str  # "ddp" or "fsdp" inside a worker of G > 1 processes
    worker_timeout: float
    peer_timeout: float  # 0: off (`common/liveness.py`)
    preemption_grace_seconds: float
    # the run: where it writes, its seed and device (the Trainer's settings)
    output_dir: str
    seed: int
    device: torch.device
    start: StartSettings
    profile: ProfileSettings
    steps: StepSettings
    outer: OuterSettings
    merges: MergeSettings

    @property
    def sharded(self) -> bool:
        """worker_parallelism="fsdp" with several processes per worker: they shard one replica."""
        return self.processes_per_worker > 1 and self.worker_parallelism == "fsdp"

    @classmethod
    def from_args(cls, args) -> "WorkerSettings":
        """From an `AdLoCoConfig` (checked already: `config/checks.py`)."""
        return cls(
            processes_per_worker=int(args.processes_per_worker or 1),
            worker_parallelism=args.worker_parallelism,
            worker_timeout=args.worker_timeout,
            peer_timeout=float(args.peer_timeout or 0.0),
            preemption_grace_seconds=args.preemption_grace_seconds,
            output_dir=args.output_dir,
            seed=args.seed,
            device=args.device,
            start=StartSettings.from_args(args, RoundSettings.from_args(args)),
            profile=ProfileSettings.from_args(args),
            steps=StepSettings.from_args(args),
            outer=(outer := OuterSettings.from_args(args)),
            merges=MergeSettings(
                transport=args.merge_transport,
                payload=args.merge_payload,
                block_size=outer.compression_block_size,
                save=args.save_merges,
                with_momentum=outer.with_momentum,
            ),
        )
