"""`--clock virtual`: the methods compared in virtual seconds, over each bandwidth of the run, paired by seed.

Every run's evaluations carry the virtual seconds at which they happened on each of its clock's links
(`toolkit/clock/virtual_clock.py`); a method whose decisions read the clock ran once per bandwidth, any other once for
all of them. Per bandwidth and seed:

- **ppl at the budget**: the eval curve (log-perplexity linear in virtual seconds) at the budget `V` of that
  bandwidth, which every fixed-batch run reaches (it stops at the end of the first round after it);
- **the best fixed batch**: of the methods with a fixed batch (`diloco_b4`, ...), the one whose geometric mean of
  ppl at the budget over the seeds is lowest: the batch a user who knew the regime would pick (chosen once per
  bandwidth, not per seed, which would favour the fixed batches with the luckiest of four draws);
- **time to target**: the virtual seconds at which a run's curve first reaches that fixed batch's ppl at the
  budget in the same seed, over the seconds at which the fixed batch itself first reached it (`stats.first_reach`);
  a run that never does within its seconds counts with its last seconds instead (a lower bound: `never`);
- ratios paired by seed, their geometric mean and 95 % interval (Student's t on the logs, `stats.paired_interval`),
  against the best fixed batch and against the norm test (`adloco`).
"""

from recipes.benchmarks.convergence.seeds import mean_curve, mean_sd
from recipes.benchmarks.toolkit.figures import pyplot, save_figure
from recipes.benchmarks.toolkit.methods import METHODS
from recipes.benchmarks.toolkit.results import table
from recipes.benchmarks.toolkit.stats import first_reach, interpolate_curve, paired_interval, ratio


__all__ = [
    "NORM_TEST",
    "compare_virtual",
    "format_virtual",
    "link_curve",
    "plot_virtual",
    "virtual_targets",
]

NORM_TEST = "adloco"  # the norm test's method, the second reference of the ratios
# Issue 39's targets for the default AdLoCo, by bandwidth (bits/s): time to the best fixed batch's ppl over its
# time, the mean at most `mean`, and the 95 % interval's upper end below `high` where given.
TARGETS = {100e6: {"mean": 0.8, "high": 1.0}, 10e9: {"mean": 1.0, "high": None}}


def link_curve(result: dict, index: int, initial_ppl: float | None) -> list[dict]:
    """A run's evaluations as points `{"eval_ppl", "seconds", "tokens"}` in virtual seconds on its clock's link
    `index`, from the initial model's (0 s, 0 tokens)."""
    points = [] if initial_ppl is None else [{"eval_ppl": initial_ppl, "seconds": 0.0, "tokens": 0}]
    for point in result.get("evals", []):
        seconds = (point.get("virtual_seconds") or [None] * (index + 1))[index]
        points.append({"eval_ppl": point["eval_ppl"], "seconds": seconds, "tokens": point["tokens"]})
    return points


def _at(points: list[dict], seconds: float) -> float | None:
    return interpolate_curve([[p["seconds"], p["eval_ppl"]] for p in points], seconds)


def _reach(points: list[dict], target: float) -> float | None:
    found = first_reach(points, target, {"seconds": "seconds"})
    return None if found is None else found["seconds"]


def compare_virtual(curves: dict[str, dict[int, list[dict]]], budget: float, fixed: list[str]) -> dict:
    """One bandwidth: `curves` {method: {seed: points}} (`link_curve`), its budget in virtual seconds and the fixed
    methods among them. Returns the best fixed batch, its ppl per seed, and per method the ppl at the budget and the
    ratios paired by seed (module docstring)."""
    at_budget = {name: {s: _at(p, budget) for s, p in by_seed.items()} for name, by_seed in curves.items()}
    ranked = [n for n in fixed if at_budget.get(n) and all(v is not None for v in at_budget[n].values())]
    best = min(ranked, key=lambda n: mean_sd(list(at_budget[n].values()), geometric=True)[0]) if ranked else None
    out = {"budget_seconds": budget, "best_fixed": best, "methods": {}}
    if best is None:
        return out
    targets = at_budget[best]
    reference_time = {s: _reach(curves[best][s], t) for s, t in targets.items()}
    out["targets"] = targets
    out["reference_seconds"] = reference_time
    for name, by_seed in curves.items():
        entry = {"ppl_at_budget_seeds": at_budget[name]}
        entry["ppl_at_budget"], entry["ppl_at_budget_sd"] = mean_sd(list(at_budget[name].values()), geometric=True)
        times, never = {}, []
        for seed, points in by_seed.items():
            if seed not in targets or reference_time.get(seed) is None:
                continue
            reached = _reach(points, targets[seed])
            if reached is None:  # never within its run: its last seconds bound the time from below
                never.append(seed)
                reached = max(p["seconds"] for p in points if p["seconds"] is not None)
            times[seed] = ratio(reached, reference_time[seed])
        entry["time_ratio_seeds"] = times
        entry["time_ratio_never"] = never
        entry["time_ratio"] = paired_interval(list(times.values()))
        for ref, key in ((best, "ppl_vs_best_fixed"), (NORM_TEST, "ppl_vs_norm_test")):
            if ref in at_budget and ref != name:
                paired = [ratio(v, at_budget[ref].get(s)) for s, v in at_budget[name].items()]
                entry[key] = paired_interval([p for p in paired if p is not None])
        out["methods"][name] = entry
    return out


