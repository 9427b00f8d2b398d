"""`--compare loader_processes`: one AdLoCo worker with 0 and with `--loader_processes` DataLoader processes, on the
materialised data (`map`) and on the stream (`stream`), paired within each repeat per kind of data (issue 38); the
report and the figure."""

import os
import platform

from recipes.benchmarks.overhead.pairs import paired
from recipes.benchmarks.overhead.variants import Variant
from recipes.benchmarks.toolkit.figures import pyplot, save_figure
from recipes.benchmarks.toolkit.results import table
from recipes.benchmarks.toolkit.stats import complete_repeats, median_spread


__all__ = ["KINDS", "VARIANTS", "format_report", "plot", "summarize"]

KINDS = {"map": "materialised", "stream": "streamed"}
# The kinds interleaved, so that over every 4 repeats of the rotation either setting of a kind runs first twice.
VARIANTS = {
    **{kind: Variant(data=data) for kind, data in KINDS.items()},
    **{f"{kind}_loader": Variant(data=data, loader=True) for kind, data in KINDS.items()},
}


def values(numbers: list[float]) -> dict:
    return {**median_spread(numbers), "values": numbers}


def summarize(runs: list[dict], settings: dict) -> dict:
    """Per kind of data: tokens/s `without` and `with` the loader processes, and their `ratio` within each repeat
    (median, min, max, every value)."""
    complete = complete_repeats(runs, VARIANTS)
    kinds = {
        kind: {
            "without": values([r[kind]["tokens_per_second"] for r in complete]),
            "with": values([r[f"{kind}_loader"]["tokens_per_second"] for r in complete]),
            "ratio": values(paired(complete, f"{kind}_loader", kind)),
        }
        for kind in KINDS
    }
    machine = {"cpus": os.cpu_count(), "python": platform.python_version()}
    return {
        "loader_processes": settings["loader_processes"],
        "repeats": len(complete),
        "machine": machine,
        "kinds": kinds,
    }


def format_report(summary: dict) -> str:
    """One row per kind of data: tokens/s without and with the loader processes, and their paired ratio."""
    with_n = f"with {summary['loader_processes']} loader processes"
    rows = [
        {"data": kind, "tokens/s without (median)": r["without"]["median"], with_n: r["with"]["median"],
         "with / without (median)": r["ratio"]["median"], "min": r["ratio"]["min"], "max": r["ratio"]["max"]}
        for kind, r in summary["kinds"].items()
    ]  # fmt: skip
    return table(rows, list(rows[0])) + f"\n\n{summary['repeats']} repeats, tokens/s paired within each"


def plot(results: dict, path: str) -> str:
    """Tokens/s of every repeat without and with the loader processes, per kind of data: each repeat a pair."""
    plt = pyplot()
    kinds = results["kinds"]
    fig, axes = plt.subplots(1, len(kinds), figsize=(4.2 * len(kinds), 3.6), squeeze=False)
    n = results["loader_processes"]
    for ax, (kind, r) in zip(axes[0], kinds.items()):
        for without, with_ in zip(r["without"]["values"], r["with"]["values"]):
            ax.plot([0, 1], [without, with_], "o-", color="tab:gray", alpha=0.6)
        ax.plot([0, 1], [r["without"]["median"], r["with"]["median"]], "s-", color="tab:blue", lw=2, label="median")
        ax.set(xticks=[0, 1], xticklabels=["0 loader processes", f"{n} loader processes"], xlim=(-0.3, 1.3),
               ylabel="tokens/s", title=f"{kind}: with / without {r['ratio']['median']:.3f} (median)")  # fmt: skip
        ax.legend(fontsize=8)
    fig.suptitle(f"DataLoader processes, {results['machine']['cpus']} CPUs, {results['repeats']} repeats", fontsize=10)
    return save_figure(fig, path)
