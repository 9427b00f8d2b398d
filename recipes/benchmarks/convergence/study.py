"""`convergence --clock virtual --selection_seeds N`: the batch rule against the fixed batch a user would have picked
with a short sweep, with no winner's curse (issue 51).

1. **Selection.** On N selection seeds (`--selection_seed`, +1, ...) every fixed batch of `--methods` runs; per
   bandwidth the best one is the lowest geometric mean perplexity at the budget over those seeds: the batch a short
   sweep would have picked.
2. **Comparison.** On the other seeds (`--set seed=S --seeds K`) that batch runs again, beside every method without a
   fixed batch (the rule with and without its startup profile, ...). Per bandwidth and seed, the target is the best
   fixed batch's perplexity at the budget; a method's time to it over the fixed batch's own time (its first reach),
   paired by seed: their geometric mean and 95 % interval over the seeds that reached it, the seeds that never did
   (within the method's 1.25 × budget) *counted apart*, never folded into the mean, and a two-sided sign test over
   every seed (faster or slower; a seed that never reached counts as slower).
3. **A user's guess** (`--guess METHOD`, run on the selection seeds too): against every fixed batch of the sweep
   in turn, the method's time to that batch's perplexity at the budget over the batch's own time (paired by seed
   and batch): what the method gains over a batch picked without a sweep.

Every time is in virtual seconds on the run's own clock (`toolkit/clock/virtual_clock.py`): a run that stops late (a merge
that ends its last round past the budget) is compared on its curve, never on its final line.
"""

import json
import os

from adloco_hf.inspection import PROFILE_FILE
from recipes.benchmarks.convergence.seeds import mean_curve, mean_sd
from recipes.benchmarks.convergence.virtual import link_curve
from recipes.benchmarks.convergence.virtual_runs import add_noise_scales, request_summary, run_folder, run_summary
from recipes.benchmarks.toolkit.figures import pyplot, save_figure
from recipes.benchmarks.toolkit.methods import METHODS
from recipes.benchmarks.toolkit.results import table
from recipes.benchmarks.toolkit.runs import run_method
from recipes.benchmarks.toolkit.settings import method_spec, on_links, reads_clock
from recipes.benchmarks.toolkit.stats import first_reach, interpolate_curve, paired_interval, ratio, sign_test


__all__ = ["compare_study", "format_study", "plot_study", "ppl_at", "run_study", "study_targets"]

# Issue 51's targets: the time ratio to the best fixed batch (geometric mean at most `mean`, the 95 % interval's upper
# end at most `high`, at most `never` seeds that never reach it) and against a user's guess (mean at most `guess`).
TARGETS = {"mean": 1.0, "high": 1.10, "never": 1, "guess": 0.75}


def _fixed(names: list[str]) -> list[str]:
    return [n for n in names if "batch_size" in METHODS[n]]


def _run(name: str, seed: int, labels: list[str], settings: dict, output_dir: str, reuse: bool, progress) -> dict:
    """One method on one seed: {label: (result, link index)}; a method whose decisions read the clock runs once per
    bandwidth, any other once for all of them."""
    spec = method_spec(name, settings, output_dir, seed=seed)
    if not reads_clock(spec):
        progress(f"{name}, seed {seed}, every bandwidth")
        result = run_method(name, spec, reuse)
        return {label: (result, index) for index, label in enumerate(labels)}
    out = {}
    for index, label in enumerate(labels):
        progress(f"{name}, seed {seed}, {label}")
        out[label] = (run_method(name, on_links(spec, [index], os.path.join(spec["output_dir"], label)), reuse), 0)
    return out


