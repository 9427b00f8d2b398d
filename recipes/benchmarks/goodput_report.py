"""Issue 25's targets from the results of `links` and `convergence`: does the goodput rule pay for itself?

Every ratio is computed inside one run of a benchmark (its methods side by side), per seed, then summarised as the
mean ± the sample standard deviation over seeds (one `links` run per seed: `--set seed=43`).

- Wall time, per bandwidth of `links` (and for `convergence`'s 4 workers on one machine, no link limit): the best
  fixed batch (`diloco_b4`, `diloco_b8`, `diloco_b16`: the lowest final perplexity) sets the target perplexity, its
  final one, and the time it took (`wall_seconds`, evaluations excluded); `adloco_goodput`'s time to reach that
  perplexity (its eval curve over training seconds, log-perplexity interpolated between evaluations; never: it did
  not reach it) over that time. Targets: ≤ 0.8 at 10 Mbit/s, ≤ 1.0 at 100 Mbit/s, ≤ 1.05 without a link limit.
- Perplexity at equal tokens (`convergence`): `adloco_goodput` / `diloco_b4`, both curves interpolated at the
  smaller final token count of the two. Target ≤ 1.05.
- Merges over the 100 Mbit/s links: each merge's `merge_seconds` (the rounds file: the slowest worker's merge,
  redistribution included) over the time one bf16 copy of the model takes on the link (2 bytes × parameters × 8 /
  rate). Target ≤ 3.

    python -m recipes.benchmarks.goodput_report \\
        --links outputs/benchmarks/links-goodput-42/results.json outputs/benchmarks/links-goodput-43/results.json \\
        --convergence outputs/benchmarks/convergence-goodput/results.json --output_dir outputs/benchmarks/goodput

Outputs: `results.json` and `table.md` in `--output_dir`.
"""

import argparse
import json
import math
import os
import statistics

from recipes.benchmarks._common import interpolate_curve, table, write_json


FIXED = ("diloco_b4", "diloco_b8", "diloco_b16")
GOODPUT = "adloco_goodput"  # the method; its targets
VARIANTS = ("adloco_goodput", "diloco_goodput")  # reported alike, where they ran
# bandwidth → the most adloco_goodput may take of the best fixed batch's wall time
WALL_TARGETS = {"10mbit": 0.8, "100mbit": 1.0, "no limit": 1.05}
UNLIMITED = ("10gbit", "no limit")  # a tbf this fast limits nothing these CPU workers send
PPL_TARGET = 1.05
MERGE_TARGET = 3.0


def time_to(curve: list[tuple[float, float]], target: float) -> float | None:
    """Training seconds at which a [(seconds, ppl), ...] curve first reaches `target` (log-ppl interpolated)."""
    points = [(s, p) for s, p in curve if s is not None and p is not None and math.isfinite(p) and p > 0]
    for i, (seconds, ppl) in enumerate(points):
        if ppl <= target:
            if i == 0:
                return seconds
            s0, p0 = points[i - 1]
            t = (math.log(p0) - math.log(target)) / (math.log(p0) - math.log(ppl))
            return s0 + t * (seconds - s0)
    return None


def wall_ratio(runs: dict[str, dict], curve_of, method: str = GOODPUT) -> dict | None:
    """The goodput method's time to the best fixed batch's final perplexity over that batch's wall time."""
    fixed = {name: runs[name] for name in FIXED if name in runs and "final_eval_ppl" in runs[name]}
    if method not in runs or "final_eval_ppl" not in runs[method] or not fixed:
        return None
    best = min(fixed, key=lambda name: fixed[name]["final_eval_ppl"])
    target, wall = fixed[best]["final_eval_ppl"], fixed[best]["wall_seconds"]
    reached = time_to(curve_of(runs[method]), target)
    return {
        "best_fixed": best,
        "target_ppl": target,
        "best_wall_seconds": wall,
        "goodput_seconds_to_target": reached,
        "ratio": None if reached is None else reached / wall,
        "goodput_final_ppl": runs[method]["final_eval_ppl"],
        "goodput_wall_seconds": runs[method]["wall_seconds"],
        "fixed": {name: [run["final_eval_ppl"], run["wall_seconds"]] for name, run in fixed.items()},
    }


