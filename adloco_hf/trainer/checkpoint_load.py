"""Resuming `AdLoCoTrainer`: which launches a checkpoint (or a new run) fits, and how a worker loads its checkpoint:
the Trainer's weights, or with `worker_parallelism="fsdp"` each process's own rows of them, then its AdLoCo state.

A checkpoint written by another number of workers is an elastic resume (`checkpoint/elastic.py`); settings that
define the run may not change (`checkpoint/run_settings.py`). Every refusal comes before anything is loaded.
"""

import glob
import logging
import os
from collections.abc import Callable

import safetensors.torch
import torch
from transformers import Trainer
from transformers.trainer_utils import TrainOutput

from ..checkpoint.elastic import check_instances_fit, elastic_rank_state
from ..checkpoint.folders import check_rank_states, load_rank_state
from ..checkpoint.run_settings import check_run_settings, run_settings
from ..reporting.earlier_run import warn_about_earlier_run
from ..worker.checkpoint_view import CheckpointView
from ..worker.replicas.fsdp import load_full_state_dict
from .run_end import checkpoint_to_resume, ended_run


__all__ = [
    "check_workers_for_instances",
    "load_checkpoint",
    "load_cpu_optimizer",
    "load_scheduler",
    "load_sharded_weights",
    "resume_point",
]

logger = logging.getLogger(__name__)


def resume_point(trainer: Trainer, argument) -> tuple[str | bool | None, TrainOutput | None]:
    """Where `train(resume_from_checkpoint=argument)` starts: the checkpoint (the argument, else the config's field;
    resolved and verified) and, when it is the end of a finished run, that run's `TrainOutput` (nothing to train,
    `run_end.ended_run`). Otherwise the launch is checked against it, and another run's folders in `output_dir`
    are named (global rank 0, `reporting/earlier_run.py`)."""
    checkpoint = checkpoint_to_resume(argument, trainer.args)
    ended = ended_run(checkpoint, trainer.args)
    if ended is not None:
        return checkpoint, ended
    check_workers_for_instances(trainer.worker.checkpoint_view(), checkpoint)
    if trainer.is_world_process_zero():
        warn_about_earlier_run(trainer.args.output_dir, checkpoint)
    return checkpoint, None


def check_workers_for_instances(worker: CheckpointView, resume_from_checkpoint: str | None) -> None:
    """Every instance needs a worker: a new run's `num_instances`, a resumed run's checkpoint's instances (merges
    may have left fewer than `num_instances`; an elastic resume may have fewer workers, `checkpoint/elastic.py`)."""
    num_workers, num_instances = worker.num_workers, worker.num_instances
    if resume_from_checkpoint is not None:
        check_instances_fit(resume_from_checkpoint, num_workers)
    elif num_instances > num_workers:
        cpu = (
            " Without a GPU, `accelerate launch --num_processes N` alone starts ONE process: launch with "
            f"`accelerate launch --multi_gpu --num_processes {num_instances} train.py` and use_cpu=True "
            "(AdLoCoConfig sets it when no GPU is present), or --config_file accelerate_configs/cpu_4_workers.yaml."
        )
        g = worker.processes_per_worker
        launch = f"{num_instances} processes" if g == 1 else f"{num_instances * g} processes"
        per = "" if g == 1 else f" (processes_per_worker={g})"
        raise ValueError(
            f"num_instances={num_instances} exceeds the {num_workers} worker(s) of this launch{per}; lower "
            f"num_instances or launch at least {launch} (accelerate launch --num_processes)."
            + (cpu if worker.on_cpu else "")
        )


def load_checkpoint(
    trainer: Trainer, worker: CheckpointView, checkpoint: str, load_weights: Callable[[], None]
) -> None:
    """Refuse what cannot resume, then load the weights (`load_weights`: the Trainer's own load, or with fsdp each
    process's rows) and this worker's AdLoCo state: its own `rank-R.pt`, or its share of an elastic resume."""
    args = trainer.args
    written = check_rank_states(checkpoint, args.world_size)
    if written != args.world_size and worker.sharded:
        raise ValueError(
            f"{checkpoint} was written by {written} processes, this run has {args.world_size}: "
            "an elastic resume is not supported with worker_parallelism='fsdp' yet; resume with "
            f"{written} processes, or train with worker_parallelism='ddp'."
        )
    check_run_settings(checkpoint, run_settings(args, trainer.accelerator.unwrap_model(trainer.model)))
    rank, world_size = args.process_index, args.world_size
    if written == world_size:
        state = load_rank_state(checkpoint, rank)
    else:
        state = elastic_rank_state(checkpoint, rank, world_size)
    if worker.sharded:
        load_sharded_weights(trainer.accelerator.unwrap_model(trainer.model), checkpoint)
    else:
        load_weights()
    worker.load_state_dict(state)


def load_sharded_weights(model, checkpoint: str) -> None:
    """worker_parallelism="fsdp": every process reads the checkpoint's full safetensors and keeps its own rows
    (no communication). AdLoCo's φ and the round's weights, restored next, overwrite the trainables anyway."""
    full = {}
    for path in sorted(glob.glob(os.path.join(checkpoint, "*.safetensors"))):
        full.update(safetensors.torch.load_file(path))
    if not full:
        raise FileNotFoundError(f"{checkpoint} holds no *.safetensors model files to resume the sharded model from")
    missing = load_full_state_dict(model, full)
    tied = set(getattr(model, "_tied_weights_keys", None) or ())
    missing = [name for name in missing if name not in tied]
    if missing:
        logger.warning("%s lacks %d tensors of the model (kept as built): %s", checkpoint, len(missing), missing[:5])


def load_scheduler(lr_scheduler, checkpoint: str | None) -> None:
    """worker_parallelism="fsdp": the schedule only (the inner optimizer's shard is restored from rank-R.pt)."""
    if checkpoint is not None and os.path.isfile(os.path.join(checkpoint, "scheduler.pt")):
        lr_scheduler.load_state_dict(torch.load(os.path.join(checkpoint, "scheduler.pt"), weights_only=True))


def load_cpu_optimizer(trainer, checkpoint: str | None) -> bool:
    """The inner optimizer's state and the schedule loaded on the CPU in a CPU world of several processes. The
    Trainer of transformers before 5.23 maps them onto `args.device`, which such a world names "cpu:0", a location
    `torch.load` cannot restore (a resume failed there). False where the Trainer's own loading applies."""
    device = trainer.args.device
    if checkpoint is None or device.type != "cpu" or device.index is None or trainer.is_deepspeed_enabled:
        return False
    optimizer = os.path.join(checkpoint, "optimizer.pt")
    if not (os.path.isfile(optimizer) and os.path.isfile(os.path.join(checkpoint, "scheduler.pt"))):
        return False
    trainer.optimizer.load_state_dict(torch.load(optimizer, map_location="cpu", weights_only=True))
    load_scheduler(trainer.lr_scheduler, checkpoint)
    return True
