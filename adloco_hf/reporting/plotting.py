"""Draw an AdLoCo run: a figure of its logs over tokens seen.

Global rank 0 writes one line per instance per round to `adloco_rounds.jsonl` and one line per evaluation to
`adloco_eval.jsonl` in the run's `output_dir` (`adloco_hf.reporting.run_log`, DESIGN §4). `plot_run` draws them: each
instance's batch per inner step (all its workers) and its request per worker, losses, and below them two strips, the
number of instances (and, with `batch_size_target="goodput"`, the goodput each round's choice was predicted to give,
against keeping the batch) and the bytes communicated.

An instance's batch is drawn whole because a merge changes how it is split: with `merge_batch_rule="preserve_total"`
the survivor keeps its total and its request per worker falls as it gains workers (8 → 4 on twice the workers), which
drawn alone would look like a batch that shrank. It only reads the files, so it works
on a finished run, on one still training, and on one that crashed in the middle of writing a line. The summary
table printed beside the figure is `adloco_hf.reporting.report`'s.

Example:
    ```python
    from adloco_hf.reporting.plotting import plot_run

    plot_run("outputs/demo")  # writes outputs/demo/adloco_run.png
    ```
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from ..common.formats import byte_unit, format_bytes, format_count
from .report import first_dataset_evals, instance_label, summarize_records
from .run_log import MERGED, group_by_round, is_finite_number, load_evals, load_rounds


PLOT_FILE = "adloco_run.png"

__all__ = ["PLOT_FILE", "goodput_series", "plot_run"]


def _round_tokens(by_round: dict[int, list[dict[str, Any]]]) -> dict[int, float]:
    """Tokens seen by all instances at the end of each round (x axis of every panel)."""
    tokens, running = {}, 0.0
    for step, records in by_round.items():
        logged = [r["total_tokens"] for r in records if is_finite_number(r.get("total_tokens"))]
        running = max(logged) if logged else running + sum(r.get("tokens") or 0 for r in records)
        tokens[step] = running
    return tokens


def instance_batch(record: dict[str, Any]) -> float:
    """An instance's batch per inner step over all its workers in a round: what its workers trained
    (`worker_batch_sizes`, or `samples` / `inner_steps`), else its request × its workers."""
    sizes = record.get("worker_batch_sizes")
    if sizes:
        return float(sum(sizes))
    if is_finite_number(record.get("samples")) and record.get("inner_steps"):
        return record["samples"] / record["inner_steps"]
    return float(record["batch_size"] * max(len(record.get("workers") or []), 1))


def goodput_series(
    per_instance: dict[int, list[dict[str, Any]]], tokens: dict[int, float]
) -> dict[int, tuple[list[float], list[float], list[float]]]:
    """Instance → (tokens at each round's end, predicted goodput of the request chosen there, of keeping the old one),
    for the rounds whose line has them (`batch_size_target="goodput"`); instances without any are left out."""
    series = {}
    for instance, records in per_instance.items():
        points = [
            (tokens[r["outer_step"]], r["goodput"], r["goodput_kept"])
            for r in records
            if is_finite_number(r.get("goodput")) and is_finite_number(r.get("goodput_kept"))
        ]
        if points:
            series[instance] = tuple(list(column) for column in zip(*points))
    return series


def plot_run(output_dir: str | os.PathLike, path: str | os.PathLike | None = None) -> str:
    """Draw a run's overview over tokens seen and save it as a PNG.

    Panels: (a) each instance's batch per inner step over all its workers (solid) and its request per worker
    (dashed, where it has several workers), with merges marked; (b) train loss per instance (lines) and eval loss per
    instance and of the merged model (markers); then two strips: (c) the number of instances, and with
    `batch_size_target="goodput"` the predicted goodput of each choice (solid) and of keeping the batch (dotted) on a
    second axis; (d) cumulative bytes communicated by all workers.

    Args:
        output_dir: the run's `output_dir`.
        path: where to write the PNG; default `output_dir/adloco_run.png`.

    Returns:
        The path written, as a string.
    """
    # Figure + Agg canvas instead of pyplot: no global backend switch, no figure left open in the caller.
    import numpy as np
    from matplotlib import colormaps
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D
    from matplotlib.ticker import FuncFormatter, MaxNLocator

    output_dir = Path(output_dir)
    path = Path(path) if path is not None else output_dir / PLOT_FILE
    rounds, evals = load_rounds(output_dir), load_evals(output_dir)
    summary = summarize_records(rounds, evals, output_dir)
    evals = first_dataset_evals(evals)  # with several eval datasets, the first one's (as the summary)
    eval_name = "eval loss" if not evals or evals[0].get("dataset") is None else f"eval loss on {evals[0]['dataset']}"
    by_round = group_by_round(rounds)
    tokens = _round_tokens(by_round)
    steps = list(by_round)
    round_start = dict(zip(steps, [0.0] + [tokens[step] for step in steps[:-1]]))
    instances = sorted({r["instance"] for r in rounds})
    palette = [f"C{i}" for i in range(10)] if len(instances) <= 10 else list(colormaps["tab20"].colors)
    color = {instance: palette[i % len(palette)] for i, instance in enumerate(instances)}
    per_instance = {i: [r for r in rounds if r["instance"] == i] for i in instances}
    merged_away = {source for r in rounds for source in r.get("merged_from") or []}

    # The batch and the losses get the room; the instance count and the bytes, one number each per round, a strip.
    fig = Figure(figsize=(13, 8.5), dpi=120, layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(2, 2, sharex=True, gridspec_kw={"height_ratios": [5, 2]})
    (ax_batch, ax_loss), (ax_count, ax_comm) = axes
    token_formatter = FuncFormatter(lambda x, _: format_count(x))

    # (a) A batch holds over the whole round, so each value is drawn from the round's start to its end.
    several_workers = False
    for instance, records in per_instance.items():
        xs = [round_start[records[0]["outer_step"]]] + [tokens[r["outer_step"]] for r in records]
        totals = [instance_batch(records[0])] + [instance_batch(r) for r in records]
        ax_batch.step(xs, totals, where="pre", color=color[instance], lw=2, label=instance_label(instance))
        if any(len(r.get("workers") or []) > 1 for r in records):
            several_workers = True
            requests = [records[0]["batch_size"]] + [r["batch_size"] for r in records]
            ax_batch.step(xs, requests, where="pre", color=color[instance], lw=1, ls="--", alpha=0.8)
        # Stars above crosses (zorder): a survivor and the instance it absorbed can sit on the same point.
        for r in records:
            if r.get("merged_from"):
                ax_batch.plot(
                    tokens[r["outer_step"]], instance_batch(r), "*", ms=15, color=color[instance], mec="k", zorder=4
                )
        if instance in merged_away:
            ax_batch.plot(xs[-1], totals[-1], "X", ms=8, color=color[instance], mec="k", zorder=3)
    drawn = [y for line in ax_batch.get_lines() for y in line.get_ydata()]
    if max(drawn) >= 8 * max(min(drawn), 1):
        ax_batch.set_yscale("log", base=2)
    else:
        ax_batch.yaxis.set_major_locator(MaxNLocator(integer=True))  # samples: no tick at 4.5
    ax_batch.yaxis.set_major_formatter(FuncFormatter(lambda y, _: f"{y:g}"))
    ax_batch.set_title(
        "(a) batch per inner step: each instance's, all its workers"
        + (" (solid), and its request per worker (dashed)" if several_workers else "")
    )
    ax_batch.set_ylabel("samples / inner step")
    handles, _ = ax_batch.get_legend_handles_labels()
    if several_workers:
        handles.append(Line2D([], [], lw=1, ls="--", color="0.4", label="request per worker"))
    if merged_away:
        handles += [
            Line2D([], [], ls="", marker="*", ms=12, color="0.6", mec="k", label="merge (survivor)"),
            Line2D([], [], ls="", marker="X", ms=9, color="0.6", mec="k", label="merged away"),
        ]
    ax_batch.legend(handles=handles, fontsize=9, ncols=2 if len(handles) > 6 else 1, loc="best")

    # (c) num_instances is logged after the round's merge: the count changes at the round's end.
    count_x = [0.0] + [tokens[step] for step in steps]
    count_y = [summary["initial_instances"]] + [records[-1]["num_instances"] for records in by_round.values()]
    ax_count.step(count_x, count_y, where="post", color="k", lw=2)
    ax_count.set_ylim(0, max(count_y) + 0.5)
    ax_count.yaxis.set_major_locator(MaxNLocator(integer=True))
    ax_count.set_title("(c) number of instances")
    ax_count.set_ylabel("instances")
    goodput = goodput_series(per_instance, tokens)
    if goodput:
        ax_good = ax_count.twinx()
        for instance, (xs, chosen, kept) in goodput.items():
            ax_good.plot(xs, chosen, "-", marker=".", color=color[instance], lw=1.5)
            ax_good.plot(xs, kept, ":", color=color[instance], lw=1.5)
        ax_good.set_ylabel("predicted goodput (samples/s at the initial batch's worth)")
        ax_good.set_ylim(bottom=0)
        ax_count.set_title("(c) number of instances (black); predicted goodput: chosen (solid), kept (dotted)")

    # (b) NaN losses become gaps in the lines instead of breaking the axis limits.
    any_loss = False
    for instance, records in per_instance.items():
        losses = [r["train_loss"] if is_finite_number(r.get("train_loss")) else np.nan for r in records]
        any_loss |= any(np.isfinite(losses))
        xs = [tokens[r["outer_step"]] for r in records]
        ax_loss.plot(xs, losses, lw=1, marker=".", ms=4, color=color[instance], alpha=0.8)
    step_tokens = {step: tokens[step] for step in steps}
    for instance in instances + [MERGED]:
        points = [
            (
                e["total_tokens"] if is_finite_number(e.get("total_tokens")) else step_tokens.get(e.get("outer_step")),
                e["eval_loss"],
            )
            for e in evals
            if e.get("instance") == instance and is_finite_number(e.get("eval_loss"))
        ]
        points = [(x, y) for x, y in points if x is not None]
        if not points:
            continue
        any_loss = True
        xs, ys = zip(*points)
        if instance == MERGED:
            ax_loss.plot(xs, ys, "D", ms=9, color="k", zorder=3)
        else:
            ax_loss.plot(xs, ys, "o", ms=6, color=color[instance], mec="k", mew=0.5, zorder=3)
    if not any_loss:
        ax_loss.text(0.5, 0.5, "no finite loss logged", transform=ax_loss.transAxes, ha="center", color="0.4")
    legend = [Line2D([], [], lw=1, marker=".", ms=4, color="0.4", label="train loss (per instance)")]
    if any(e.get("instance") != MERGED for e in evals):
        legend.append(
            Line2D([], [], ls="", marker="o", ms=6, color="0.6", mec="k", label=f"{eval_name} (per instance)")
        )
    if any(e.get("instance") == MERGED for e in evals):
        legend.append(Line2D([], [], ls="", marker="D", ms=8, color="k", label=f"{eval_name} (merged model)"))
    ax_loss.legend(handles=legend, fontsize=9, loc="best")
    ax_loss.set_title("(b) loss")
    ax_loss.set_ylabel("cross-entropy")

    # (d) Everything every worker sent, so instances with more workers weigh more. Plotted in the unit of the
    # total in the title, so that the ticks fall on round numbers of it.
    sent = np.cumsum([0.0] + [sum(r.get("comm_bytes") or 0 for r in records) for records in by_round.values()])
    scale, unit = byte_unit(sent[-1])
    ax_comm.plot(count_x, sent / scale, color="k", lw=2, marker="o", ms=3)
    if sent[-1] == 0:
        ax_comm.set_ylim(0, 1)
        ax_comm.text(0.5, 0.5, "nothing sent: one worker per instance", transform=ax_comm.transAxes, ha="center")
    ax_comm.set_ylim(bottom=0)
    ax_comm.set_title(f"(d) bytes communicated (total {format_bytes(sent[-1])})")
    ax_comm.set_ylabel(f"cumulative sent ({unit})")

    for ax in axes.flat:
        ax.grid(True, alpha=0.3)
        ax.set_xlim(left=0)
        ax.xaxis.set_major_formatter(token_formatter)
    for ax in axes[1]:
        ax.set_xlabel("tokens seen (all instances)")
        ax.tick_params(labelbottom=True)
    for ax in axes[0]:
        ax.tick_params(labelbottom=True)

    perplexity = summary["final_eval_perplexity"]
    initial, final = summary["initial_instances"], summary["final_instances"]
    subtitle = ", ".join(
        [
            f"{summary['rounds']} rounds",
            f"{initial} -> {final} instances" if initial != final else f"{final} instance{'s' * (final > 1)}",
            f"{format_count(summary['total_tokens'])} tokens",
            *([] if perplexity is None else [f"final eval perplexity {perplexity:.2f}"]),
        ]
    )
    fig.suptitle(f"AdLoCo run: {output_dir.resolve().name}\n{subtitle}", fontsize=13)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    return str(path)
