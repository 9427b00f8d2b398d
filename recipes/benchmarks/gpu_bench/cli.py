"""`python -m recipes.benchmarks.gpu_bench` (`make gpu-bench`): the steps, each in a process of its own stopped at
the step limit, into the results folder of this device; then the folder's README.md and docs/gpu.md's tables."""

import argparse
import datetime
import glob
import importlib
import os
import signal
import subprocess
import sys
import time
import traceback
from dataclasses import dataclass

from recipes.benchmarks.gpu_bench.device import (
    BENCH_VERSION,
    RUNS_FILE,
    device_slug,
    folder_versions,
    read_runs,
    read_step,
)
from recipes.benchmarks.gpu_bench.report import folder_section, update_doc
from recipes.benchmarks.toolkit.paths import REPO, RESULTS
from recipes.benchmarks.toolkit.results import write_json


@dataclass(frozen=True)
class Step:
    name: str
    module: str  # of this package: `python -m recipes.benchmarks.gpu_bench.MODULE --step NAME ...`
    minutes: float  # estimate on an H100, start-up included


# What has never been measured first (issue 38): the headline, then the steps no stay has finished; the second seed
# and MicroLlama's throughput (measured on an H200 before the fixes of issue 38) after them.
STEPS = (
    Step("headline", "headline", 7.5),
    Step("throughput-50m", "throughput", 4.5),
    Step("growing-batch", "throughput", 3),
    Step("workers", "workers", 6),
    Step("headline-seed2", "headline", 7.5),
    Step("throughput-300m", "throughput", 6),
)
DESCRIPTION = (
    "`make gpu-bench`: how fast AdLoCo trains where our users train, in resumable steps of at most 8 minutes."
)
# A GPU machine is lent for 15 minutes, its start-up included: one step, start-up and data included, fits in 8.
STEP_LIMIT_SECONDS = 8 * 60
RESULTS_ROOT = os.path.join(RESULTS, "gpu")
DOC = os.path.join(REPO, "docs", "gpu.md")
TINY_ROOT = os.path.join(REPO, "outputs", "gpu_bench", "tiny")


def device_name() -> str:
    import torch

    return torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"


def pending(folder: str, names: list[str]) -> list[str]:
    """The steps of `names` whose results are not in `folder` yet (in the benchmark's order)."""
    return [n for n in names if read_step(folder, n) is None]


def choose_folder(root: str, slug: str, today: str) -> str:
    """The newest folder of this device under `root` that still lacks a step and holds only this version's results
    (`BENCH_VERSION`: an older benchmark's figures are not continued), else a new `<slug>-<today>`."""
    mine = sorted(glob.glob(os.path.join(root, f"{slug}-????-??-??")), key=lambda d: d[-10:], reverse=True)
    for folder in mine:
        if folder_versions(folder) <= {BENCH_VERSION} and pending(folder, [s.name for s in STEPS]):
            return folder
    return os.path.join(root, f"{slug}-{today}")


def fits(step: Step, elapsed_minutes: float, max_minutes: float | None) -> bool:
    return max_minutes is None or elapsed_minutes + step.minutes <= max_minutes


def run_in_process(step: Step, folder: str, cache_dir: str) -> dict:
    """`--tiny`: the step in this process (each step's own process costs more than its tiny training)."""
    print(f"--- {step.name} (tiny, in this process)", flush=True)
    start = time.perf_counter()
    try:
        importlib.import_module(f"{__package__}.{step.module}").run(step.name, folder, cache_dir, True)
        error = None
    except (Exception, SystemExit):  # a failed step is recorded, the next one still runs
        error = traceback.format_exc()[-1200:]
        print(error, flush=True)
    seconds = time.perf_counter() - start
    print(f"--- {step.name}: {'done' if error is None else 'FAILED'} in {seconds:.0f} s", flush=True)
    return {"step": step.name, "exit_code": 0 if error is None else 1, "seconds": round(seconds, 1),
            "done": read_step(folder, step.name) is not None, "started_at": _now(),
            **({} if error is None else {"log_tail": error})}  # fmt: skip


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def stop(process: subprocess.Popen, grace: float = 45.0) -> None:
    """SIGTERM to a running step (it stops the workers it launched, in their own session, on the way out), then
    SIGKILL to its process group after `grace` seconds."""
    if process.poll() is not None:
        return
    os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()


