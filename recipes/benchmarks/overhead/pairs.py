"""What every comparison shares: its variants alternated in one session (the order rotated every repeat, so a slow
spell of a shared machine hits them alike), the runs paired by repeat into ratios, and the report's table and line."""

import statistics

from recipes.benchmarks.overhead.variants import Variant, run_variant
from recipes.benchmarks.toolkit.results import table
from recipes.benchmarks.toolkit.stats import median_spread


__all__ = ["alternate", "median_tokens_per_second", "paired", "ratio_line", "ratio_summary", "variants_table"]


def alternate(variants: dict[str, Variant], settings: dict, tokenizer, datasets: dict, output_dir: str) -> list[dict]:
    """`settings["repeats"]` repeats of every variant, each from freshly built weights, the order rotated every
    repeat; each run is `run_variant`'s timings with its `repeat`."""
    names = list(variants)
    runs = []
    for repeat in range(settings["repeats"]):
        for name in names[repeat % len(names) :] + names[: repeat % len(names)]:
            variant = variants[name]
            run = run_variant(name, variant, settings, tokenizer, datasets[variant.data], output_dir)
            runs.append({**run, "repeat": repeat})
            print(
                f"repeat {repeat} {name:>13}: {run['tokens_per_second']:,.0f} tokens/s, "
                f"step {1000 * run['ordinary_step_seconds']:.1f} ms, round end {1000 * run['round_end_step_seconds']:.1f}"
                f" + {1000 * run['end_of_round_seconds']:.1f} ms",
                flush=True,
            )
    return runs


def paired(complete: list[dict], variant: str, baseline: str, key: str = "tokens_per_second") -> list[float]:
    """`variant`'s `key` over `baseline`'s within each repeat of `complete` (`toolkit.stats.complete_repeats`)."""
    return [r[variant][key] / r[baseline][key] for r in complete]


def ratio_summary(name: str, ratios: list[float]) -> dict:
    """`{name: median, name_spread: median_spread}` of paired ratios."""
    return {name: statistics.median(ratios), f"{name}_spread": median_spread(ratios)}


def median_tokens_per_second(complete: list[dict], variants) -> dict[str, float]:
    return {v: statistics.median(r[v]["tokens_per_second"] for r in complete) for v in variants}


def variants_table(tokens_per_second: dict[str, float], baseline: str, extra: dict[str, dict] | None = None) -> str:
    """Tokens/s of each variant (median) and its ratio to `baseline`'s; `extra`: further columns per variant."""
    ratio = f"ratio to {baseline}"
    rows = [
        {"variant": v, "tokens/s (median)": tps, ratio: tps / tokens_per_second[baseline], **(extra or {}).get(v, {})}
        for v, tps in tokens_per_second.items()
    ]
    return table(rows, list(dict.fromkeys(key for row in rows for key in row)))


def ratio_line(label: str, spread: dict) -> str:
    """`throughput_ratio (label, paired per repeat): median, min, max, IQR/2 over n repeats`."""
    return (
        f"throughput_ratio ({label}, paired per repeat): median {spread['median']:.4f}, min {spread['min']:.4f}, "
        f"max {spread['max']:.4f}, IQR/2 {100 * spread['iqr_half_rel']:.2f}% over {spread['n']} repeats"
    )