def merge_times(run: dict, parameters: int) -> list[float]:
    """Each merge's link time in bf16 model-times, from the run's rounds file."""
    path = run.get("timings", {}).get("rounds_file")
    if not path or not os.path.exists(path):
        return []
    model_seconds = 2 * parameters * 8 / run["bandwidth_bits_per_second"]
    with open(path, encoding="utf-8") as f:
        lines = [json.loads(line) for line in f if line.strip()]
    return [line["merge_seconds"] / model_seconds for line in lines if line.get("merged_from")]


def _link_curve(run: dict) -> list[tuple[float, float]]:
    return [(s, p) for s, _, p in run["curve"]]


def links_figures(results: dict, method: str = GOODPUT) -> dict:
    out = {}
    for bandwidth, runs in results["bandwidths"].items():
        label = "no limit" if bandwidth in UNLIMITED else bandwidth
        entry = {"wall": wall_ratio(runs, _link_curve, method)}
        if method in runs and "timings" in runs[method]:
            numel = _parameters(runs[method])
            entry["merge_model_times"] = merge_times(runs[method], numel) if numel else []
        out[label] = entry
    return out


def _parameters(run: dict) -> int | None:
    path = os.path.join(run["folder"], "result.json")
    if os.path.exists(path):
        with open(path, encoding="utf-8") as f:
            return json.load(f).get("parameters")
    return None


def _eval_points(run: dict) -> list[tuple[float, float]]:
    return [(p["seconds"], p["eval_ppl"]) for p in run["evals"]]


def convergence_figures(results: dict, method: str = GOODPUT) -> list[dict]:
    """Per seed: the wall-time ratio without a link limit and the perplexity at equal tokens against diloco_b4."""
    methods = results["methods"]
    out = []
    for seed in results["seeds"]:
        runs = {
            name: m["seed_results"][seed if seed in m["seed_results"] else str(seed)]
            for name, m in methods.items()
            if "seed_results" in m
        }
        initial = results["initial_eval_ppl"].get(str(seed), results["initial_eval_ppl"].get(seed))
        row = {"seed": seed}
        row["wall"] = wall_ratio(runs, lambda run, first=initial: [(0.0, first)] + _eval_points(run), method)
        if method in runs and "diloco_b4" in runs:
            a, b = runs[method]["curve"], runs["diloco_b4"]["curve"]
            tokens = min(a[-1][0], b[-1][0])
            row["tokens"] = tokens
            row["ppl_vs_b4"] = interpolate_curve(a, tokens) / interpolate_curve(b, tokens)
        out.append(row)
    return out


def mean_sd(values: list[float | None]) -> str:
    known = [v for v in values if v is not None]
    if not known:
        return "never"
    text = f"{statistics.mean(known):.3f}" + (f" ± {statistics.stdev(known):.3f}" if len(known) > 1 else "")
    return text + (f" ({len(values) - len(known)} never)" if len(known) < len(values) else "")


