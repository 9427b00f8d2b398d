"""`--compare streaming`: training from the stream against the materialised dataset, paired within each repeat, the
criterion (issue 16), and the report."""

from recipes.benchmarks.overhead.pairs import (
    median_tokens_per_second,
    paired,
    ratio_line,
    ratio_summary,
    variants_table,
)
from recipes.benchmarks.overhead.variants import Variant
from recipes.benchmarks.toolkit.stats import complete_repeats


__all__ = ["CRITERION", "VARIANTS", "format_report", "summarize"]

VARIANTS = {"materialised": Variant(), "streamed": Variant(data="streamed")}
CRITERION = 0.95


def summarize(runs: list[dict], settings: dict | None = None) -> dict:
    """Pair the variants within each repeat: the ratio streamed / materialised of tokens/s, median and spread."""
    complete = complete_repeats(runs, VARIANTS)
    summary = ratio_summary("throughput_ratio", paired(complete, "streamed", "materialised"))
    return {
        **summary,
        "tokens_per_second": median_tokens_per_second(complete, VARIANTS),
        "repeats": len(complete),
        "criterion": CRITERION,
        "holds": summary["throughput_ratio"] >= CRITERION,
    }


def format_report(summary: dict) -> str:
    """The table, the paired ratio against the criterion, and the stream's own tokens/s where measured."""
    lines = [
        variants_table(summary["tokens_per_second"], "materialised"),
        "\n"
        + ratio_line("streamed / materialised", summary["throughput_ratio_spread"])
        + f"; criterion >= {summary['criterion']}: {'holds' if summary['holds'] else 'MISSED'}",
    ]
    if summary.get("stream_tokens_per_second") is not None:
        lines.append(
            f"the stream alone (tokenise + pack, no training): {summary['stream_tokens_per_second']:,.0f} tokens/s"
        )
    return "\n".join(lines)