def run_step(step: Step, folder: str, cache_dir: str, tiny: bool, log_dir: str, isolate: bool = False) -> dict:
    """Run one step in its own process (stopped at the step limit); its outcome for `runs.json`. `--tiny` steps run
    in this process unless `isolate`."""
    if tiny and not isolate:
        return run_in_process(step, folder, cache_dir)
    command = [sys.executable, "-m", f"{__package__}.{step.module}", "--step", step.name, "--results_dir", folder,
               "--cache_dir", cache_dir, *(["--tiny"] if tiny else [])]  # fmt: skip
    limit = STEP_LIMIT_SECONDS
    log_path = os.path.join(log_dir, f"{step.name}.log")
    os.makedirs(log_dir, exist_ok=True)
    print(f"--- {step.name}: {' '.join(command)} (log: {log_path})", flush=True)
    start = time.perf_counter()
    with open(log_path, "w", encoding="utf-8") as log:
        process = subprocess.Popen(command, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            code = process.wait(timeout=limit)
        except subprocess.TimeoutExpired:
            code = 124
        finally:  # the limit, or this process stopped (SIGTERM, Ctrl-C): the step and the workers it launched go too
            stop(process)
    seconds = time.perf_counter() - start
    done = read_step(folder, step.name) is not None
    with open(log_path, encoding="utf-8", errors="replace") as f:
        tail = f.read()[-2000:]
    print(tail[-800:] if not done else "", f"--- {step.name}: exit {code} in {seconds:.0f} s", flush=True, sep="")
    return {"step": step.name, "exit_code": code, "seconds": round(seconds, 1), "done": done,
            "started_at": _now(),
            **({} if done else {"log_tail": tail[-1200:]})}  # fmt: skip


def record_runs(folder: str, outcomes: list[dict]) -> None:
    """Append this run's outcomes to the folder's `runs.json` (every attempt, failures with their log's end)."""
    versioned = [{**outcome, "bench_version": BENCH_VERSION} for outcome in outcomes]
    write_json(os.path.join(folder, RUNS_FILE), read_runs(folder) + versioned)


def write_readme(folder: str) -> None:
    """The folder's own table (the same section as docs/gpu.md's, its figures linked from the folder)."""
    with open(os.path.join(folder, "README.md"), "w", encoding="utf-8") as f:
        f.write("# GPU benchmark results\n\n`python -m recipes.benchmarks.gpu_bench` wrote this folder; every number "
                "below is in its JSON files.\n\n" + folder_section(folder))  # fmt: skip


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=DESCRIPTION)
    parser.add_argument(
        "--results_dir", default=None, help="Default: the newest unfinished docs/results/gpu/<device>-<date>."
    )
    parser.add_argument("--steps", nargs="+", choices=[s.name for s in STEPS], default=None)
    parser.add_argument("--max_minutes", type=float, default=None, help="Start only the steps that fit.")
    parser.add_argument("--cache_dir", default=os.path.join(REPO, "outputs", "cache"))
    parser.add_argument("--doc", default=None, help="The page whose generated section is rewritten (docs/gpu.md).")
    parser.add_argument("--tiny", action="store_true", help="Every step at tiny scale, on a CPU too.")
    parser.add_argument("--table", action="store_true", help="Only regenerate the tables from the results files.")
    parser.add_argument("--isolate", action="store_true", help="--tiny: each step in its own process, as on a GPU.")
    return parser.parse_args(argv)


def _stop(signum, frame):
    raise SystemExit(128 + signum)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, _stop)  # `timeout` stops a step's process group with this one
    started = time.perf_counter()
    root = (
        os.path.dirname(os.path.abspath(args.results_dir))
        if args.results_dir
        else TINY_ROOT
        if args.tiny
        else RESULTS_ROOT
    )
    doc = os.path.abspath(args.doc or (os.path.join(TINY_ROOT, "gpu.md") if args.tiny else DOC))
    if args.table:
        for folder in sorted(glob.glob(os.path.join(root, "*"))):
            if os.path.isdir(folder):
                write_readme(folder)
        update_doc(doc, root)
        print(f"wrote {doc}")
        return 0
    name = device_name()
    if name == "cpu" and not args.tiny:
        print("gpu-bench: no CUDA device is visible; nothing was run (--tiny runs every step on the CPU, tiny).")
        return 2
    today = datetime.date.today().isoformat()
    folder = os.path.abspath(args.results_dir or choose_folder(root, device_slug(name), today))
    os.makedirs(folder, exist_ok=True)
    log_dir = os.path.join(REPO, "outputs", "gpu_bench", "logs", os.path.basename(folder))
    wanted = [s for s in STEPS if args.steps is None or s.name in args.steps]
    todo = pending(folder, [s.name for s in wanted])
    print(f"gpu-bench on {name} into {folder}: {len(wanted) - len(todo)} of {len(wanted)} steps done", flush=True)
    outcomes = []
    for step in (s for s in wanted if s.name in todo):
        elapsed = (time.perf_counter() - started) / 60
        if not args.tiny and not fits(step, elapsed, args.max_minutes):
            print(f"--- {step.name}: left for a later run ({step.minutes} min estimated, {elapsed:.1f} of "
                  f"{args.max_minutes} min used)", flush=True)  # fmt: skip
            continue
        outcomes.append(run_step(step, folder, os.path.abspath(args.cache_dir), args.tiny, log_dir, args.isolate))
    if outcomes:
        record_runs(folder, outcomes)
    write_readme(folder)
    update_doc(doc, os.path.dirname(folder))
    left = pending(folder, [s.name for s in wanted])
    print(f"gpu-bench: {folder}; steps left: {', '.join(left) or 'none'}; tables in {doc}", flush=True)
    return 0 if all(o["done"] for o in outcomes) else 1
