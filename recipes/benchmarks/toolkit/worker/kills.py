"""SIGKILLs at chosen points of chosen launch attempts, and the steps and round phases a watcher outside reads: the
fault run's `kills`, `progress` and `phases` (`fault_run.py`; the test suite's worker arms them the same way).

Each kill is `[attempt, rank, where, step]`: in launch attempt `attempt` (the launcher's `TORCHELASTIC_RESTART_COUNT`)
worker `rank` kills itself with SIGKILL (no handler runs, nothing is flushed) at `where`:
- "step": after `step` inner steps, before the next begins (mid-round when `step` is not a round's end);
- "round_end": on entering the round's end at `step` (before the outer step's all-reduce);
- "save": in the middle of writing checkpoint-`step` (its rank file half written, the folder still staged);
- "merge": on entering the merge at the end of the round ending at `step`;
- "final_merge": on entering the final merge (`step` is ignored).
With the spec's `"progress": true` every rank appends its attempts' starts (the step each resumed from) and steps,
with the wall time, to `progress-rank{R}.jsonl` (`ProgressRecorder`; read by `recipes/benchmarks/faults/progress.py`'s
`Progress`): how much work each kill cost, and where each worker stopped. With `"phases": true` it also appends, to
`phases-rank{R}.jsonl`, when each round's outer step and each merge begin and end (`record_phases`): the
network fault benchmark (`faults network`) cuts a link in the middle of one. The library's functions wrapped are its
fault points (`adloco_hf.fault_points`).
"""

import json
import os
import signal
import time

from transformers import TrainerCallback

from adloco_hf import fault_points
from recipes.benchmarks.toolkit.worker.faults import act_before


__all__ = ["HoldForSignal", "ProgressRecorder", "arm_kills", "record_phases", "record_progress"]


def _die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def _attempt() -> int:
    return int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))


class HoldForSignal(TrainerCallback):
    """Before step `step` + 1, wait until this worker has received a signal (the launcher's SIGTERM after another
    worker died): it is then inside the round when the signal comes, however fast the launcher is."""

    def __init__(self, trainer, step: int):
        self.trainer, self.step = trainer, step

    def on_step_begin(self, args, state, control, **kwargs):
        if state.global_step == self.step:
            while self.trainer.worker.preemption.signal_name is None:
                time.sleep(0.05)


class ProgressRecorder(TrainerCallback):
    """Appends one JSON line per event to `path`, flushed at once (a SIGKILL loses nothing written before it):
    `{"attempt", "started_at_step", "pid", "time"}` when an attempt's training begins, then `{"attempt", "step",
    "time"}` after each inner step, once the round's end (outer step, merge) has run. Add it after the trainer's own
    callbacks. `attempt` is the launcher's `TORCHELASTIC_RESTART_COUNT`; `time` is `time.time()`."""

    def __init__(self, path: str):
        self.attempt = _attempt()
        self.file = open(path, "a", encoding="utf-8")

    def _write(self, **entry) -> None:
        self.file.write(json.dumps({"attempt": self.attempt, **entry, "time": time.time()}) + "\n")
        self.file.flush()

    def on_train_begin(self, args, state, control, **kwargs):
        self._write(started_at_step=state.global_step, pid=os.getpid())

    def on_step_end(self, args, state, control, **kwargs):
        self._write(step=state.global_step)

    def on_train_end(self, args, state, control, **kwargs):
        self.file.close()


def record_progress(trainer, rank: int, probe_dir: str) -> None:
    trainer.add_callback(ProgressRecorder(os.path.join(probe_dir, f"progress-rank{rank}.jsonl")))


def record_phases(trainer, rank: int, probe_dir: str) -> None:
    """Append `{"attempt", "phase": "outer" | "merge", "edge": "begin" | "end", "step", "time"}` to
    `phases-rank{R}.jsonl`, flushed at once, around this worker's outer step (its all-reduce) and every merge."""
    attempt = _attempt()
    file = open(os.path.join(probe_dir, f"phases-rank{rank}.jsonl"), "a", encoding="utf-8")

    def mark(phase: str, edge: str) -> None:
        entry = {"attempt": attempt, "phase": phase, "edge": edge, "step": trainer.state.global_step}
        file.write(json.dumps({**entry, "time": time.time()}) + "\n")
        file.flush()

    def around(phase):
        def wrapper(original):
            def marked(*args, **kwargs):
                mark(phase, "begin")
                result = original(*args, **kwargs)
                mark(phase, "end")
                return result

            return marked

        return wrapper

    fault_points.wrap("outer_step", around("outer"))
    fault_points.wrap("merge_at_round_end", around("merge"))


def arm_kills(trainer, kills: list, rank: int, hold_for_signal: list | None = None) -> None:
    """`kills` as in the module docstring; `hold_for_signal` = [attempt, rank, step]: that worker waits for a signal
    after `step` steps of that attempt (`HoldForSignal`)."""
    attempt = _attempt()
    if hold_for_signal is not None and hold_for_signal[:2] == [attempt, rank]:
        trainer.add_callback(HoldForSignal(trainer, hold_for_signal[2]))
    mine = {where: step for a, r, where, step in kills if a == attempt and r == rank}
    step_of = lambda: trainer.state.global_step  # noqa: E731
    if "step" in mine:

        class KillBeforeStep(TrainerCallback):
            def on_step_begin(self, args, state, control, **kwargs):
                if state.global_step == mine["step"]:
                    _die()

        trainer.add_callback(KillBeforeStep())
    if "round_end" in mine:
        act_before("round_end", lambda _, global_step: global_step == mine["round_end"], lambda *_: _die())
    if "save" in mine:

        def half_written(checkpoint_dir, save_rank, state):
            with open(os.path.join(checkpoint_dir, f"half-written-rank{save_rank}"), "wb") as f:
                f.write(b"\0" * 1024)
            _die()

        act_before("save_rank_state", lambda *_: step_of() == mine["save"], half_written)
    if "merge" in mine:
        act_before("merge_at_round_end", lambda *_, **__: step_of() == mine["merge"], lambda *_, **__: _die())
    if "final_merge" in mine:
        act_before("final_merge", lambda *_, **__: True, lambda *_, **__: _die())
