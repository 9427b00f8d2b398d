"""Faults injected into a real run by name, from a fault run's spec (`fault_run.py`; the test suite's worker arms
the same ones): `FaultyTrainer` and `arm_faults`.

The spec's keys, each optional (a rank is a global rank; "all": every rank):
- `fail` [rank, step, how]: that rank dies (`os._exit(how)`) or hangs for good (`how` "hang") as step `step` + 1
  begins;
- `kill_in_save` step: rank 0 dies (`os._exit(9)`) in the middle of writing checkpoint-`step`'s rank files;
- `hang_in_save` [rank, step]: that rank hangs for good in the middle of writing checkpoint-`step`'s rank files;
- `disk_full` [rank, step, target]: from `step` on, `target` ("torch.save" or "save_pretrained") fails on that rank as
  on a full disk (`fill_disk`);
- `kill_in_merged_save` true: rank 0 dies inside the final `merged/` save, its weights written but the folder not yet
  renamed into place;
- `nan` [rank, step] or [rank, step, "onwards"]: that rank's weights are poisoned with NaN before inner step
  `step` + 1 (with "onwards": before every step from then on, a worker broken for good);
- `slow` {rank or "all": seconds}: a delay per sample inside every inner step of those ranks, a slow worker;
- `sigterm` [rank, step, target]: SIGTERM to that rank itself (`target` "self") or to its launcher ("launcher") as
  step `step` + 1 begins: a preemption;
- `preemption_poll` seconds, `preemption_agree_seconds` seconds: the preemption protocol's waits
  (`adloco_hf.fault_points.set_preemption_timings`);
- `wait_for_stop_request` [rank, step]: that rank waits, before step `step` + 1, until another worker has asked to
  stop (a cut inside the round then happens in the same order on every machine, however busy).
`kills.py` arms the SIGKILLs at chosen points of chosen launch attempts (`kills`, `hold_for_signal`) and the
records a watcher outside reads (`progress`, `phases`). The library's functions wrapped are its fault points
(`adloco_hf.fault_points`).
"""

import errno
import os
import signal
import time

import torch
import torch.distributed as dist
from transformers import TrainerCallback

from adloco_hf import AdLoCoTrainer, fault_points


__all__ = ["FAULT_KEYS", "FaultyTrainer", "act_before", "arm_faults", "fill_disk", "hang"]

# The spec keys `arm_faults` reads.
FAULT_KEYS = (
    "fail",
    "kill_in_save",
    "hang_in_save",
    "disk_full",
    "kill_in_merged_save",
    "nan",
    "slow",
    "sigterm",
    "preemption_poll",
    "preemption_agree_seconds",
    "wait_for_stop_request",
)


class FaultyTrainer(AdLoCoTrainer):
    """`AdLoCoTrainer` whose inner steps can poison one worker's weights with NaN and be slowed (`arm_faults` sets
    `nan_at`, `nan_onwards` and `slow`)."""

    nan_at: tuple[int, int] | None = None  # (rank, global step)
    nan_onwards = False  # poison every step from nan_at's on (a worker broken for good), not only that one
    slow: dict[str, float] = {}  # rank (or "all") → seconds of delay per sample of every inner step

    def training_step(self, model, inputs, num_items_in_batch=None):
        batch = int(inputs["input_ids"].shape[0])
        step = self.state.global_step
        if self.nan_at is not None and self.nan_onwards and self.nan_at[0] == self.args.process_index:
            step = min(step, self.nan_at[1])
        if self.nan_at == (self.args.process_index, step):
            with torch.no_grad():
                next(self.model.parameters()).fill_(float("nan"))
        loss = super().training_step(model, inputs, num_items_in_batch)
        # A slow worker, the same on every machine: a delay per sample inside the step's measured time.
        delay = self.slow.get(str(self.args.process_index), self.slow.get("all", 0.0))
        if delay:
            time.sleep(delay * batch)
        return loss


