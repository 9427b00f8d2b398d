"""`--compare trainer`: `AdLoCoTrainer` against the plain `Trainer` (statistics off and on), its runs paired within
each repeat (the throughput ratios), the per-step times pooled over the repeats (the statistics step's extra time,
the end of round's share), and the report."""

import statistics

from recipes.benchmarks.overhead.pairs import (
    median_tokens_per_second,
    paired,
    ratio_line,
    ratio_summary,
    variants_table,
)
from recipes.benchmarks.overhead.variants import Variant
from recipes.benchmarks.toolkit.results import table
from recipes.benchmarks.toolkit.stats import complete_repeats


__all__ = ["REPORT_INNER_STEPS", "VARIANTS", "format_report", "pooled", "summarize"]

VARIANTS = {"trainer": Variant("trainer"), "adloco": Variant("adloco"), "adloco_stats": Variant("adloco_stats")}
REPORT_INNER_STEPS = (50, 200)


def pooled(complete: list[dict], variant: str, key: str) -> float:
    return statistics.median(t for r in complete for t in r[variant][key])


def summarize(runs: list[dict], settings: dict) -> dict:
    """Pair the variants within each repeat for the throughput ratios; pool the per-step times over the repeats."""
    complete = complete_repeats(runs, VARIANTS)
    step = {v: pooled(complete, v, "ordinary_steps") for v in VARIANTS}
    round_end = {v: pooled(complete, v, "round_end_steps") for v in VARIANTS}
    outer = pooled(complete, "adloco", "end_of_round")
    # A statistics step against an ordinary step of the same variant, minus the same difference without statistics
    # (which is 0 up to noise): what the split into two halves and the hooks cost, whatever the step's position.
    extra_with = round_end["adloco_stats"] - step["adloco_stats"]
    extra_without = round_end["adloco"] - step["adloco"]
    extra = extra_with - extra_without
    h_run = settings["inner_steps"]
    adloco_round = (h_run - 1) * step["adloco"] + round_end["adloco"] + outer
    stats_overhead, outer_overhead = {}, {}
    for h in sorted({*REPORT_INNER_STEPS, h_run}):
        round_time = h * step["adloco"] + outer
        stats_overhead[str(h)] = max(extra, 0.0) / round_time
        outer_overhead[str(h)] = outer / round_time
    return {
        **ratio_summary("throughput_ratio", paired(complete, "adloco", "trainer")),
        **ratio_summary("throughput_ratio_cpu_time", paired(complete, "adloco", "trainer", "tokens_per_cpu_second")),
        **ratio_summary("throughput_ratio_with_stats", paired(complete, "adloco_stats", "trainer")),
        # The same ratio from the pooled per-step medians (robust to bursts of a shared machine): H plain steps
        # against H AdLoCo steps plus one end of round.
        "throughput_ratio_from_step_medians": h_run * step["trainer"] / adloco_round,
        "tokens_per_second": median_tokens_per_second(complete, VARIANTS),
        "step_seconds": step,
        "round_end_step_seconds": round_end,
        "stats_step_extra_seconds": extra,
        "stats_step_extra_within_run_seconds": extra_with,
        "round_end_extra_without_stats_seconds": extra_without,
        "stats_step_relative": extra / step["adloco_stats"],
        "stats_overhead": stats_overhead,
        "outer_step_seconds": outer,
        "outer_overhead": outer_overhead,
        "repeats": len(complete),
    }


def format_report(summary: dict) -> str:
    steps = {v: {"ordinary step ms": 1000 * s} for v, s in summary["step_seconds"].items()}
    lines = [variants_table(summary["tokens_per_second"], "trainer", steps)]
    lines.append(
        "\n"
        + ratio_line("adloco / trainer", summary["throughput_ratio_spread"])
        + f"; with statistics: {summary['throughput_ratio_with_stats']:.4f}; "
        f"on CPU time instead of wall time: {summary['throughput_ratio_cpu_time']:.4f}; from pooled per-step medians: "
        f"{summary['throughput_ratio_from_step_medians']:.4f}"
    )
    lines.append(
        f"statistics step: +{1000 * summary['stats_step_extra_seconds']:.2f} ms over an ordinary step "
        f"({100 * summary['stats_step_relative']:.1f}% of one step; round-end step minus ordinary step: "
        f"{1000 * summary['stats_step_extra_within_run_seconds']:+.2f} ms with statistics, "
        f"{1000 * summary['round_end_extra_without_stats_seconds']:+.2f} ms without)"
    )
    overhead_rows = [
        {
            "inner_steps H": h,
            "stats_overhead": summary["stats_overhead"][h],
            "outer step share": summary["outer_overhead"][h],
        }
        for h in summary["stats_overhead"]
    ]
    lines.append(f"end of round (outer step + bookkeeping): {1000 * summary['outer_step_seconds']:.2f} ms per round")
    lines.append(table(overhead_rows, ["inner_steps H", "stats_overhead", "outer step share"]))
    lines.append(
        f"target throughput_ratio >= 0.97: {'holds' if summary['throughput_ratio'] >= 0.97 else 'MISSED'}; "
        "target stats_overhead <= 2%: "
        + ", ".join(f"H={h} {'holds' if v <= 0.02 else 'MISSED'}" for h, v in summary["stats_overhead"].items())
    )
    return "\n".join(lines)
