"""The fault scenarios: each launches real workers with a fault, then resumes where the library says to and compares
the final merged model with an uninterrupted run's, or reads what the user is told. `SCENARIOS` holds them by name."""

import json
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass

import torch

from adloco_hf.testing import launch_command
from recipes.benchmarks.faults.worker import WORKER_MODULE, run_launch, write_spec
from recipes.benchmarks.toolkit.resumed_runs import merged_weights


__all__ = ["CONFIG", "SCENARIOS", "Bench", "Outcome", "checkpoints", "first_line", "launch", "says"]

CONFIG = dict(
    max_steps=30, inner_steps=5, save_steps=10, num_instances=2, merge_every=4, per_device_train_batch_size=2,
    max_batch_size=4, eta=0.5, seed=3, optim="adamw_torch", learning_rate=3e-3, lr_batch_scaling="sqrt",
    worker_timeout=10,
)  # fmt: skip


@dataclass
class Outcome:
    scenario: str
    what: str
    outcome: str
    work_lost_steps: int | None
    resumed_equal: bool | None
    max_difference: float | None
    seconds: float = 0.0


def launch(out: str, probe: str, *, config: dict | None = None, timeout: int = 300, **extra) -> tuple[bool, str]:
    """One launch of 2 workers (`extra`: the fault run's own spec keys, its faults among them); (succeeded, the
    workers' output)."""
    config = {**CONFIG, **(config or {})}
    spec = {"output_dir": out, "world_size": 2, "probe_dir": probe, "config": config, "dropout": 0.1, **extra}
    command = launch_command(WORKER_MODULE, write_spec(spec), num_processes=2, module=True)
    result = run_launch(command, timeout=timeout, check=False)
    return result.returncode == 0, result.stdout + result.stderr


def checkpoints(out: str) -> list[int]:
    if not os.path.isdir(out):
        return []
    return sorted(int(n.split("-")[1]) for n in os.listdir(out) if n.startswith("checkpoint-") and n[11:].isdigit())


def first_line(output: str, *needles: str) -> str:
    """The first output line holding one of `needles` (what the user reads), shortened for the table."""
    for line in output.splitlines():
        if any(n in line for n in needles):
            text = line.split("]: ", 1)[-1].strip()
            return text if len(text) <= 110 else text[:107] + "..."
    return "(no such line)"


class Bench:
    def __init__(self, root: str):
        self.root = root
        self._references: dict[str, torch.Tensor] = {}  # uninterrupted runs' merged models, by config

    def folder(self, name: str) -> str:
        path = os.path.join(self.root, name)
        shutil.rmtree(path, ignore_errors=True)
        return path

    def uninterrupted(self, config: dict | None = None) -> torch.Tensor:
        key = json.dumps(config or {}, sort_keys=True)
        if key not in self._references:
            out = self.folder(f"uninterrupted-{len(self._references)}")
            ok, output = launch(out, out + "-probe", config=config)
            if not ok:
                raise RuntimeError(f"the uninterrupted run failed:\n{output[-3000:]}")
            self._references[key] = merged_weights(out)
        return self._references[key]

    def resume_and_compare(self, out: str, checkpoint: str | bool, config: dict | None = None) -> tuple[bool, float]:
        ok, output = launch(out, out + "-probe-resume", config=config, resume=checkpoint)
        if not ok:
            raise RuntimeError(f"the resumed run failed:\n{output[-3000:]}")
        difference = (merged_weights(out) - self.uninterrupted(config)).abs().max().item()
        return difference <= 1e-6, difference

    def break_and_resume(
        self,
        name: str,
        what: str,
        step: int,
        outcome: Callable[[str, str, list[int]], str],
        *,
        resume: str | bool = True,
        config: dict | None = None,
        timeout: int = 300,
        **faults,
    ) -> Outcome:
        """Run with `faults` (spec options of the worker), resume (`True`, or "newest" for the newest checkpoint by
        name), compare with the uninterrupted run. `step` is where the fault struck; `outcome(output, out, steps)`
        says what the user reads."""
        out = self.folder(name)
        _, output = launch(out, out + "-probe", config=config, timeout=timeout, **faults)
        steps = checkpoints(out)
        message = outcome(output, out, steps)
        checkpoint = os.path.join(out, f"checkpoint-{steps[-1]}") if resume == "newest" else resume
        equal, diff = self.resume_and_compare(out, checkpoint, config=config)
        return Outcome(name, what, message, max(step - steps[-1], 0), equal, diff)

    def break_only(self, name: str, what: str, needles: tuple[str, ...], *, prepare=None, **launch_options) -> Outcome:
        """A fault that must be refused or stop the run: what the user reads, nothing to compare."""
        out = self.folder(name)
        if prepare is not None:
            prepare(out)
        if isinstance(launch_options.get("resume"), str):  # a checkpoint named relative to the run's folder
            launch_options["resume"] = os.path.join(out, launch_options["resume"])
        ok, output = launch(out, out + "-probe", **launch_options)
        return Outcome(name, what, "COMPLETED" if ok else first_line(output, *needles), None, None, None)


def says(*needles: str) -> Callable[[str, str, list[int]], str]:
    return lambda output, out, steps: first_line(output, *needles)