def hang() -> None:
    """Hang for good, but die on the launcher's SIGTERM: the library's handler only raises a flag (the run stops at
    the next step), which a hung worker never reaches, so torchrun would wait its 30 s before SIGKILL."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    time.sleep(3600)


def fill_disk(trainer, model, rank: int, full_rank: int, full_step: int, target: str) -> None:
    """From `full_step` on, `target` fails on `full_rank` as it does on a full disk: `torch.save` with the C++
    stream's RuntimeError, `save_pretrained` with OSError(ENOSPC). Nothing on the machine's disk is touched."""
    if rank != full_rank:
        return

    def failing(original, error):
        def write(*args, **kwargs):
            if trainer.state.global_step >= full_step:
                raise error
            return original(*args, **kwargs)

        return write

    if target == "torch.save":
        torch.save = failing(torch.save, RuntimeError("basic_ios::clear: iostream error"))
    else:
        model.save_pretrained = failing(model.save_pretrained, OSError(errno.ENOSPC, os.strerror(errno.ENOSPC)))


def arm_faults(trainer: FaultyTrainer, model, spec: dict, rank: int) -> None:
    """Arm every fault of `spec` (`FAULT_KEYS`, the module docstring) on this rank, `model` being `trainer`'s.

    The callbacks it adds (`fail`, `wait_for_stop_request`, `sigterm`) go after those already added: arm the
    records of `kills.py` after it, last of all."""
    _arm_saves(trainer, model, spec, rank)
    if spec.get("slow"):
        trainer.slow = {str(key): float(value) for key, value in spec["slow"].items()}
    if spec.get("nan"):
        trainer.nan_at = tuple(spec["nan"][:2])  # [rank, step] or [rank, step, "onwards"]
        trainer.nan_onwards = spec["nan"][2:] == ["onwards"]
    if spec.get("fail") is not None:
        trainer.add_callback(_Fail(rank, *spec["fail"]))
    if spec.get("preemption_poll") is not None:  # look for a stop request after every step, not once a second
        fault_points.set_preemption_timings(poll_seconds=spec["preemption_poll"])
    if spec.get("preemption_agree_seconds") is not None:  # no fallback to the round's end for a slow machine
        fault_points.set_preemption_timings(agree_seconds=spec["preemption_agree_seconds"])
    if spec.get("wait_for_stop_request") is not None:
        trainer.add_callback(_WaitForStopRequest(rank, *spec["wait_for_stop_request"]))
    if spec.get("sigterm") is not None:
        trainer.add_callback(_Preempt(rank, *spec["sigterm"]))


def act_before(point: str, when, act) -> None:
    """Wrap the library's fault point `point` (`adloco_hf.fault_points`): with its arguments, `act(...)` runs first
    whenever `when(...)` holds (a kill, a hang, a half-written file), then the function itself."""

    def wrapper(original):
        def wrapped(*args, **kwargs):
            if when(*args, **kwargs):
                act(*args, **kwargs)
            return original(*args, **kwargs)

        return wrapped

    fault_points.wrap(point, wrapper)


def _arm_saves(trainer, model, spec: dict, rank: int) -> None:
    """The faults inside a save: `kill_in_save`, `hang_in_save`, `disk_full`, `kill_in_merged_save`."""
    step = lambda: trainer.state.global_step  # noqa: E731
    if spec.get("kill_in_save") is not None:  # killed in the middle of writing the checkpoint
        kill_step = spec["kill_in_save"]
        act_before("save_rank_state", lambda _, save_rank, __: save_rank == 0 and step() == kill_step,
                   lambda *_: os._exit(9))  # fmt: skip
    if spec.get("hang_in_save") is not None:  # hung in the middle of writing the checkpoint (never comes back)
        hang_rank, hang_step = spec["hang_in_save"]
        act_before("save_rank_state", lambda _, save_rank, __: save_rank == hang_rank and step() == hang_step,
                   lambda *_: hang())  # fmt: skip
    if spec.get("disk_full") is not None:
        fill_disk(trainer, model, rank, *spec["disk_full"])
    if spec.get("kill_in_merged_save"):

        def dying_folder_save(save_folder):
            def dying(folder, model, **kwargs):
                if os.path.basename(os.path.normpath(folder)) != "merged":
                    return save_folder(folder, model, **kwargs)
                with fault_points.atomic_directory(folder) as tmp:
                    model.save_pretrained(tmp, state_dict=kwargs.get("state_dict"), is_main_process=True)
                    os._exit(1)  # killed with the weights written, before the folder is renamed into place

            return dying

        fault_points.wrap("save_model_folder", dying_folder_save)  # what the final merged/ save calls


class _Fail(TrainerCallback):
    """`fail`: rank `fail_rank` (or "all") exits with code `how`, or hangs (`how` "hang"), as step `step` + 1
    begins."""

    def __init__(self, rank: int, fail_rank, step: int, how):
        self.rank, self.fail_rank, self.step, self.how = rank, fail_rank, step, how

    def on_step_begin(self, args, state, control, **kwargs):
        if self.fail_rank in (self.rank, "all") and state.global_step == self.step:
            if self.how == "hang":
                hang()
            os._exit(int(self.how))


class _WaitForStopRequest(TrainerCallback):
    """Hold this worker before a step until another worker has asked to stop: the order of events that a cut inside
    the round needs happens on every machine, however busy."""

    def __init__(self, rank: int, wait_rank: int, step: int):
        self.rank, self.wait_rank, self.step = rank, wait_rank, step

    def on_step_begin(self, args, state, control, **kwargs):
        if self.rank == self.wait_rank and state.global_step == self.step:
            store = dist.distributed_c10d._get_default_store()
            while not fault_points.stop_requested(store):
                time.sleep(0.01)


class _Preempt(TrainerCallback):
    """`sigterm`: SIGTERM to rank `signal_rank` (or "all") itself or to its launcher (accelerate's agent)."""

    def __init__(self, rank: int, signal_rank, step: int, target: str):
        self.rank, self.signal_rank, self.step, self.target = rank, signal_rank, step, target

    def on_step_begin(self, args, state, control, **kwargs):
        if self.signal_rank in (self.rank, "all") and state.global_step == self.step:
            os.kill(os.getpid() if self.target == "self" else os.getppid(), signal.SIGTERM)
