"""`python -m recipes.benchmarks.faults process`: the scenarios one after the other (a scenario that breaks is a
finding), one table, `faults.json` and `faults.png`."""

import argparse
import os
import time
from dataclasses import asdict

from recipes.benchmarks.faults.process.scenarios import CONFIG, SCENARIOS, Bench, Outcome
from recipes.benchmarks.toolkit.figures import pyplot, save_figure
from recipes.benchmarks.toolkit.options import chosen_names
from recipes.benchmarks.toolkit.results import table, write_json


__all__ = ["main", "parse_args", "plot"]

DESCRIPTION = (
    "Fault injection: what each failure does to a real 2-worker AdLoCo run, and whether resuming gives the same model."
)


def plot(outcomes: list[Outcome], path: str) -> None:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(9, 0.45 * len(outcomes) + 1.2))
    names = [o.scenario for o in outcomes]
    lost = [o.work_lost_steps if o.work_lost_steps is not None else 0 for o in outcomes]
    colors = [
        "tab:green" if o.resumed_equal else ("tab:gray" if o.resumed_equal is None else "tab:red") for o in outcomes
    ]
    ax.barh(names, lost, color=colors)
    ax.invert_yaxis()
    ax.set_xlabel("inner steps trained again after the resume (green: same merged model as uninterrupted)")
    ax.set_title("AdLoCo under faults: 2 CPU workers, 30 steps, rounds of 5, checkpoints every 10")
    save_figure(fig, path)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m recipes.benchmarks.faults process", description=DESCRIPTION)
    parser.add_argument("--scenarios", default=",".join(SCENARIOS), help=f"comma-separated, of {', '.join(SCENARIOS)}")
    parser.add_argument("--output_dir", default="outputs/faults")
    args = parser.parse_args(argv)
    args.names = chosen_names(parser, args.scenarios, SCENARIOS)
    return args


def main(argv: list[str] | None = None) -> None:
    """Run the scenarios of the command line; print the table, write `faults.json` and `faults.png`."""
    args = parse_args(argv)
    names = args.names
    os.makedirs(args.output_dir, exist_ok=True)
    bench = Bench(os.path.join(args.output_dir, "runs"))
    outcomes = []
    for index, name in enumerate(names, 1):
        print(f"[{index}/{len(names)}] {name} ...", flush=True)
        started = time.time()
        try:
            outcome = SCENARIOS[name](bench)
        except Exception as error:  # a scenario that breaks is a finding, not the end of the benchmark
            outcome = Outcome(name, name, f"BENCHMARK ERROR: {str(error).splitlines()[0][:100]}", None, False, None)
        outcome.seconds = round(time.time() - started, 1)
        outcomes.append(outcome)
        print(f"    {outcome.outcome} ({outcome.seconds:.0f} s)", flush=True)
    rows = [
        {
            "scenario": o.scenario,
            "what": o.what,
            "outcome": o.outcome,
            "work lost (steps)": "-" if o.work_lost_steps is None else o.work_lost_steps,
            "resumed = uninterrupted": "n/a" if o.resumed_equal is None else ("yes" if o.resumed_equal else "NO"),
        }
        for o in outcomes
    ]
    print(table(rows, list(rows[0])))
    write_json(
        os.path.join(args.output_dir, "faults.json"), {"config": CONFIG, "scenarios": [asdict(o) for o in outcomes]}
    )
    plot(outcomes, os.path.join(args.output_dir, "faults.png"))
    print(f"wrote {args.output_dir}/faults.json and faults.png")