def run_study(args, settings: dict, output_dir: str, seeds: list[int], names: list[str], progress) -> dict:
    """The selection runs, the best fixed batch per bandwidth, then the comparison runs (module docstring).

    Returns {"selection": {method: {label: {seed: (result, index)}}}, "comparison": {...}, "best": {label: name}}.
    """
    labels, budgets = settings["clock"]["labels"], settings["clock"]["budget_seconds"]
    fixed, others = _fixed(names), [n for n in names if n not in _fixed(names)]
    selection_seeds = [args.selection_seed + i for i in range(args.selection_seeds)]
    overlap = sorted(set(selection_seeds) & set(seeds))
    if overlap:
        raise SystemExit(f"seeds {overlap} are both selection and comparison seeds: choose disjoint ones")
    selection: dict = {}
    on_selection = fixed + ([args.guess] if args.guess else [])
    for seed in selection_seeds:
        for name in on_selection:
            for label, run in _run(name, seed, labels, settings, output_dir, args.reuse, progress).items():
                selection.setdefault(name, {}).setdefault(label, {})[seed] = run
    best = {}
    for index, label in enumerate(labels):
        curves = {n: {s: link_curve(r, i, None) for s, (r, i) in selection[n][label].items() if "error" not in r}
                  for n in fixed}  # fmt: skip
        best[label] = best_fixed(curves, budgets[index])
    comparison: dict = {}
    for seed in seeds:
        for name in [n for n in fixed if n in best.values()] + others:
            for label, run in _run(name, seed, labels, settings, output_dir, args.reuse, progress).items():
                comparison.setdefault(name, {}).setdefault(label, {})[seed] = run
    return {"selection": selection, "comparison": comparison, "best": best, "selection_seeds": selection_seeds}


def ppl_at(points: list[dict], seconds: float) -> float | None:
    """A run's eval perplexity at `seconds` on its curve (log-linear between evaluations), None outside it."""
    return interpolate_curve([[p["seconds"], p["eval_ppl"]] for p in points if p["seconds"] is not None], seconds)


def _reach(points: list[dict], target: float) -> float | None:
    found = first_reach(points, target, {"seconds": "seconds"})
    return None if found is None else found["seconds"]


def best_fixed(curves: dict[str, dict[int, list[dict]]], budget: float) -> str | None:
    """The fixed batch of the lowest geometric mean perplexity at `budget` over the selection seeds (every seed must
    have reached the budget)."""
    at_budget = {n: [ppl_at(p, budget) for p in by_seed.values()] for n, by_seed in curves.items()}
    ranked = [n for n, values in at_budget.items() if values and all(v is not None for v in values)]
    return min(ranked, key=lambda n: mean_sd(at_budget[n], geometric=True)[0]) if ranked else None


def time_ratios(curves: dict[int, list[dict]], reference: dict[int, list[dict]], budget: float) -> dict:
    """A method's time to the reference's perplexity at `budget`, over the reference's own time to it, per seed
    (both runs of the seed); `never`: the seeds where the method never reached it within its run."""
    ratios, never = {}, []
    for seed, points in curves.items():
        if seed not in reference:
            continue
        target = ppl_at(reference[seed], budget)
        if target is not None:
            target *= 1 + 1e-9  # the log-linear interpolation's round-off: the reference reaches its own value
        own = None if target is None else _reach(reference[seed], target)
        if own is None:
            continue
        reached = _reach(points, target)
        if reached is None:
            never.append(seed)
        else:
            ratios[seed] = ratio(reached, own)
    return {"seeds": ratios, "never": sorted(never)}


def summarise(ratios: dict) -> dict:
    """The geometric mean and interval over the seeds that reached, the ones that never did, and the sign test."""
    values = [r for r in ratios["seeds"].values() if r is not None]
    faster = sum(1 for r in values if r < 1)
    slower = sum(1 for r in values if r > 1) + len(ratios["never"])
    return {
        **ratios,
        "interval": paired_interval(values),
        "faster": faster,
        "slower": slower,
        "sign_test_p": sign_test(faster, faster + slower),
    }


