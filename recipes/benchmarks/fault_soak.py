"""Fault soak: 4 workers under `accelerate launch --max_restarts`, a random worker SIGKILLed every few minutes.

The workers run the test suite's worker (`tests/scripts/adloco_worker.py`: a tiny Llama with attention dropout 0.1, 2
instances that merge, growing batches, per-worker learning rates, fresh data throughout) and resume with
`train(resume_from_checkpoint="auto")`: the newest intact checkpoint, else a fresh start. This driver, outside the
workers as a real preemption would be, kills a random worker with SIGKILL about every `--kill_every` seconds of
training; the launcher restarts all 4 and the run goes on by itself. An uninterrupted run of the same config runs
first, for the comparison. Prints one table and writes `fault_soak.json` and `fault_soak.png` (step against wall
time of both runs, the kills marked).

    python -m recipes.benchmarks.fault_soak                   # ~15 min of training, a kill every ~3 min (~40 min)
    python -m recipes.benchmarks.fault_soak --minutes 1 --kill_every 20 --kills 2 --output_dir outputs/fault_soak_smoke

Per kill: the step the killed attempt had reached (the furthest worker), the step the next attempt resumed from, the
steps redone (their difference: at most one checkpoint interval), and the seconds from the kill to the first step
completed after the restart. The summary adds the restarts, whether the run finished by itself, and the final
merged model against the uninterrupted run's (max difference, target ≤ 1e-6) with the rounds file on the keys a
resumed run must reproduce.
"""

import argparse
import json
import math
import os
import random
import shutil
import signal
import statistics
import threading
import time

import psutil
import torch

from adloco_hf.testing import launch_command, run_workers
from recipes.benchmarks._common import REPO, RESUMED_ROUND_KEYS, table, write_json
from recipes.benchmarks.faults import merged


WORKER = os.path.join(REPO, "tests", "scripts", "adloco_worker.py")
WORLD_SIZE = 4
CONFIG = dict(
    inner_steps=10, save_steps=50, save_total_limit=3, num_instances=2, per_device_train_batch_size=2,
    max_batch_size=4, batch_size_cap=4, eta=0.5, seed=3, optim="adamw_torch", learning_rate=3e-3,
    lr_batch_scaling="sqrt", worker_timeout=10,
)  # fmt: skip
# A Llama of ~2.4 M parameters (the test suite's tiny one takes 20 ms a step: 45,000 steps in 15 minutes).
MODEL = {"hidden_size": 256, "layers": 4}
# Seconds per inner step of this config on 2 shared CPU cores (4 workers, rounds and merges included), and the
# seconds before the first step (4 processes importing torch and transformers): measured to size `--minutes`.
STEP_SECONDS = 0.12
START_SECONDS = 11.0


