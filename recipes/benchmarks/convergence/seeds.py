"""One method over its seeds: the means (perplexities geometric), the per-seed values, the mean curves."""

import math
import statistics

from recipes.benchmarks.toolkit.stats import interpolate_curve


__all__ = [
    "CURVES",
    "TOTALS",
    "aggregate",
    "mean_curve",
    "mean_curve_by_index",
    "mean_sd",
    "run_curve_kind",
    "wall_per_round",
]

# A run's curves `[[x, ppl], ...]`: `curve` (tokens; the merged model's perplexity where a point has one, see
# `curve_kind`), `curve_bytes`, the instances' demand-weighted mean and the best instance (tokens).
CURVES = ("curve", "curve_bytes", "curve_instances_mean", "curve_best_instance")
TOTALS = ("tokens", "epochs", "steps", "comm_rounds", "comm_bytes", "measured_bytes_sent", "wall_seconds")


def mean_sd(values: list[float], geometric: bool = False) -> tuple[float | None, float | None]:
    """Mean and sample standard deviation (None with fewer than 2 values) of the finite values. `geometric`: the
    mean of perplexities and of their ratios is geometric (the mean of log-perplexities, as the curves average), so a
    method's mean final perplexity is its mean curve's last point; the spread stays in the values' own units."""
    values = [float(v) for v in values if v is not None and math.isfinite(v) and (v > 0 or not geometric)]
    if not values:
        return None, None
    mean = math.exp(statistics.fmean(math.log(v) for v in values)) if geometric else statistics.fmean(values)
    return mean, (statistics.stdev(values) if len(values) > 1 else None)


def mean_curve(curves: list[list[list[float]]]) -> list[list[float]]:
    """The seeds' curves `[[x, ppl], ...]` averaged in log-perplexity at every x of any of them, over the x range
    that all of them cover (a seed that stops earlier ends the mean curve there)."""
    if len(curves) == 1:
        return [list(p) for p in curves[0]]
    end = min(max(x for x, _ in c) for c in curves)
    grid = sorted({float(x) for c in curves for x, _ in c if x <= end})
    out = []
    for x in grid:
        values = [interpolate_curve(c, x) for c in curves]
        if all(v is not None for v in values):
            out.append([x, math.exp(statistics.fmean(math.log(v) for v in values))])
    return out


def mean_curve_by_index(curves: list[list[list[float]]]) -> list[list[float]]:
    """The seeds' curves averaged point by point: the i-th evaluation of every seed (the same round count), its x
    averaged and its perplexity averaged in log, over the points all seeds have. For curves whose x repeats (bytes:
    rounds that send nothing), where averaging at equal x is undefined."""
    count = min(len(c) for c in curves)
    return [
        [statistics.fmean(c[i][0] for c in curves), math.exp(statistics.fmean(math.log(c[i][1]) for c in curves))]
        for i in range(count)
    ]


def run_curve_kind(result: dict) -> str:
    """A run's `curve_kind`; for a result written before it existed, what its curve was then: the instances' mean
    where an evaluation saw several instances, else one model."""
    if "curve_kind" in result:
        return result["curve_kind"]
    several = any(len(point.get("instance_losses") or {}) > 1 for point in result.get("evals", []))
    return "instances_mean" if several else "model"


def aggregate(per_seed: dict[int, dict]) -> dict:
    """One method over its seeds: the means (`final_eval_ppl`, `tokens`, `epochs`, `inner_steps`, `comm_rounds`,
    `comm_bytes`, `wall_seconds`, ...), the per-seed values (`*_seeds`), the mean curves and every seed's result
    under `seed_results`. A method whose every seed failed keeps the first error."""
    done = {seed: r for seed, r in per_seed.items() if "error" not in r}
    if not done:
        return {"error": next(iter(per_seed.values()))["error"], "seed_results": per_seed}
    out: dict = {"seeds": sorted(done), "failed_seeds": sorted(set(per_seed) - set(done))}
    finals = [r["final_eval_ppl"] for r in done.values()]
    out["final_eval_ppl"], out["final_eval_ppl_sd"] = mean_sd(finals, geometric=True)
    out["final_eval_ppl_seeds"] = finals
    for key in TOTALS:
        values = [r.get(key) for r in done.values()]
        out[key] = mean_sd(values)[0]
        out[f"{key}_seeds"] = values
    out["inner_steps"] = out["steps"]
    out["max_worker_epochs"] = max((r.get("max_worker_epochs") or 0.0) for r in done.values())
    for key in CURVES:
        if all(key in r for r in done.values()):
            average = mean_curve_by_index if key == "curve_bytes" else mean_curve
            out[key] = average([r[key] for r in done.values()])
    kinds = sorted({run_curve_kind(r) for r in done.values()})
    out["curve_kind"] = kinds[0] if len(kinds) == 1 else "mixed: " + ", ".join(kinds)
    first = next(iter(done.values()))
    out["batch_sizes"] = first.get("batch_sizes")
    out["rounds"] = mean_sd([r.get("rounds") for r in done.values()])[0]
    per_round = [wall_per_round(r) for r in done.values()]
    out["wall_per_round"], out["wall_per_round_sd"] = mean_sd(per_round)
    out["wall_per_round_seeds"] = per_round
    out["seed_results"] = per_seed
    return out


def wall_per_round(result: dict) -> float | None:
    """A run's training seconds (evaluations excluded) per round; None for DDP (no rounds)."""
    rounds = result.get("rounds")
    return result["wall_seconds"] / rounds if rounds else None