def verdict(values: list[float | None], bound: float) -> str:
    if not values or any(v is None for v in values):
        return "MISSED"
    return "holds" if statistics.mean(values) <= bound else "MISSED"


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--links", nargs="*", default=[], help="links results.json, one per seed")
    parser.add_argument("--convergence", default=None, help="convergence results.json")
    parser.add_argument("--output_dir", default="outputs/benchmarks/goodput")
    args = parser.parse_args(argv)
    links_results = []
    for path in args.links:
        with open(path, encoding="utf-8") as f:
            links_results.append((path, json.load(f)))
    convergence_results = None
    if args.convergence:
        with open(args.convergence, encoding="utf-8") as f:
            convergence_results = json.load(f)
    out, sections = {}, []
    for method in VARIANTS:
        ran = any(method in runs for _, r in links_results for runs in r["bandwidths"].values())
        ran = ran or (convergence_results is not None and method in convergence_results["methods"])
        if not ran:
            continue
        figures = method_figures(method, links_results, convergence_results)
        out[method] = figures
        sections.append(f"### {method}\n\n" + figures["report"])
    report = "\n\n".join(sections) if sections else "(no goodput run)"
    os.makedirs(args.output_dir, exist_ok=True)
    write_json(os.path.join(args.output_dir, "results.json"), out)
    with open(os.path.join(args.output_dir, "table.md"), "w", encoding="utf-8") as f:
        f.write(report + "\n")
    print(report)
    return out


def method_figures(method: str, links_results: list, convergence_results: dict | None) -> dict:
    """One goodput method's rows (per seed and bandwidth) and targets."""
    links = [
        {"path": path, "seed": results["settings"]["seed"], "figures": links_figures(results, method)}
        for path, results in links_results
    ]
    convergence = None
    if convergence_results is not None:
        convergence = {"seeds": convergence_figures(convergence_results, method)}
    rows, targets = [], []
    for run in links:
        for bandwidth, entry in run["figures"].items():
            rows.append(_row("links", run["seed"], bandwidth, entry["wall"], entry.get("merge_model_times") or []))
    for seed in (convergence or {}).get("seeds", []):
        rows.append(_row("convergence", seed["seed"], "no limit (one machine)", seed.get("wall"), []))
    for bandwidth, bound in WALL_TARGETS.items():
        values = [
            r["figures"][bandwidth]["wall"]["ratio"] for r in links if (r["figures"].get(bandwidth) or {}).get("wall")
        ]
        if bandwidth == "no limit" and convergence:
            values += [s["wall"]["ratio"] for s in convergence["seeds"] if s.get("wall")]
        if values:
            targets.append(
                {"target": f"wall {bandwidth} <= {bound}", "value": mean_sd(values), "verdict": verdict(values, bound)}
            )
    if convergence:
        values = [s.get("ppl_vs_b4") for s in convergence["seeds"]]
        targets.append(
            {
                "target": f"ppl / diloco_b4 at equal tokens <= {PPL_TARGET}",
                "value": mean_sd(values),
                "verdict": verdict(values, PPL_TARGET),
            }
        )
    merges = [m for r in links for m in (r["figures"].get("100mbit") or {}).get("merge_model_times", [])]
    if merges:
        targets.append(
            {
                "target": f"every merge at 100 Mbit/s <= {MERGE_TARGET} model-times",
                "value": f"max {max(merges):.2f} of {len(merges)} ({', '.join(f'{m:.2f}' for m in merges)})",
                "verdict": "holds" if max(merges) <= MERGE_TARGET else "MISSED",
            }
        )
    report = table(rows, list(rows[0])) if rows else "(no runs)"
    if targets:
        report += "\n\n" + table(targets, ["target", "value", "verdict"])
    return {"links": links, "convergence": convergence, "rows": rows, "targets": targets, "report": report}


def _row(benchmark: str, seed, bandwidth: str, wall: dict | None, merges: list[float]) -> dict:
    wall = wall or {}
    return {
        "benchmark": benchmark,
        "seed": seed,
        "bandwidth": bandwidth,
        "best fixed": wall.get("best_fixed"),
        "its final ppl": wall.get("target_ppl"),
        "its wall s": wall.get("best_wall_seconds"),
        "goodput s to it": wall.get("goodput_seconds_to_target"),
        "ratio": wall.get("ratio"),
        "goodput final ppl": wall.get("goodput_final_ppl"),
        "goodput wall s": wall.get("goodput_wall_seconds"),
        "merges (model-times)": ", ".join(f"{m:.2f}" for m in merges) or "-",
    }


if __name__ == "__main__":
    main()
