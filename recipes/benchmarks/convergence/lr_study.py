"""Issue 51's learning-rate comparison, read from a finished `convergence --clock virtual --selection_seeds` study:
each method's perplexity at the budget over a reference method's (paired by seed), and its time to the best fixed
batch's perplexity at the budget over that batch's own time (`study.time_ratios`).

    python -m recipes.benchmarks.convergence.lr_study --study_dir outputs/benchmarks/study-h25 \
        --bandwidth 10gbit 1gbit --budget_virtual_seconds 12 56 --best diloco_b16 diloco_b64 --seeds 42 43 44 \
        --reference rule_startup --methods rule_startup_lr_held rule_startup_sqrt_adam \
        --output docs/results/batch_rule_lr.json

It launches nothing: the runs are the study's (`{study_dir}/{method}/seed-{S}/{bandwidth}/result.json` for a method
that reads the clock, `{study_dir}/{fixed}/seed-{S}/result.json` for a fixed batch, its link by position); `--best`
and `--methods` may name either.
"""

import argparse
import json
import math
import os

from recipes.benchmarks.convergence.study import ppl_at, summarise, time_ratios
from recipes.benchmarks.convergence.virtual import link_curve


__all__ = ["compare_schedules", "main"]


def _load(path: str) -> dict:
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def _curve(study_dir: str, name: str, seed: int, label: str, index: int) -> list[dict]:
    """A run's eval curve on link `label`: its own folder's for a method that reads the clock, else the one run
    priced on every link (`index`: the link's position in the study)."""
    own = os.path.join(study_dir, name, f"seed-{seed}", label, "result.json")
    if os.path.exists(own):
        return link_curve(_load(own), 0, None)
    return link_curve(_load(os.path.join(study_dir, name, f"seed-{seed}", "result.json")), index, None)


def _geometric(values: list[float]) -> float | None:
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else None


def compare_schedules(curves: dict, reference: str, best: str, budget: float) -> dict:
    """`curves`: {method: {seed: points}} of one link, `best` among them. Per method but the reference and the best:
    the perplexity at `budget` over the reference's, per seed and as a geometric mean, and the time ratios to the best
    fixed batch (with the reference's too)."""
    out = {}
    for name, by_seed in curves.items():
        if name == best:
            continue
        entry = {"time_vs_best_fixed": summarise(time_ratios(by_seed, curves[best], budget))}
        if name != reference:
            ratios = {s: ppl_at(p, budget) / ppl_at(curves[reference][s], budget) for s, p in by_seed.items()}
            entry["ppl_vs_reference"] = {"seeds": ratios, "geometric_mean": _geometric(list(ratios.values()))}
        out[name] = entry
    return out


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--study_dir", required=True)
    parser.add_argument("--bandwidth", nargs="+", required=True, help="the study's labels, in its order")
    parser.add_argument("--budget_virtual_seconds", nargs="+", type=float, required=True)
    parser.add_argument("--best", nargs="+", required=True, help="the best fixed batch per bandwidth")
    parser.add_argument("--seeds", nargs="+", type=int, required=True)
    parser.add_argument("--reference", required=True)
    parser.add_argument("--methods", nargs="+", required=True)
    parser.add_argument("--output", required=True)
    args = parser.parse_args(argv)
    if not len(args.bandwidth) == len(args.budget_virtual_seconds) == len(args.best):
        parser.error("--bandwidth, --budget_virtual_seconds and --best take one value per link each")
    return args


def main(argv=None) -> dict:
    args = parse_args(argv)
    results = {"study_dir": args.study_dir, "seeds": args.seeds, "reference": args.reference, "links": {}}
    for index, (label, budget, best) in enumerate(zip(args.bandwidth, args.budget_virtual_seconds, args.best)):
        curves = {
            name: {s: _curve(args.study_dir, name, s, label, index) for s in args.seeds}
            for name in [best, args.reference, *args.methods]
        }
        results["links"][label] = {"budget_seconds": budget, "best_fixed": best,
                                   "methods": compare_schedules(curves, args.reference, best, budget)}  # fmt: skip
        for name, entry in results["links"][label]["methods"].items():
            time = entry["time_vs_best_fixed"]
            ppl = entry.get("ppl_vs_reference")
            print(f"{label} {name}: time / {best}'s {time['interval']['mean']} over {sorted(time['seeds'])} "
                  f"(never {time['never']})" + ("" if ppl is None else f", ppl / {args.reference}'s "
                  f"{ppl['geometric_mean']:.3f} {[round(v, 3) for v in ppl['seeds'].values()]}"))  # fmt: skip
    os.makedirs(os.path.dirname(os.path.abspath(args.output)), exist_ok=True)
    with open(args.output, "w", encoding="utf-8") as f:
        json.dump(results, f, indent=1)
    print(f"wrote {args.output}")
    return results


if __name__ == "__main__":
    main()