def compare_study(study_curves: dict, budget: float, best: str | None, guess: str | None) -> dict:
    """One bandwidth: the selection table, and per method the time ratios against the best fixed batch on the
    comparison seeds and (`guess`) against every fixed batch on the selection seeds."""
    selection, comparison = study_curves["selection"], study_curves["comparison"]
    fixed = [n for n in selection if "batch_size" in METHODS[n]]
    out = {"budget_seconds": budget, "best_fixed": best, "selection": {}, "methods": {}}
    for name in fixed:
        values = [ppl_at(p, budget) for p in selection[name].values()]
        mean, sd = mean_sd([v for v in values if v is not None], geometric=True)
        out["selection"][name] = {"ppl_at_budget": mean, "ppl_at_budget_sd": sd, "seeds": len(values)}
    if best is None or best not in comparison:
        return out
    reference = comparison[best]
    for name, by_seed in comparison.items():
        entry = {"ppl_at_budget": mean_sd([ppl_at(p, budget) for p in by_seed.values()], geometric=True)[0]}
        paired = [ratio(ppl_at(p, budget), ppl_at(reference[s], budget)) for s, p in by_seed.items() if s in reference]
        entry["ppl_vs_best_fixed"] = paired_interval([p for p in paired if p is not None])
        if name != best:
            entry["time_vs_best_fixed"] = summarise(time_ratios(by_seed, reference, budget))
        out["methods"][name] = entry
    if guess is not None and guess in selection:
        pairs = {"seeds": {}, "never": []}
        for name in fixed:
            one = time_ratios(selection[guess], selection[name], budget)
            pairs["seeds"].update({f"{name}/{s}": r for s, r in one["seeds"].items()})
            pairs["never"] += [f"{name}/{s}" for s in one["never"]]
        out["guess"] = {"method": guess, **summarise(pairs)}
    return out


def study_curves(runs: dict, label: str, initial_ppl: dict[int, float]) -> dict:
    """{"selection"|"comparison": {method: {seed: points}}} of one bandwidth, from `run_study`'s runs, each curve from
    its seed's initial model (0 s)."""
    out = {}
    for part in ("selection", "comparison"):
        out[part] = {
            name: {
                s: link_curve(r, i, initial_ppl.get(s)) for s, (r, i) in by_label[label].items() if "error" not in r
            }
            for name, by_label in runs[part].items()
        }
    return out


def study_targets(comparisons: dict, methods: list[str], bounds: dict | None = None) -> dict:
    """Issue 51's targets for each method without a fixed batch, per bandwidth."""
    bounds = {**TARGETS, **(bounds or {})}
    out = {}
    for label, comparison in comparisons.items():
        for name in methods:
            entry = comparison["methods"].get(name, {}).get("time_vs_best_fixed")
            if entry is None:
                continue
            interval = entry["interval"]
            holds = (
                interval["mean"] is not None
                and interval["mean"] <= bounds["mean"]
                and interval["high"] is not None
                and interval["high"] <= bounds["high"]
                and len(entry["never"]) <= bounds["never"]
            )
            out[f"{name} / {comparison['best_fixed']} at {label}"] = {
                "value": interval["mean"],
                "interval": [interval["low"], interval["high"]],
                "never": len(entry["never"]),
                "bound": {k: bounds[k] for k in ("mean", "high", "never")},
                "holds": holds,
            }
        guess = comparison.get("guess")
        if guess is not None:
            mean = guess["interval"]["mean"]
            out[f"{guess['method']} / a guessed fixed batch at {label}"] = {
                "value": mean,
                "interval": [guess["interval"]["low"], guess["interval"]["high"]],
                "never": len(guess["never"]),
                "bound": {"mean": bounds["guess"]},
                "holds": mean is not None and mean <= bounds["guess"],
            }
    return out


def profile_costs(runs: dict, settings: dict, output_dir: str) -> dict:
    """Per bandwidth, what each comparison run's startup profile cost (its `adloco_startup_profile.json`, in virtual
    seconds) against 100 of the run's own rounds (its mean virtual seconds a round): issue 51's ≤ 2 % target."""
    out = {}
    for label in settings["clock"]["labels"]:
        costs = []
        for name, by_label in runs["comparison"].items():
            for seed, (result, link) in by_label[label].items():
                path = os.path.join(run_folder(name, label, seed, settings, output_dir), PROFILE_FILE)
                ends = result.get("virtual_round_ends") or []
                if not os.path.exists(path) or not ends:
                    continue
                with open(path, encoding="utf-8") as f:
                    seconds = json.load(f)["seconds"]
                per_round = (ends[-1][1 + link] - seconds) / len(ends)  # one entry a round: [global step, seconds]
                costs.append({"method": name, "seed": seed, "profile_seconds": seconds, "round_seconds": per_round,
                              "share_of_100_rounds": seconds / (100 * per_round)})  # fmt: skip
        out[label] = costs
    return out


