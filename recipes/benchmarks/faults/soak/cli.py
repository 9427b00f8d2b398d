"""`python -m recipes.benchmarks.faults soak`: the uninterrupted run, the run with kills, the table and the files."""

import argparse
import math
import os
import random

from recipes.benchmarks.faults.progress import thin_timeline
from recipes.benchmarks.faults.soak.config import (
    CONFIG,
    START_SECONDS,
    STEP_SECONDS,
    WORLD_SIZE,
    run_config,
    steps_for,
)
from recipes.benchmarks.faults.soak.report import measure_kills, plot, summarize
from recipes.benchmarks.faults.soak.soak import Launch, soak
from recipes.benchmarks.toolkit.results import table, write_json


__all__ = ["main", "mean_max", "parse_args"]

DESCRIPTION = (
    "Fault soak: 4 workers under `accelerate launch --max_restarts`, a random worker SIGKILLed every few minutes."
)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m recipes.benchmarks.faults soak", description=DESCRIPTION)
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
    """The uninterrupted run, then the run with kills; print the table, write `fault_soak.json` and `.png`."""
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
            "steps redone": mean_max(summary["mean_steps_redone"], summary["max_steps_redone"]),
            "resumed from": f"interval {summary['checkpoint_interval_steps']}",
            "s kill→first step": mean_max(summary["mean_seconds_to_first_step"], summary["max_seconds_to_first_step"]),
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


def mean_max(mean: float | None, largest: float | None) -> str:
    return "-" if mean is None else f"mean {mean:.1f}, max {largest:.1f}"
