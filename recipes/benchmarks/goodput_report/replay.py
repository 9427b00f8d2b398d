"""Without a links run: `convergence`'s runs replayed over modelled links by `wallclock`'s model, per bandwidth and
seed, and their report."""

import argparse
import os

from recipes.benchmarks.goodput_report.figures import FIXED, GOODPUT
from recipes.benchmarks.goodput_report.report import mean_sd
from recipes.benchmarks.toolkit.results import table
from recipes.benchmarks.wallclock import DeviceProfile, Link, replay_folder, seconds_at_tokens, tokens_to_target


__all__ = ["profile_from_args", "replay_figures", "replay_report"]


def replay_figures(results: dict, profile, bandwidths: list[float], method: str = GOODPUT) -> list[dict]:
    """Without a links run: `convergence`'s runs replayed by the wall-clock model (`wallclock`: the rounds file's
    batches, merges and all-reduces over a link of `bandwidth` bits/s, latency 0.1 ms, efficiency 0.95, compute from
    `profile`), per bandwidth and seed: the goodput method's modelled time to the best fixed batch's final perplexity
    over that batch's modelled wall time. The replay keeps the batches the goodput rule chose on the machine the runs
    measured (it does not choose again for the modelled link) and charges merges as float32 point-to-point transfers
    (more than compact merges send): both make the goodput method's modelled time an upper bound."""
    root, out = results["folder"], []
    for bandwidth in bandwidths:
        link = Link(bandwidth, 1e-4, 0.95)
        for seed in results["seeds"]:
            finals = {}
            for name in (*FIXED, method):
                seed_results = results["methods"].get(name, {}).get("seed_results", {})
                run = seed_results.get(str(seed), seed_results.get(seed))
                if run and "final_eval_ppl" in run:
                    finals[name] = run["final_eval_ppl"]
            fixed = [name for name in FIXED if name in finals]
            if method not in finals or not fixed:
                continue
            best = min(fixed, key=finals.get)
            walls = {
                name: replay_folder(os.path.join(root, name, f"seed-{seed}"), profile, link)
                for name in (*fixed, method)
            }
            tokens = tokens_to_target(walls[method]["curve"], finals[best])
            reached = None if tokens is None else seconds_at_tokens(walls[method], tokens)
            best_wall = walls[best]["total"]["wall_seconds"]
            out.append(
                {
                    "bandwidth_bits_per_second": bandwidth,
                    "seed": seed,
                    "best_fixed": best,
                    "target_ppl": finals[best],
                    "modelled_wall_seconds": {name: r["total"]["wall_seconds"] for name, r in walls.items()},
                    "modelled_comm_seconds": {name: r["total"]["comm_seconds"] for name, r in walls.items()},
                    "goodput_seconds_to_target": reached,
                    "ratio": None if reached is None else reached / best_wall,
                }
            )
    return out


def profile_from_args(args: argparse.Namespace) -> DeviceProfile:
    """`--replay_bandwidths`' device profile from `--step_seconds`, `--optimizer_seconds` and `--outer_seconds`."""
    if not args.step_seconds:
        raise SystemExit("--replay_bandwidths needs --step_seconds")
    points = {int(b): float(t) for b, _, t in (item.partition("=") for item in args.step_seconds.split(","))}
    return DeviceProfile(points, args.optimizer_seconds, outer_seconds=args.outer_seconds, source="command line")


def replay_report(rows: list[dict]) -> str:
    """The replayed ratios per link (mean ± sd over seeds) and each seed's modelled times."""
    shown = [
        {
            "link Mbit/s": r["bandwidth_bits_per_second"] / 1e6,
            "seed": r["seed"],
            "best fixed": r["best_fixed"],
            "its final ppl": r["target_ppl"],
            **{f"{n} s": round(t, 1) for n, t in r["modelled_wall_seconds"].items()},
            "goodput s to it": r["goodput_seconds_to_target"],
            "ratio": r["ratio"],
        }
        for r in rows
    ]
    summary = [
        {
            "link Mbit/s": bandwidth / 1e6,
            "ratio (mean ± sd over seeds)": mean_sd(
                [r["ratio"] for r in rows if r["bandwidth_bits_per_second"] == bandwidth]
            ),
        }
        for bandwidth in sorted({r["bandwidth_bits_per_second"] for r in rows})
    ]
    if not shown:
        return "(nothing replayed)"
    columns = sorted({k for row in shown for k in row}, key=lambda k: list(shown[0]).index(k) if k in shown[0] else 99)
    return "Replayed (wall-clock model):\n\n" + table(shown, columns) + "\n\n" + table(summary, list(summary[0]))