def run_config(max_steps: int, save_steps: int) -> dict:
    """CONFIG for `max_steps` and `save_steps`: the 2 instances merge halfway (`merge_every` rounds)."""
    rounds = max_steps // CONFIG["inner_steps"]
    return {**CONFIG, "max_steps": max_steps, "save_steps": save_steps, "merge_every": max(1, rounds // 2)}


def steps_for(minutes: float, save_steps: int) -> int:
    """The `max_steps` that trains about `minutes` (a multiple of `save_steps`, at least 3 checkpoint intervals)."""
    return max(3 * save_steps, round(minutes * 60 / STEP_SECONDS / save_steps) * save_steps)


def spec(out: str, probe: str, config: dict) -> dict:
    # Fresh data: each worker draws at most batch_size_cap samples per step, so no sample repeats.
    return {
        "output_dir": out,
        "world_size": WORLD_SIZE,
        "probe_dir": probe,
        "config": {"output_dir": out, **config},
        "dropout": 0.1,
        "model": MODEL,
        "probes": False,  # the probes' own gathers would meet a killed worker before the library does
        "resume": "auto",
        "progress": True,
        "num_samples": config["max_steps"] * config["batch_size_cap"] * WORLD_SIZE,
    }


class Progress:
    """The workers' `progress-rank{R}.jsonl` (`tests/scripts/restarts.py`'s ProgressRecorder), read as they grow:
    `starts[attempt][rank]` = the step it resumed from; `steps[attempt][rank]` = [(step, time)]."""

    def __init__(self, probe: str, world_size: int = WORLD_SIZE):
        self.probe, self.world_size, self.offsets = probe, world_size, {}
        self.starts: dict[int, dict[int, int]] = {}
        self.steps: dict[int, dict[int, list]] = {}

    def read(self) -> None:
        for rank in range(self.world_size):
            path = os.path.join(self.probe, f"progress-rank{rank}.jsonl")
            if not os.path.exists(path):
                continue
            with open(path, encoding="utf-8") as f:
                f.seek(self.offsets.get(path, 0))
                while (line := f.readline()).endswith("\n"):  # a line still being written waits for the next read
                    self.offsets[path] = f.tell()
                    entry = json.loads(line)
                    if "started_at_step" in entry:
                        self.starts.setdefault(entry["attempt"], {})[rank] = entry["started_at_step"]
                    else:
                        self.steps.setdefault(entry["attempt"], {}).setdefault(rank, []).append(
                            (entry["step"], entry["time"])
                        )

    def attempt(self) -> int:
        return max(self.starts, default=0)

    def first_step_time(self, attempt: int) -> float | None:
        times = [t for points in self.steps.get(attempt, {}).values() for _, t in points[:1]]
        return min(times, default=None)

    def reached(self, attempt: int) -> int | None:
        """The furthest step any worker of `attempt` completed (None: none completed one)."""
        steps = [s for points in self.steps.get(attempt, {}).values() for s, _ in points]
        return max(steps, default=None)

    def timeline(self) -> list[tuple[float, int]]:
        """(time, furthest step of its attempt) each time an attempt's furthest worker completed a step: the run's
        progress, falling back to the step resumed from after each restart."""
        points = sorted((t, s, a) for a, ranks in self.steps.items() for p in ranks.values() for s, t in p)
        out, best = [], {}
        for t, s, a in points:
            if s > best.get(a, -1):
                best[a] = s
                out.append((t, s))
        return out


def thin_timeline(points: list[tuple[float, int]], started: float, seconds: float = 1.0) -> list[list[float]]:
    """A timeline for the results file: [seconds since `started`, step], a point at most every `seconds` (a 15-minute
    run completes some 7,500 steps), every fall back to a resumed step and the last point kept."""
    out = []
    for i, (t, step) in enumerate(points):
        if not out or i == len(points) - 1 or step < out[-1][1] or t - started - out[-1][0] >= seconds:
            out.append([round(t - started, 3), step])
    return out


class Launch:
    """One launch in a thread (`run_workers`: its timeout kills every worker), so that this process can watch it."""

    def __init__(self, name: str, root: str, config: dict, *, max_restarts: int, timeout: float):
        self.out, self.probe = os.path.join(root, name), os.path.join(root, f"{name}-probe")
        for folder in (self.out, self.probe):
            shutil.rmtree(folder, ignore_errors=True)
        os.makedirs(self.probe)
        command = launch_command(
            WORKER, json.dumps(spec(self.out, self.probe, config)), num_processes=WORLD_SIZE, max_restarts=max_restarts
        )
        self.progress, self.result, self.log = Progress(self.probe), None, os.path.join(root, f"{name}.log")
        self.started = time.time()
        self.thread = threading.Thread(target=self._run, args=(command, timeout), daemon=True)
        self.thread.start()

    def _run(self, command, timeout):
        tests = os.path.join(REPO, "tests")
        self.result = run_workers(
            command, timeout=timeout, cwd=REPO, pythonpath=[REPO, tests], threads=1, log_path=self.log, check=False
        )

    def running(self) -> bool:
        return self.thread.is_alive()

    def launcher(self) -> psutil.Process | None:
        for child in psutil.Process().children():
            try:
                if "accelerate.commands.launch" in child.cmdline() and self.running():
                    return child
            except psutil.NoSuchProcess:
                continue
        return None

    def worker_pid(self, rank: int, attempt: int) -> int | None:
        """The pid of worker `rank` of launch attempt `attempt`: a child of the launcher (its elastic agent)."""
        launcher = self.launcher()
        for child in launcher.children() if launcher else []:
            try:
                env = child.environ()
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
            if env.get("RANK") == str(rank) and env.get("TORCHELASTIC_RESTART_COUNT", "0") == str(attempt):
                return child.pid
        return None

    def stop(self) -> None:
        """SIGKILL the workers, then the launcher's process group (the workers run in sessions of their own, so a
        dead launcher would leave them behind), and wait for the launch's thread."""
        launcher = self.launcher()
        if launcher is None:
            return
        for process in [*launcher.children(recursive=True), launcher]:
            try:
                process.kill()
            except psutil.NoSuchProcess:
                pass
        try:
            os.killpg(launcher.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.thread.join(timeout=60)

    def finished(self) -> bool:
        return (
            self.result is not None and self.result.returncode == 0 and os.path.isdir(os.path.join(self.out, "merged"))
        )


def soak(
    launch: Launch, *, kills: int, kill_every: float, max_steps: int, rng: random.Random, restart_timeout: float
) -> list[dict]:
    """Kill a random worker `kill_every` × U(0.5, 1.5) seconds after each attempt's first step, `kills` times while
    training is left (never while the workers start, nor after the last step); print a line per kill and restart.
    A run with no new step `restart_timeout` seconds after a kill is stopped: it did not come back by itself."""
    plan = [(kill_every * rng.uniform(0.5, 1.5), rng.randrange(WORLD_SIZE)) for _ in range(kills)]
    done, announced = [], set()
    try:
        while launch.running():
            time.sleep(0.25)
            launch.progress.read()
            attempt = launch.progress.attempt()
            first = launch.progress.first_step_time(attempt)
            back = attempt > done[-1]["attempt"] and first is not None if done else True
            if not back and time.time() - done[-1]["time"] > restart_timeout:
                print(f"    no step {restart_timeout:g} s after kill {len(done)}: stopping the run", flush=True)
                launch.stop()
                break
            if attempt > 0 and first is not None and attempt not in announced:
                announced.add(attempt)
                kill = next((k for k in done if k["attempt"] == attempt - 1), None)
                since = f"; its first step {first - kill['time']:.1f} s after the kill" if kill else ""
                starts = launch.progress.starts[attempt].values()
                print(f"    restart {attempt}: resumed from step {min(starts)}{since}", flush=True)
            if len(done) >= kills or first is None or any(k["attempt"] == attempt for k in done):
                continue
            wait, rank = plan[len(done)]
            reached = launch.progress.reached(attempt) or 0
            if time.time() - first < wait or reached >= max_steps - 1:
                continue
            pid = launch.worker_pid(rank, attempt)
            if pid is None:
                continue
            os.kill(pid, signal.SIGKILL)
            now = time.time()
            done.append({"kill": len(done) + 1, "time": now, "rank": rank, "pid": pid, "attempt": attempt})
            print(f"  kill {len(done)}: SIGKILL to rank {rank} (pid {pid}) of attempt {attempt} at step ~{reached}, "
                  f"{now - launch.started:.0f} s into the run", flush=True)  # fmt: skip
        launch.thread.join()
    except BaseException:
        launch.stop()
        raise
    launch.progress.read()
    return done


def measure_kills(kills: list[dict], progress: Progress) -> list[dict]:
    """Per kill: the step reached, the step resumed from, the steps redone and the seconds to the first new step."""
    rows = []
    for kill in kills:
        attempt = kill["attempt"]
        reached = progress.reached(attempt)  # kills come after an attempt's first step: never None
        starts = progress.starts.get(attempt + 1, {})
        resumed = min(starts.values()) if starts else None
        first = progress.first_step_time(attempt + 1)
        rows.append(
            {
                **kill,
                "reached_step": reached,
                "resumed_from": resumed,
                "steps_redone": None if resumed is None else reached - resumed,
                "seconds_to_first_step": None if first is None else first - kill["time"],
            }
        )
    return rows


def flat_merged(out: str) -> torch.Tensor | None:
    """The run's merged model, flat (`faults.merged`); None when the run wrote none."""
    return merged(out) if os.path.isdir(os.path.join(out, "merged")) else None


def compared_rounds(out: str) -> list[dict]:
    path = os.path.join(out, "adloco_rounds.jsonl")
    if not os.path.exists(path):
        return []
    with open(path, encoding="utf-8") as f:
        return [{k: line.get(k) for k in RESUMED_ROUND_KEYS} for line in map(json.loads, f)]


def summarize(rows: list[dict], soak_run: Launch, reference: Launch, save_steps: int) -> dict:
    seconds = [r["seconds_to_first_step"] for r in rows if r["seconds_to_first_step"] is not None]
    redone = [r["steps_redone"] for r in rows if r["steps_redone"] is not None]
    ours, theirs = flat_merged(soak_run.out), flat_merged(reference.out)
    diff = None if ours is None or theirs is None else (ours - theirs).abs().max().item()
    rounds, reference_rounds = compared_rounds(soak_run.out), compared_rounds(reference.out)
    return {
        "kills": len(rows),
        "restarts": soak_run.progress.attempt(),
        "mean_seconds_to_first_step": statistics.fmean(seconds) if seconds else None,
        "max_seconds_to_first_step": max(seconds, default=None),
        "mean_steps_redone": statistics.fmean(redone) if redone else None,
        "max_steps_redone": max(redone, default=None),
        "checkpoint_interval_steps": save_steps,
        "merged_max_difference": diff,
        "merged_equal": diff is not None and diff <= 1e-6,
        "rounds_equal": bool(rounds) and rounds == reference_rounds,
        "rounds": len(rounds),
        "finished_by_itself": soak_run.finished(),
        "exit_code": soak_run.result.returncode,
        "seconds": soak_run.result.seconds,
        "uninterrupted_seconds": reference.result.seconds,
    }


def plot(soak_run: Launch, reference: Launch, rows: list[dict], path: str, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 4.5))
    for run, label, style in ((reference, "uninterrupted", "--"), (soak_run, "with kills", "-")):
        points = run.progress.timeline()
        ax.plot(
            [t - run.started for t, _ in points], [s for _, s in points], style, label=label, drawstyle="steps-post"
        )
    for row in rows:
        ax.axvline(row["time"] - soak_run.started, color="tab:red", alpha=0.6, linewidth=1)
        ax.annotate(f"kill rank {row['rank']}", (row["time"] - soak_run.started, row["reached_step"]),
                    textcoords="offset points", xytext=(3, 4), fontsize=8, color="tab:red")  # fmt: skip
    ax.set_xlabel("seconds since the launch")
    ax.set_ylabel("inner step completed (furthest worker)")
    ax.set_title(title, fontsize=10)
    ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=15.0, help="training time of the uninterrupted run")
    parser.add_argument("--max_steps", type=int, default=None, help="overrides --minutes (a multiple of save_steps)")
    parser.add_argument("--save_steps", type=int, default=CONFIG["save_steps"], help="the checkpoint interval")
    parser.add_argument("--kill_every", type=float, default=180.0, help="seconds of training between kills (±50 %%)")
    parser.add_argument("--kills", type=int, default=None, help="default: one per --kill_every inside --minutes")
    parser.add_argument("--seed", type=int, default=0, help="of the kills' times and ranks")
    parser.add_argument("--restart_timeout", type=float, default=300.0, help="seconds after a kill with no new step "
                        "before the run is stopped as not coming back")  # fmt: skip
    parser.add_argument("--output_dir", default="outputs/fault_soak")
    args = parser.parse_args(argv)
    inner = CONFIG["inner_steps"]
    if args.save_steps <= 0 or args.save_steps % inner:
        parser.error(f"--save_steps {args.save_steps}: give a positive multiple of inner_steps ({inner})")
    if args.max_steps is not None and (args.max_steps <= 0 or args.max_steps % args.save_steps):
        parser.error(f"--max_steps {args.max_steps}: give a positive multiple of --save_steps ({args.save_steps})")
    if args.minutes <= 0 or args.kill_every <= 0:
        parser.error("--minutes and --kill_every must be positive")
    if args.kills is not None and args.kills < 0:
        parser.error(f"--kills {args.kills}: give 0 or more")
    return args


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    max_steps = args.max_steps or steps_for(args.minutes, args.save_steps)
    kills = args.kills if args.kills is not None else max(1, math.ceil(args.minutes * 60 / args.kill_every) - 1)
    config = run_config(max_steps, args.save_steps)
    root = os.path.join(args.output_dir, "runs")
    os.makedirs(root, exist_ok=True)
    expected = START_SECONDS + max_steps * STEP_SECONDS
    timeout = 3 * expected + kills * 120 + 300
    print(f"fault soak: {WORLD_SIZE} workers, {max_steps} steps (~{expected / 60:.1f} min), checkpoints every "
          f"{config['save_steps']} steps, {kills} kill(s) about every {args.kill_every:g} s", flush=True)  # fmt: skip
    print("[1/2] the uninterrupted run ...", flush=True)
    reference = Launch("uninterrupted", root, config, max_restarts=kills + 2, timeout=timeout)
    try:
        reference.thread.join()
    except BaseException:
        reference.stop()
        raise
    reference.progress.read()
    if not reference.finished():
        raise RuntimeError(f"the uninterrupted run failed (exit {reference.result.returncode}), see {reference.log}")
    print(f"    done in {reference.result.seconds:.0f} s", flush=True)
    print(f"[2/2] the run with {kills} kill(s) ...", flush=True)
    soak_run = Launch("soak", root, config, max_restarts=kills + 2, timeout=timeout)
    done = soak(soak_run, kills=kills, kill_every=args.kill_every, max_steps=max_steps, rng=random.Random(args.seed),
                restart_timeout=args.restart_timeout)  # fmt: skip
    rows = measure_kills(done, soak_run.progress)
    summary = summarize(rows, soak_run, reference, config["save_steps"])
    print(
        f"    exit {soak_run.result.returncode} after {soak_run.result.seconds:.0f} s; launcher output: {soak_run.log}"
    )
    table_rows = [
        {
            "kill": r["kill"],
            "at s": round(r["time"] - soak_run.started),
            "rank": r["rank"],
            "attempt": r["attempt"],
            "step reached": r["reached_step"],
            "resumed from": r["resumed_from"],
            "steps redone": r["steps_redone"],
            "s kill→first step": r["seconds_to_first_step"],
        }
        for r in rows
    ]
    table_rows.append(
        {
            "kill": f"all {summary['kills']}",
            "at s": f"{summary['seconds']:.0f} (vs {summary['uninterrupted_seconds']:.0f})",
            "attempt": f"{summary['restarts']} restarts",
            "steps redone": _mean_max(summary["mean_steps_redone"], summary["max_steps_redone"]),
            "resumed from": f"interval {summary['checkpoint_interval_steps']}",
            "s kill→first step": _mean_max(
                summary["mean_seconds_to_first_step"], summary["max_seconds_to_first_step"]
            ),
            "merged max diff": summary["merged_max_difference"],
            "rounds equal": "yes" if summary["rounds_equal"] else "NO",
            "finished by itself": "yes" if summary["finished_by_itself"] else "NO",
        }
    )
    print(table(table_rows, [*table_rows[0], "merged max diff", "rounds equal", "finished by itself"]))
    result = {
        "world_size": WORLD_SIZE,
        "config": config,
        "kill_every": args.kill_every,
        "seed": args.seed,
        "kills": rows,
        "summary": summary,
        "uninterrupted_timeline": thin_timeline(reference.progress.timeline(), reference.started),
        "soak_timeline": thin_timeline(soak_run.progress.timeline(), soak_run.started),
    }
    write_json(os.path.join(args.output_dir, "fault_soak.json"), result)
    title = (f"{WORLD_SIZE} CPU workers, {max_steps} steps, checkpoints every {config['save_steps']}: "
             f"{summary['kills']} SIGKILLs, merged max diff {summary['merged_max_difference']}")  # fmt: skip
    plot(soak_run, reference, rows, os.path.join(args.output_dir, "fault_soak.png"), title)
    print(f"wrote {args.output_dir}/fault_soak.json and fault_soak.png")
    return result


def _mean_max(mean: float | None, largest: float | None) -> str:
    return "-" if mean is None else f"mean {mean:.1f}, max {largest:.1f}"


if __name__ == "__main__":
    main()