def virtual_targets(comparisons: dict[str, dict], bandwidths: dict[str, float], method: str) -> dict[str, dict]:
    """Issue 39's targets for `method` (the default AdLoCo) at the bandwidths that have one (`TARGETS`)."""
    out = {}
    for label, comparison in comparisons.items():
        bound = TARGETS.get(bandwidths[label])
        entry = comparison.get("methods", {}).get(method)
        if bound is None or entry is None:
            continue
        interval = entry["time_ratio"]
        holds = interval["mean"] is not None and interval["mean"] <= bound["mean"] and not entry["time_ratio_never"]
        if bound["high"] is not None:
            holds = holds and interval["high"] is not None and interval["high"] < bound["high"]
        out[f"{method} time to {comparison['best_fixed']}'s ppl / its time at {label}"] = {
            "value": interval["mean"],
            "interval": [interval["low"], interval["high"]],
            "bound": bound,
            "never": entry["time_ratio_never"],
            "holds": holds,
        }
    return out


def _interval(interval: dict | None, never: list | None = None) -> str | None:
    if interval is None or interval["mean"] is None:
        return None
    text = f"{interval['mean']:.3f}"
    if interval["low"] is not None:
        text += f" [{interval['low']:.3f}, {interval['high']:.3f}]"
    if never:
        text = f">= {text} ({len(never)} never)"
    return text


def format_virtual(results: dict) -> str:
    """The tables of a virtual run: one per bandwidth (ppl at the budget, the ratios with their intervals)."""
    lines = []
    for label, comparison in results["virtual"].items():
        best = comparison.get("best_fixed")
        lines.append(
            f"\n{label}: budget {comparison['budget_seconds']:g} virtual s, best fixed batch {best or '-'} "
            "(lowest geometric mean ppl at the budget)\n"
        )
        rows = []
        for name, entry in comparison.get("methods", {}).items():
            mean, sd = entry["ppl_at_budget"], entry["ppl_at_budget_sd"]
            rows.append(
                {
                    "method": name,
                    "seeds": len(entry["ppl_at_budget_seeds"]),
                    "ppl at budget": None if mean is None else f"{mean:.1f}" + ("" if sd is None else f" ± {sd:.1f}"),
                    "ppl / best fixed [95 %]": _interval(entry.get("ppl_vs_best_fixed")),
                    "ppl / norm test [95 %]": _interval(entry.get("ppl_vs_norm_test")),
                    "time to best fixed's ppl / its time [95 %]": _interval(
                        entry["time_ratio"], entry["time_ratio_never"]
                    ),
                }
            )
        columns = ["method", "seeds", "ppl at budget", "ppl / best fixed [95 %]", "ppl / norm test [95 %]",
                   "time to best fixed's ppl / its time [95 %]"]  # fmt: skip
        lines.append(table(rows, columns))
    for name, target in results.get("virtual_targets", {}).items():
        verdict = {True: "holds", False: "MISSED"}[target["holds"]]
        value = "-" if target["value"] is None else f"{target['value']:.3f}"
        bound = target["bound"]
        high = "" if bound["high"] is None else f", 95 % interval below {bound['high']}"
        lines.append(f"target {name} <= {bound['mean']}{high}: {value} {target['interval']} ({verdict})")
    lines.append(
        "\nppl at budget: geometric mean ± sd over seeds. Ratios paired by seed: geometric mean [95 % interval, "
        "Student's t on the logs]. '>= x (n never)': n seeds never reached the target within their run, counted at "
        "their last seconds (a lower bound)."
    )
    return "\n".join(lines)


def plot_virtual(results: dict, path: str) -> str:
    """Per bandwidth: each method's mean eval curve (geometric over seeds) against virtual seconds."""
    plt = pyplot()
    labels = list(results["virtual"])
    fig, axes = plt.subplots(1, len(labels), figsize=(5.5 * len(labels), 4.2), squeeze=False)
    for ax, label in zip(axes[0], labels):
        curves = results["virtual_curves"][label]
        for name, by_seed in curves.items():
            mean = mean_curve([[[p["seconds"], p["eval_ppl"]] for p in points] for points in by_seed.values()])
            style = "--" if "batch_size" in METHODS.get(name, {}) else "-"
            ax.plot([x for x, _ in mean], [y for _, y in mean], style, label=name)
        budget = results["virtual"][label]["budget_seconds"]
        ax.axvline(budget, color="grey", lw=0.8)
        ax.set_yscale("log")
        ax.set_xlabel(f"virtual seconds ({label})")
        ax.set_ylabel("eval perplexity")
        finite = [p["eval_ppl"] for c in curves.values() for pts in c.values() for p in pts if p["seconds"]]
        if finite:
            ax.set_ylim(min(finite) * 0.95, min(max(finite), 4 * min(finite)))
        ax.set_title(label)
        ax.legend(fontsize=7)
    return save_figure(fig, path)
