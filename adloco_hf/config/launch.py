"""What `AdLoCoConfig` makes of the launch it runs in, before any data is built: the workers it has, a launcher
that started one process where several were asked for, and a run whose length ends inside a round.

- **One worker, several instances.** `python train.py` is one process: one worker, which can train one instance
  only. The config trains that one instance (nothing merges) and says so in a WARNING that names the launch for
  more, instead of refusing in `train()` after the data was built (the README's example asks for 2 instances and
  runs as written on a laptop). With several workers, too few for `num_instances` is refused by `train()`: a resumed
  run may hold fewer instances than `num_instances` after its merges (`checkpoint/elastic.py`), which only the
  checkpoint tells.
- **One process of several.** `accelerate launch --num_processes N` without `--multi_gpu` (or with `--cpu`, or a
  config's `distributed_type: MULTI_CPU`) runs accelerate's simple launcher: ONE process, with the `MASTER_ADDR`
  and `MASTER_PORT` of the N it was asked for but no `WORLD_SIZE`. The run would train one worker while the user
  expects N.
- **A last round cut short.** `max_steps` that is not a multiple of `inner_steps` ends with a shorter round.
"""

import os

from ..common.logs import get_logger
from .compat import warn_once


__all__ = [
    "fit_instances_to_one_worker",
    "warn_about_a_last_round_cut_short",
    "warn_about_one_process_of_several",
]

logger = get_logger(__name__)

CPU_LAUNCH = "accelerate_configs/cpu_4_workers.yaml"


def launched_world_size() -> int:
    """The launch's processes: `WORLD_SIZE` of torchrun-based launchers, 1 for `python train.py`."""
    return int(os.environ.get("WORLD_SIZE", "1"))


def fit_instances_to_one_worker(config) -> None:
    """With one worker, train one instance (a WARNING names the launch of `num_instances` workers). The number asked
    for stays in `config.num_instances_asked`: the run's settings record it (`checkpoint/run_settings.py`), so the
    same script may resume this run elastically on more workers, or a merged-down run on one."""
    config.num_instances_asked = config.num_instances
    g, k = config.processes_per_worker, config.num_instances
    if launched_world_size() // g != 1 or k <= 1:
        return
    config.num_instances = 1
    launch = f"--num_processes {k}" if g == 1 else f"--num_processes {k * g} (processes_per_worker={g})"
    one = "one process (`python train.py`)" if g == 1 else f"one worker of processes_per_worker={g} processes"
    warn_once(
        f"num_instances={k}, but this launch has {one}: AdLoCoConfig sets num_instances=1 (one instance, no merges). "
        f"For {k} instances launch {k} workers: `accelerate launch --multi_gpu {launch} train.py` (GPUs, or CPU "
        f"processes on a machine without a GPU), or --config_file {CPU_LAUNCH}."
    )


def warn_about_one_process_of_several() -> None:
    """Accelerate's simple launcher asked for several processes started one (see the module's docstring)."""
    env = os.environ
    launched_by_accelerate = "ACCELERATE_MIXED_PRECISION" in env
    if not launched_by_accelerate or "WORLD_SIZE" in env or "MASTER_ADDR" not in env:
        return
    warn_once(
        "accelerate launch started ONE process: this run trains a single worker. `accelerate launch --num_processes "
        "N` without --multi_gpu (or with --cpu, or distributed_type: MULTI_CPU) runs the script once, whatever N. "
        "For N workers launch `accelerate launch --multi_gpu --num_processes N train.py` (on a machine without a GPU "
        f"too: AdLoCoConfig then forms a gloo group on the CPU), or --config_file {CPU_LAUNCH}. (MASTER_ADDR is set "
        "but WORLD_SIZE is not: if you meant one process, unset MASTER_ADDR and this warning goes.)"
    )


def warn_about_a_last_round_cut_short(config) -> None:
    """`max_steps` not a multiple of `inner_steps` (with a fixed H): the last round is shorter, and still ends with
    an outer step and the batch-size test (`AdLoCoTrainer` finishes a round that training stopped inside)."""
    h, steps = config.inner_steps, config.max_steps
    if config.inner_steps_rule != "fixed" or steps % h == 0:
        return
    rounds, rest = divmod(steps, h)  # rounds >= 1: inner_steps > max_steps is refused (compat.py)
    warn_once(
        f"max_steps={steps} is not a multiple of inner_steps={h}: {rounds} round(s) of {h} inner steps, then a last "
        f"round of {rest}. Set max_steps={rounds * h} or {(rounds + 1) * h} for whole rounds."
    )