def study_results(
    runs: dict, settings: dict, initial_ppl: dict, guess: str | None, target_mean: float, output_dir: str
) -> dict:
    """The comparison per bandwidth, the curves it read, every run's summary, the startup profiles' cost and the
    targets."""
    clock = settings["clock"]
    comparisons, curves, summaries = {}, {}, {}
    for index, label in enumerate(clock["labels"]):
        curves[label] = study_curves(runs, label, initial_ppl)
        comparisons[label] = compare_study(curves[label], clock["budget_seconds"][index], runs["best"][label], guess)
        for part in ("selection", "comparison"):
            for name, by_label in runs[part].items():
                summaries.setdefault(part, {}).setdefault(name, {})[label] = {
                    s: run_summary(r, i) for s, (r, i) in by_label[label].items() if "error" not in r
                }
    methods = [n for n in runs["comparison"] if "batch_size" not in METHODS[n]]
    add_noise_scales({n: summaries["comparison"][n] for n in methods}, settings, output_dir)
    return {
        "study": comparisons,
        "study_curves": curves,
        "study_runs": summaries,
        "selection_seeds": runs["selection_seeds"],
        "study_targets": study_targets(comparisons, methods, {"mean": target_mean}),
        "startup_profile_costs": profile_costs(runs, settings, output_dir),
        "clock": {k: v for k, v in clock.items() if k != "profile"},
        "device_profile": clock["profile"],
    }


def _interval(summary: dict | None) -> str | None:
    if summary is None:
        return None
    interval = summary["interval"]
    if interval["mean"] is None:
        return f"- ({len(summary['never'])} never)"
    text = f"{interval['mean']:.3f}"
    if interval["low"] is not None:
        text += f" [{interval['low']:.3f}, {interval['high']:.3f}]"
    return text


def format_study(results: dict) -> str:
    """Per bandwidth: the sweep on the selection seeds, then every method against its best fixed batch."""
    lines = []
    for label, comparison in results["study"].items():
        best = comparison["best_fixed"]
        lines.append(f"\n{label}: budget {comparison['budget_seconds']:g} virtual s")
        rows = [
            {"fixed batch": name, "seeds": e["seeds"], "ppl at budget": _ppl(e["ppl_at_budget"], e["ppl_at_budget_sd"]),
             "chosen": "best" if name == best else ""}
            for name, e in comparison["selection"].items()
        ]  # fmt: skip
        lines.append(f"\nselection seeds {results['selection_seeds']}:\n")
        lines.append(table(rows, ["fixed batch", "seeds", "ppl at budget", "chosen"]))
        rows = []
        for name, entry in comparison["methods"].items():
            time = entry.get("time_vs_best_fixed")
            rows.append(
                {
                    "method": name,
                    "ppl at budget": _ppl(entry["ppl_at_budget"], None),
                    "ppl / best fixed [95 %]": _ppl_ratio(entry["ppl_vs_best_fixed"]),
                    "time to its ppl / its time [95 %]": _interval(time),
                    "reached": None if time is None else f"{len(time['seeds'])} of {len(time['seeds']) + len(time['never'])}",
                    "faster:slower (sign test p)": None if time is None
                    else f"{time['faster']}:{time['slower']} ({time['sign_test_p']:.3f})",
                }
            )  # fmt: skip
        lines.append(f"\ncomparison seeds, against {best} (chosen on the selection seeds):\n")
        columns = ["method", "ppl at budget", "ppl / best fixed [95 %]", "time to its ppl / its time [95 %]",
                   "reached", "faster:slower (sign test p)"]  # fmt: skip
        lines.append(table(rows, columns))
        guess = comparison.get("guess")
        if guess is not None:
            total = len(guess["seeds"]) + len(guess["never"])
            lines.append(
                f"\n{guess['method']} against every fixed batch of the sweep, selection seeds (time to the batch's ppl "
                f"at the budget / its time): {_interval(guess)}, {len(guess['seeds'])} of {total} pairs reached, "
                f"faster:slower {guess['faster']}:{guess['slower']} (sign test p {guess['sign_test_p']:.3f})"
            )
        for name, by_label in results.get("study_runs", {}).get("comparison", {}).items():
            if "batch_size" not in METHODS[name] and (asked := request_summary(by_label.get(label, {}))):
                lines.append(
                    f"{name} requests per worker ({asked['seeds']} seeds): first round "
                    f"{asked['first'][0]:g}-{asked['first'][1]:g}, mean of the first {asked['first_rounds']} "
                    f"{asked['mean_first'][0]:.0f}-{asked['mean_first'][1]:.0f}, last {asked['last'][0]:g}-"
                    f"{asked['last'][1]:g}; noise scale (each run's median over its rounds) "
                    + ("-" if not (n := asked["noise_scale"]) else f"{n[0]:.0f}-{n[2]:.0f}, median {n[1]:.1f}")
                )
    for label, costs in results.get("startup_profile_costs", {}).items():
        if costs:
            shares = [c["share_of_100_rounds"] for c in costs]
            lines.append(
                f"\n{label}: the startup profile cost {min(c['profile_seconds'] for c in costs):.3g}-"
                f"{max(c['profile_seconds'] for c in costs):.3g} virtual s, {100 * min(shares):.2f}-{100 * max(shares):.2f} "
                f"% of 100 of the run's own rounds ({len(costs)} runs)"
            )
    for name, target in results.get("study_targets", {}).items():
        verdict = {True: "holds", False: "MISSED"}[target["holds"]]
        value = "-" if target["value"] is None else f"{target['value']:.3f}"
        lines.append(f"target {name}: {value} {target['interval']}, never {target['never']}, bound {target['bound']} "
                     f"({verdict})")  # fmt: skip
    lines.append(
        "\nTimes in virtual seconds, each run on its own clock. Ratios paired by seed: geometric mean [95 % interval, "
        "Student's t on the logs] over the seeds that reached the target; a seed that never did (within 1.25 x the "
        "budget) is counted apart and as slower in the two-sided sign test."
    )
    return "\n".join(lines)


