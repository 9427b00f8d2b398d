"""`python -m recipes.benchmarks.goodput_report --links ... --convergence ...`: the figures of every goodput method
that ran, the paired ratios, `results.json`, `table.md` and `goodput.png`."""

import argparse
import json
import os

from recipes.benchmarks.goodput_report.figures import GOODPUT, NORM, VARIANTS
from recipes.benchmarks.goodput_report.report import method_figures, paired_report, paired_vs_norm, plot
from recipes.benchmarks.toolkit.results import write_json, write_report


__all__ = ["main", "parse_args"]

DESCRIPTION = "Issue 25's targets from the results of `links` and `convergence`: does the goodput rule pay for itself?"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=DESCRIPTION)
    parser.add_argument("--links", nargs="*", default=[], help="links results.json, one per seed")
    parser.add_argument("--convergence", default=None, help="convergence results.json")
    parser.add_argument("--output_dir", default="outputs/benchmarks/goodput")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> dict:
    """Every goodput method that ran: its figures, targets and report; `results.json`, `goodput.png`, `table.md`."""
    args = parse_args(argv)
    links_results = []
    for path in args.links:
        with open(path, encoding="utf-8") as f:
            links_results.append((path, json.load(f)))
    convergence_results = None
    if args.convergence:
        with open(args.convergence, encoding="utf-8") as f:
            convergence_results = json.load(f)
        convergence_results["folder"] = os.path.dirname(os.path.abspath(args.convergence))
    out, sections = {}, []
    for method in VARIANTS:
        ran = any(method in runs for _, r in links_results for runs in r["bandwidths"].values())
        ran = ran or (convergence_results is not None and method in convergence_results["methods"])
        if not ran:
            continue
        figures = method_figures(method, links_results, convergence_results)
        out[method] = figures
        sections.append(f"### {method}\n\n" + figures["report"])
    if GOODPUT in out and NORM in out:
        out[GOODPUT]["vs_norm_test"] = paired_vs_norm(out[GOODPUT]["rows"], out[NORM]["rows"])
        sections.append(
            f"### {GOODPUT} / {NORM}, final ppl paired by seed\n\n" + paired_report(out[GOODPUT]["vs_norm_test"])
        )
    report = "\n\n".join(sections) if sections else "(no goodput run)"
    os.makedirs(args.output_dir, exist_ok=True)
    write_json(os.path.join(args.output_dir, "results.json"), out)
    if out:
        print(f"wrote {plot(out, os.path.join(args.output_dir, 'goodput.png'))}")
    write_report(args.output_dir, report)
    return out
