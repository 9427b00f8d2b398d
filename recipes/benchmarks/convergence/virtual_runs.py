"""`convergence --clock virtual`: the runs (a method whose decisions read the clock once per bandwidth, any other
once for all), then the comparison per bandwidth (`virtual.py`), its tables, JSON and plot."""

import json
import os
import statistics

from recipes.benchmarks.convergence.virtual import compare_virtual, link_curve, virtual_targets
from recipes.benchmarks.toolkit.methods import METHODS
from recipes.benchmarks.toolkit.runs import run_method
from recipes.benchmarks.toolkit.settings import method_spec, on_links, reads_clock


__all__ = [
    "TARGET_METHODS",
    "add_noise_scales",
    "request_summary",
    "run_folder",
    "run_summary",
    "run_virtual",
    "virtual_results",
]

# The methods issue 39's targets are checked on: the default AdLoCo (the norm test) and the goodput rule, the
# candidate default (`toolkit/methods.py`).
TARGET_METHODS = ("adloco", "adloco_goodput")


def run_virtual(args, settings: dict, output_dir: str, seeds: list[int], names: list[str], progress) -> dict:
    """Every method of `names` for every seed; returns {method: {label: {seed: (result, link index)}}}."""
    labels = settings["clock"]["labels"]
    runs: dict = {name: {label: {} for label in labels} for name in names}
    total = len(seeds) * sum(len(labels) if reads_clock(method_spec(n, settings, output_dir)) else 1 for n in names)
    done = 0
    for seed in seeds:
        for name in names:
            spec = method_spec(name, settings, output_dir, seed=seed)
            if reads_clock(spec):  # its decisions follow the link its clock prices: one run per bandwidth
                for index, label in enumerate(labels):
                    done += 1
                    progress(f"{name}, seed {seed}, {label}", done, total)
                    one = on_links(spec, [index], os.path.join(spec["output_dir"], label))
                    runs[name][label][seed] = (run_method(name, one, args.reuse), 0)
            else:
                done += 1
                progress(f"{name}, seed {seed}, every bandwidth", done, total)
                result = run_method(name, spec, args.reuse)
                for index, label in enumerate(labels):
                    runs[name][label][seed] = (result, index)
    return runs


def run_summary(result: dict, index: int) -> dict:
    """What a run's record keeps beside the curves: its end in tokens, rounds and virtual seconds, its last batch
    per worker, its CPU seconds (evaluations excluded) and launch seconds, and each round's request per worker (the
    mean over the instances: what the batch rule asked for)."""
    ends = result.get("virtual_round_ends") or []
    requests = [
        sum(line["requested_batch_sizes"].values()) / len(line["requested_batch_sizes"])
        for line in result.get("round_log") or []
        if line.get("requested_batch_sizes")
    ]
    return {
        "requests": [round(r, 2) for r in requests],
        "tokens": result.get("tokens"),
        "rounds": result.get("rounds"),
        "virtual_seconds": ends[-1][1 + index] if ends else None,
        "final_batch": result["batch_sizes"][-1][1] if result.get("batch_sizes") else None,
        "cpu_wall_seconds": result.get("wall_seconds"),
        "launch_seconds": result.get("launch_seconds"),
        "final_eval_ppl": result.get("final_eval_ppl"),
    }


def request_summary(summaries: dict, first_rounds: int = 6) -> dict | None:
    """A method's requests over its seeds ({seed: run_summary}): the range over the seeds of its first round's, of
    the mean of its first `first_rounds` and of its last round's (seeds that logged no request left out; None when
    none did), and its noise scales' range and median over the runs (`add_noise_scales`)."""
    paths = [s["requests"] for s in summaries.values() if s.get("requests")]
    if not paths:
        return None
    parts = {"first": [p[0] for p in paths], "mean_first": [sum(p[:first_rounds]) / len(p[:first_rounds]) for p in paths],
             "last": [p[-1] for p in paths]}  # fmt: skip
    noise = [s["noise_scale_median"] for s in summaries.values() if s.get("noise_scale_median") is not None]
    return {key: [min(v), max(v)] for key, v in parts.items()} | {
        "seeds": len(paths),
        "first_rounds": first_rounds,
        "noise_scale": [min(noise), statistics.median(noise), max(noise)] if noise else None,
    }


def run_folder(name: str, label: str, seed: int, settings: dict, output_dir: str) -> str:
    """Where one run of `name` on `seed` wrote its files: a folder per bandwidth for a method that reads the clock."""
    spec = method_spec(name, settings, output_dir, seed=seed)
    return os.path.join(spec["output_dir"], label) if reads_clock(spec) else spec["output_dir"]


def add_noise_scales(summaries: dict, settings: dict, output_dir: str) -> None:
    """Each batch rule's run record ({method: {label: {seed: run_summary}}}) gains `noise_scale_median`: the median
    over its rounds file's lines (every instance's; the studies run one) of the positive noise scales, the ones the
    rule reads; None where it logged none."""
    for name, by_label in summaries.items():
        for label, by_seed in by_label.items():
            for seed, summary in by_seed.items():
                path = os.path.join(run_folder(name, label, int(seed), settings, output_dir), "adloco_rounds.jsonl")
                values = []
                if os.path.exists(path):
                    with open(path, encoding="utf-8") as f:
                        values = [
                            v
                            for line in f
                            if line.strip() and (v := json.loads(line).get("noise_scale")) is not None and v > 0
                        ]
                summary["noise_scale_median"] = statistics.median(values) if values else None


def virtual_results(runs: dict, settings: dict, initial_ppl: dict[int, float]) -> dict:
    """The comparison per bandwidth, the curves it read, every run's summary and the targets."""
    clock = settings["clock"]
    budgets = clock.get("budget_seconds") or [None] * len(clock["labels"])
    fixed = [name for name in runs if "batch_size" in METHODS[name]]
    comparisons, curves, summaries, failed = {}, {}, {}, {}
    for index, label in enumerate(clock["labels"]):
        curves[label] = {}
        for name, by_label in runs.items():
            good = {s: (r, i) for s, (r, i) in by_label[label].items() if "error" not in r}
            failed.setdefault(name, {})[label] = sorted(set(by_label[label]) - set(good))
            curves[label][name] = {s: link_curve(r, i, initial_ppl.get(s)) for s, (r, i) in good.items()}
            summaries.setdefault(name, {})[label] = {s: run_summary(r, i) for s, (r, i) in good.items()}
        if budgets[index] is None:
            raise SystemExit("--clock virtual compares at a budget: pass --budget_virtual_seconds")
        comparisons[label] = compare_virtual(curves[label], budgets[index], fixed)
    bandwidths = dict(zip(clock["labels"], clock["bandwidths"]))
    return {
        "virtual": comparisons,
        "virtual_curves": curves,
        "virtual_runs": summaries,
        "virtual_failed": failed,
        "virtual_targets": {
            name: target
            for method in TARGET_METHODS
            for name, target in virtual_targets(comparisons, bandwidths, method).items()
        },
        "clock": {k: v for k, v in clock.items() if k != "profile"},
        "device_profile": clock["profile"],
    }