def scenario_kill_all(bench: Bench) -> Outcome:
    return bench.break_and_resume("kill_all", "kill -9 of every worker at step 12", 12,
                                  lambda output, out, steps: f"exit; checkpoint-{steps[-1]} intact",
                                  fail=["all", 12, 9])  # fmt: skip


def scenario_kill_one(bench: Bench) -> Outcome:
    return bench.break_and_resume("kill_one", "kill -9 of rank 1 at step 12", 12,
                                  says("WorkerTimeoutError", "did not arrive"), fail=[1, 12, 9])  # fmt: skip


def scenario_kill_in_save(bench: Bench) -> Outcome:
    def outcome(output, out, steps):
        left = any(n.startswith(".tmp-") for n in os.listdir(out))
        return f"checkpoint-{steps[-1]} intact, staging {'left' if left else 'none'}"

    return bench.break_and_resume("kill_in_save", "rank 0 killed while writing checkpoint-20", 20, outcome,
                                  kill_in_save=20)  # fmt: skip


def scenario_kill_in_merged_save(bench: Bench) -> Outcome:
    result = bench.break_and_resume("kill_in_merged_save", "rank 0 killed inside the final merged/ save", 30,
                                    lambda output, out, steps: f"resume from checkpoint-{steps[-1]} only finishes",
                                    kill_in_merged_save=True)  # fmt: skip
    if checkpoints(os.path.join(bench.root, "kill_in_merged_save"))[-1] != 30:
        result.outcome += " (TRAINED AGAIN)"
    return result


def _sigterm(bench: Bench, name: str, what: str, sigterm: list, **options) -> Outcome:
    return bench.break_and_resume(name, what, sigterm[1] + 1, says("training was preempted"), resume="newest",
                                  sigterm=sigterm, **options)  # fmt: skip


def scenario_sigterm_round_end(bench: Bench) -> Outcome:
    return _sigterm(bench, "sigterm_round_end", "SIGTERM to rank 1 at step 12 (round ends at 15)", [1, 12, "self"])


def scenario_sigterm_launcher(bench: Bench) -> Outcome:
    return _sigterm(bench, "sigterm_launcher", "SIGTERM to accelerate launch at step 12", [0, 12, "launcher"])


def scenario_sigterm_cut(bench: Bench) -> Outcome:
    config = {"inner_steps": 10, "preemption_grace_seconds": 0}
    return _sigterm(bench, "sigterm_cut", "SIGTERM, no grace: cut inside the round (H=10)", [0, 12, "self"],
                    config=config, preemption_poll=0)  # fmt: skip


def scenario_truncated_checkpoint(bench: Bench) -> Outcome:
    intact = []

    def truncate_newest(output, out, steps):
        newest = os.path.join(out, f"checkpoint-{steps[-1]}", "model.safetensors")
        with open(newest, "r+b") as f:
            f.truncate(os.path.getsize(newest) // 2)
        intact.append(steps[-2])
        return f"checkpoint-{steps[-1]} skipped (named), resumed from checkpoint-{steps[-2]}"

    result = bench.break_and_resume("truncated_checkpoint", "newest model.safetensors truncated, resume=True", 22,
                                    truncate_newest, fail=["all", 22, 9])  # fmt: skip
    result.work_lost_steps = 22 - intact[0]  # the resume falls back past the damaged newest checkpoint
    return result


def _stopped_at_12(out: str) -> None:
    launch(out, out + "-probe-first", fail=["all", 12, 9])


def scenario_changed_settings(bench: Bench) -> Outcome:
    return bench.break_only("changed_settings", "resume with inner_steps 5 → 4", ("inner_steps was",),
                            prepare=_stopped_at_12, config={"inner_steps": 4, "save_steps": 8}, resume=True)  # fmt: skip


def scenario_deleted_rank_state(bench: Bench) -> Outcome:
    def prepare(out):
        _stopped_at_12(out)
        os.remove(os.path.join(out, "checkpoint-10", "adloco", "rank-1.pt"))

    return bench.break_only("deleted_rank_state", "checkpoint-10/adloco/rank-1.pt deleted", ("rank-1.pt",),
                            prepare=prepare, resume="checkpoint-10")  # fmt: skip


def scenario_hang_in_save(bench: Bench) -> Outcome:
    return bench.break_and_resume("hang_in_save", "rank 1 hangs inside the checkpoint-20 save", 20,
                                  says("WorkerTimeoutError", "did not arrive"), hang_in_save=[1, 20], timeout=240)  # fmt: skip


def scenario_disk_full(bench: Bench) -> Outcome:
    return bench.break_and_resume("disk_full", "rank 1's disk is full at the checkpoint-20 save", 20,
                                  says("No space", "disk", "free"), disk_full=[1, 20, "torch.save"])  # fmt: skip


def scenario_nan_worker(bench: Bench) -> Outcome:
    config = {"merge_every": 3, "max_steps": 40}  # more than max_skipped_rounds (3) rounds after the merge
    return bench.break_only("nan_worker", "rank 1 NaN for the whole run", ("SkippedRoundsError:",),
                            config=config, nan=[1, 0, "onwards"])  # fmt: skip


SCENARIOS: dict[str, Callable[[Bench], Outcome]] = {
    name[len("scenario_") :]: fn for name, fn in globals().items() if name.startswith("scenario_")
}