def _ppl(mean: float | None, sd: float | None) -> str | None:
    if mean is None:
        return None
    return f"{mean:.1f}" + ("" if sd is None else f" ± {sd:.1f}")


def _ppl_ratio(interval: dict) -> str | None:
    if interval["mean"] is None:
        return None
    text = f"{interval['mean']:.3f}"
    return text if interval["low"] is None else f"{text} [{interval['low']:.3f}, {interval['high']:.3f}]"


def plot_study(results: dict, path: str) -> str:
    """Per bandwidth: each comparison method's mean curve (geometric over the comparison seeds) against virtual
    seconds, the fixed batches' selection curves thin and dotted."""
    plt = pyplot()
    labels = list(results["study"])
    fig, axes = plt.subplots(1, len(labels), figsize=(5.5 * len(labels), 4.2), squeeze=False)
    for ax, label in zip(axes[0], labels):
        curves, finite = results["study_curves"][label], []
        for part, style, width in (("selection", ":", 0.8), ("comparison", None, 1.6)):
            for name, by_seed in curves[part].items():
                if part == "selection" and "batch_size" not in METHODS[name]:
                    continue
                mean = mean_curve([[[p["seconds"], p["eval_ppl"]] for p in pts if p["seconds"] is not None]
                                   for pts in by_seed.values()])  # fmt: skip
                if not mean:
                    continue
                finite += [y for _, y in mean]
                dashed = "--" if "batch_size" in METHODS[name] else "-"
                ax.plot([x for x, _ in mean], [y for _, y in mean], style or dashed, lw=width,
                        label=f"{name} ({part})")  # fmt: skip
        ax.axvline(results["study"][label]["budget_seconds"], color="grey", lw=0.8)
        ax.set_yscale("log")
        if finite:
            ax.set_ylim(min(finite) * 0.95, min(max(finite), 4 * min(finite)))
        ax.set_xlabel(f"virtual seconds ({label})")
        ax.set_ylabel("eval perplexity")
        ax.set_title(f"{label}: best fixed {results['study'][label]['best_fixed']}")
        ax.legend(fontsize=6)
    return save_figure(fig, path)
