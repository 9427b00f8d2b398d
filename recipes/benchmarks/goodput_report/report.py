"""The goodput rule's report: a row per seed and setting, the targets judged on the means over seeds, its final
perplexity over the norm test's paired by seed, and the plot."""

import statistics

from recipes.benchmarks.goodput_report.figures import (
    MERGE_TARGET,
    PPL_TARGET,
    WALL_TARGETS,
    convergence_figures,
    links_figures,
)
from recipes.benchmarks.toolkit.figures import pyplot, save_figure
from recipes.benchmarks.toolkit.results import table
from recipes.benchmarks.toolkit.stats import ratio


__all__ = ["mean_sd", "method_figures", "paired_report", "paired_vs_norm", "plot", "verdict"]


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


def paired_vs_norm(goodput_rows: list[dict], norm_rows: list[dict]) -> dict:
    """Per setting (bandwidth, or one machine): the goodput method's final perplexity over the norm test's, paired by
    seed (the same seconds for both when the runs had --budget_seconds): what the rule itself changes."""
    norm = {(r["bandwidth"], r["seed"]): r.get("final ppl") for r in norm_rows}
    out: dict[str, dict] = {}
    for row in goodput_rows:
        value = ratio(row.get("final ppl"), norm.get((row["bandwidth"], row["seed"])))
        if value is not None:
            out.setdefault(row["bandwidth"], {"seeds": [], "ratios": []})
            out[row["bandwidth"]]["seeds"].append(row["seed"])
            out[row["bandwidth"]]["ratios"].append(value)
    for entry in out.values():
        entry["mean_sd"] = mean_sd(entry["ratios"])
    return out


def paired_report(paired: dict) -> str:
    rows = [
        {"setting": setting, "per seed": ", ".join(f"{v:.3f}" for v in e["ratios"]), "mean ± sd": e["mean_sd"]}
        for setting, e in paired.items()
    ]
    return table(rows, ["setting", "per seed", "mean ± sd"]) if rows else "(no paired runs)"


def plot(out: dict, path: str) -> str:
    """Per method and setting (bandwidth, or one machine), each seed's time to the best fixed batch's final
    perplexity over that batch's time (left; a hollow marker at the top: never reached) and its final perplexity over
    the best fixed batch's (right; equal seconds when every method had the same --budget_seconds), with the targets."""
    plt = pyplot()
    settings = sorted({row["bandwidth"] for figures in out.values() for row in figures["rows"]})
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    width = 0.8 / max(1, len(out))
    for k, (method, figures) in enumerate(out.items()):
        for column, ax in (("ratio", axes[0]), ("final / best fixed", axes[1])):
            xs, ys, never = [], [], []
            for row in figures["rows"]:
                x = settings.index(row["bandwidth"]) + (k - (len(out) - 1) / 2) * width
                if row.get(column) is None:
                    never.append(x)
                else:
                    xs.append(x)
                    ys.append(row[column])
            color = f"C{k}"
            ax.scatter(xs, ys, color=color, label=method)
            if never:
                top = max([1.6] + ys)
                ax.scatter(never, [top] * len(never), facecolors="none", edgecolors=color)
    for i, setting in enumerate(settings):
        bound = WALL_TARGETS.get("no limit" if setting.startswith("no limit") else setting)
        if bound is not None:
            axes[0].hlines(bound, i - 0.45, i + 0.45, colors="grey", linestyles="dashed")
    axes[0].set_title("time to the best fixed batch's final ppl / its time\n(dashed: target; hollow at top: never)")
    axes[1].set_title("final ppl / the best fixed batch's final ppl")
    for ax in axes:
        ax.axhline(1.0, color="black", linewidth=0.5)
        ax.set_xticks(range(len(settings)), settings)
        ax.legend()
    return save_figure(fig, path)


def method_figures(method: str, links_results: list, convergence_results: dict | None) -> dict:
    """One goodput method's rows (per seed and bandwidth) and targets."""
    links = [
        {"path": path, "seed": results["settings"]["seed"], "figures": links_figures(results, method)}
        for path, results in links_results
    ]
    convergence = None
    if convergence_results is not None:
        root = convergence_results.get("folder")
        convergence = {"seeds": convergence_figures(convergence_results, method, root)}
    rows, targets = [], []
    for run in links:
        for bandwidth, entry in run["figures"].items():
            rows.append(row("links", run["seed"], bandwidth, entry["wall"], entry.get("merge_model_times") or []))
    for seed in (convergence or {}).get("seeds", []):
        merges = seed.get("merge_model_times") or []
        rows.append(row("convergence", seed["seed"], "no limit (one machine)", seed.get("wall"), merges))
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
    where = "at 100 Mbit/s (links, measured seconds)"
    if not merges and convergence:  # no links run: the bytes each merge put on its busiest link
        merges = [m for s in convergence["seeds"] for m in s.get("merge_model_times", [])]
        where = "(convergence: bytes on the busiest link)"
    if merges:
        targets.append(
            {
                "target": f"every merge {where} <= {MERGE_TARGET} model-times",
                "value": f"max {max(merges):.2f} of {len(merges)} ({', '.join(f'{m:.2f}' for m in merges)})",
                "verdict": "holds" if max(merges) <= MERGE_TARGET else "MISSED",
            }
        )
    report = table(rows, list(rows[0])) if rows else "(no runs)"
    if targets:
        report += "\n\n" + table(targets, ["target", "value", "verdict"])
    return {"links": links, "convergence": convergence, "rows": rows, "targets": targets, "report": report}


def row(benchmark: str, seed, bandwidth: str, wall: dict | None, merges: list[float]) -> dict:
    wall = wall or {}
    return {
        "benchmark": benchmark,
        "seed": seed,
        "bandwidth": bandwidth,
        "best fixed": wall.get("best_fixed"),
        "its final ppl": wall.get("target_ppl"),
        "its wall s": wall.get("best_wall_seconds"),
        "s to it": wall.get("goodput_seconds_to_target"),
        "ratio": wall.get("ratio"),
        "final ppl": wall.get("goodput_final_ppl"),
        "wall s": wall.get("goodput_wall_seconds"),
        # With the same seconds for every method (--budget_seconds), its final ppl over the best fixed batch's.
        "final / best fixed": ratio(wall.get("goodput_final_ppl"), wall.get("target_ppl")),
        "merges (model-times)": ", ".join(f"{m:.2f}" for m in merges) or "-",
    }
