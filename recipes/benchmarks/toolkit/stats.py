"""Statistics of the benchmarks' results: ratios, a robust spread, curves of eval perplexity (interpolated, first
reached) and target perplexities every run reaches. Pure Python (no torch)."""

import math
import statistics
from collections.abc import Mapping, Sequence


__all__ = [
    "T_975",
    "choose_targets",
    "complete_repeats",
    "first_reach",
    "interpolate_curve",
    "median_spread",
    "nice_ceiling",
    "paired_interval",
    "ratio",
    "sign_test",
    "t_quantile_975",
]


def ratio(value: float | None, reference: float | None) -> float | None:
    """`value / reference`, or None when either is missing or the reference is 0 or not finite."""
    if value is None or reference is None:
        return None
    if not math.isfinite(reference) or reference == 0 or not math.isfinite(value):
        return None
    return value / reference


def median_spread(values: Sequence[float]) -> dict[str, float]:
    """Median, min, max, and the half-width of the inter-quartile range relative to the median (a robust spread)."""
    if not values:
        raise ValueError("median_spread needs at least one value")
    data = sorted(float(v) for v in values)
    median = statistics.median(data)
    if len(data) >= 4:
        q1, _, q3 = statistics.quantiles(data, n=4, method="inclusive")
    else:
        q1, q3 = data[0], data[-1]
    return {
        "median": median,
        "min": data[0],
        "max": data[-1],
        "iqr_half_rel": (q3 - q1) / 2 / abs(median) if median else math.inf,
        "n": len(data),
    }


def interpolate_curve(curve: Sequence[Sequence[float]], x: float) -> float | None:
    """Perplexity at `x` tokens on a curve of `[tokens, perplexity]` points, or None outside its range.

    Interpolates the loss (log-perplexity) linearly in tokens, which is how the Trainer's loss evolves between two
    evaluations far better than the perplexity itself. Points need not be sorted; a repeated x keeps the last one.
    """
    points = {}
    for tokens, ppl in curve:
        if ppl is not None and math.isfinite(ppl) and ppl > 0:
            points[float(tokens)] = float(ppl)
    xs = sorted(points)
    if not xs or x < xs[0] or x > xs[-1]:
        return None
    for left, right in zip(xs, xs[1:]):
        if left <= x <= right:
            if right == left:
                return points[right]
            t = (x - left) / (right - left)
            return math.exp((1 - t) * math.log(points[left]) + t * math.log(points[right]))
    return points[xs[-1]]


def first_reach(points: Sequence[Mapping], target: float, fields: Mapping[str, str]) -> dict | None:
    """Where a run's eval curve first reaches perplexity `target` (eval_ppl <= target), or None if it never does.

    `points` are the run's evaluations in order (dicts with `"eval_ppl"` and the keys named in `fields`), the first
    one usually the initial model. Between the two evaluations around the crossing every field is interpolated
    linearly, at the fraction where log-perplexity crosses `log(target)`. Returns `{name: value}` for `fields`
    (`{output name: point key}`); a field missing on either point is None. Non-finite perplexities are skipped.
    """
    points = [
        p for p in points if p.get("eval_ppl") is not None and math.isfinite(p["eval_ppl"]) and p["eval_ppl"] > 0
    ]
    for i, point in enumerate(points):
        if point["eval_ppl"] > target:
            continue
        before = points[i - 1] if i else point
        span = math.log(before["eval_ppl"]) - math.log(point["eval_ppl"])
        t = 1.0 if span <= 0 else (math.log(before["eval_ppl"]) - math.log(target)) / span
        out = {}
        for name, key in fields.items():
            a, b = before.get(key), point.get(key)
            out[name] = None if a is None or b is None else a + t * (b - a)
        return out
    return None


def nice_ceiling(x: float) -> float:
    """`x` rounded up to two significant digits (187.3 -> 190, 1234 -> 1300, 9.71 -> 9.8)."""
    if x <= 0 or not math.isfinite(x):
        return x
    step = 10 ** (math.floor(math.log10(x)) - 1)
    return math.ceil(round(x / step, 9)) * step


def choose_targets(best_ppls: Sequence[float], factors: Sequence[float] = (1.3, 1.1, 1.0)) -> list[float]:
    """Target perplexities that every run reaches, from each run's best (lowest) perplexity: the worst of those
    bests, and `factors` above it, each rounded up to two significant digits; highest first, no repeats."""
    best = [p for p in best_ppls if p is not None and math.isfinite(p)]
    if not best:
        return []
    worst_best = max(best)
    return sorted({nice_ceiling(worst_best * f) for f in factors}, reverse=True)


def complete_repeats(runs: Sequence[Mapping], variants: Sequence[str]) -> list[dict]:
    """The runs of variants alternated in one process, paired by repeat: `[{variant: run}]` for every repeat in which
    each of `variants` ran (a run is a dict with `"repeat"` and `"variant"`); a ValueError when there is none."""
    by_repeat: dict[int, dict[str, Mapping]] = {}
    for run in runs:
        by_repeat.setdefault(run["repeat"], {})[run["variant"]] = run
    complete = [r for r in by_repeat.values() if all(v in r for v in variants)]
    if not complete:
        raise ValueError(f"no repeat ran every variant of {list(variants)}")
    return complete


# Student's t at 0.975 for 1 to 30 degrees of freedom (two-sided 95 %).
T_975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145, 2.131,
         2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042)  # fmt: skip


def t_quantile_975(df: int) -> float:
    """Student's t quantile at 0.975 for `df` degrees of freedom: the table up to 30, Fisher and Cornish's expansion
    in 1/df beyond (within 1e-3 there)."""
    if df < 1:
        raise ValueError(f"degrees of freedom must be >= 1, got {df}")
    if df <= len(T_975):
        return T_975[df - 1]
    z = 1.959964
    return (
        z
        + (z**3 + z) / (4 * df)
        + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * df**2)
        + (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / (384 * df**3)
    )


def paired_interval(ratios: Sequence[float]) -> dict:
    """The geometric mean of ratios paired by seed and its 95 % confidence interval: Student's t on their logs
    (`mean`, `low`, `high`, `n`); with one ratio the interval is undefined (None)."""
    logs = [math.log(r) for r in ratios if r is not None and math.isfinite(r) and r > 0]
    if not logs:
        return {"mean": None, "low": None, "high": None, "n": 0}
    mean = statistics.fmean(logs)
    if len(logs) < 2:
        return {"mean": math.exp(mean), "low": None, "high": None, "n": 1}
    half = t_quantile_975(len(logs) - 1) * statistics.stdev(logs) / math.sqrt(len(logs))
    return {"mean": math.exp(mean), "low": math.exp(mean - half), "high": math.exp(mean + half), "n": len(logs)}


def sign_test(successes: int, trials: int) -> float:
    """The two-sided exact sign test: the probability, with each of `trials` paired comparisons equally likely to go
    either way, of a split at least as uneven as `successes` against the rest (1 without trials)."""
    if trials <= 0:
        return 1.0
    low = min(successes, trials - successes)
    tail = sum(math.comb(trials, k) for k in range(low + 1)) / 2**trials
    return min(1.0, 2 * tail)
