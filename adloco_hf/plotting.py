"""Read, summarise and plot the logs of an AdLoCo run.

A run writes one line per instance per round to `adloco_rounds.jsonl` and one line per evaluation to
`adloco_eval.jsonl` in its `output_dir` (DESIGN §4). This module turns them into a summary table and a
2×2 figure over tokens seen: requested batch size per worker, number of instances, losses, and bytes
communicated. It only reads files, so it works on a finished run, on one still training, and on one that
crashed in the middle of writing a line.

Example:
    ```python
    from adloco_hf.plotting import format_summary, plot_run, summarize_run

    print(format_summary(summarize_run("outputs/demo")))
    plot_run("outputs/demo")  # writes outputs/demo/adloco_run.png
    ```
"""

from __future__ import annotations

import json
import math
import os
import warnings
from collections import defaultdict
from pathlib import Path
from typing import Any


ROUNDS_FILE = "adloco_rounds.jsonl"
EVAL_FILE = "adloco_eval.jsonl"
PLOT_FILE = "adloco_run.png"
MERGED = "merged"
_BYTE_UNITS = (" B", " KiB", " MiB", " GiB", " TiB")

__all__ = ["format_summary", "load_evals", "load_rounds", "plot_run", "summarize_run"]


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    """Parse a JSON-lines file, skipping blank lines and a truncated last line (a run killed mid-write).

    A malformed line anywhere else means the file is damaged, not merely cut short, and raises.
    """
    text = path.read_text(encoding="utf-8")
    lines = [(number, line) for number, line in enumerate(text.splitlines(), 1) if line.strip()]
    records = []
    for index, (number, line) in enumerate(lines):
        try:
            record = json.loads(line)
        except json.JSONDecodeError as error:
            if index == len(lines) - 1:
                warnings.warn(f"{path}:{number}: skipping a truncated last line ({error})", stacklevel=3)
                break
            raise ValueError(f"{path}:{number}: not a JSON object: {error}") from error
        if not isinstance(record, dict):
            raise ValueError(f"{path}:{number}: expected a JSON object, got {type(record).__name__}")
        records.append(record)
    return records


def load_rounds(output_dir: str | os.PathLike) -> list[dict[str, Any]]:
    """Read `adloco_rounds.jsonl`: one dict per instance per round, ordered by (outer_step, instance).

    Each instance's first worker appends its own lines, so the file order across instances is not
    guaranteed; the sort makes it so.

    Args:
        output_dir: the run's `output_dir`.

    Returns:
        The records as written (`null` → `None`, `NaN` → `float("nan")`).

    Raises:
        FileNotFoundError: the directory holds no `adloco_rounds.jsonl`.
    """
    path = Path(output_dir) / ROUNDS_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found: is {output_dir} the output_dir of an AdLoCo run?")
    records = _read_jsonl(path)
    return sorted(records, key=lambda record: (record["outer_step"], record["instance"]))


def load_evals(output_dir: str | os.PathLike) -> list[dict[str, Any]]:
    """Read `adloco_eval.jsonl`: one dict per evaluation, ordered by global step; `[]` when there is none.

    `instance` is an int id, or `"merged"` for the final merged model.
    """
    path = Path(output_dir) / EVAL_FILE
    if not path.is_file():
        return []
    return sorted(_read_jsonl(path), key=lambda record: record.get("global_step", 0))


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _demand(record: dict[str, Any]) -> int:
    """d_i = b_i × workers(i), the weight of an instance in merges and in the merged model."""
    return record["batch_size"] * len(record["workers"])


def _perplexity(record: dict[str, Any]) -> float | None:
    perplexity = record.get("eval_perplexity")
    if _finite(perplexity):
        return float(perplexity)
    loss = record.get("eval_loss")
    if _finite(loss):
        try:
            return math.exp(loss)
        except OverflowError:
            return math.inf
    return None


def _by_round(rounds: list[dict[str, Any]]) -> dict[int, list[dict[str, Any]]]:
    grouped: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for record in rounds:
        grouped[record["outer_step"]].append(record)
    return dict(sorted(grouped.items()))


def summarize_run(output_dir: str | os.PathLike) -> dict[str, Any]:
    """Condense a run's logs into a dict of plain, JSON-serialisable Python values.

    Keys:
        `output_dir`, `rounds` (outer steps logged), `global_step` (last), `initial_instances`,
        `final_instances` (after the last round's merge), `batch_size_start` / `batch_size_end`
        ({instance: per-worker request} in the instance's first round / after its last round),
        `merges` (number of instances merged away), `merge_events` (list of
        `{"outer_step", "survivor", "merged_from"}`), `total_tokens`, `total_samples`, `comm_bytes`,
        `comm_seconds` (summed over instances and rounds), `final_train_loss` (last round's losses
        averaged with weights d_i = b_i × workers(i), ignoring non-finite ones; `None` if none is
        finite), `final_eval_perplexity` with `final_eval_instance` (the merged model's last evaluation
        if there is one, else the best instance at the last evaluated step), `best_eval_perplexity` with
        `best_eval_instance` and `best_eval_step` (the lowest over all evaluations), `wall_seconds` and
        `skipped_rounds` (instance-rounds skipped for non-finite values).

    Raises:
        FileNotFoundError: no rounds file. ValueError: the rounds file holds no round.
    """
    return _summarize(output_dir, load_rounds(output_dir), load_evals(output_dir))


def _summarize(
    output_dir: str | os.PathLike, rounds: list[dict[str, Any]], evals: list[dict[str, Any]]
) -> dict[str, Any]:
    if not rounds:
        raise ValueError(f"{Path(output_dir) / ROUNDS_FILE} holds no round yet")
    by_round = _by_round(rounds)
    first_round, last_round = next(iter(by_round.values())), list(by_round.values())[-1]

    batch_size_start: dict[int, int] = {}
    batch_size_end: dict[int, int] = {}
    for record in rounds:
        batch_size_start.setdefault(record["instance"], record["batch_size"])
        batch_size_end[record["instance"]] = record.get("next_batch_size") or record["batch_size"]

    merge_events = [
        {"outer_step": r["outer_step"], "survivor": r["instance"], "merged_from": list(r["merged_from"])}
        for r in rounds
        if r.get("merged_from")
    ]

    weighted = [(_demand(r), r["train_loss"]) for r in last_round if _finite(r.get("train_loss"))]
    total_demand = sum(demand for demand, _ in weighted)
    final_train_loss = sum(d * loss for d, loss in weighted) / total_demand if total_demand else None

    scored = [(record, _perplexity(record)) for record in evals]
    scored = [(record, perplexity) for record, perplexity in scored if perplexity is not None]
    final_eval = best_eval = None
    if scored:
        best_eval = min(scored, key=lambda item: item[1])
        merged = [item for item in scored if item[0].get("instance") == MERGED]
        if merged:
            final_eval = merged[-1]
        else:
            last_step = scored[-1][0].get("global_step")
            final_eval = min((item for item in scored if item[0].get("global_step") == last_step), key=lambda x: x[1])

    return {
        "output_dir": str(output_dir),
        "rounds": len(by_round),
        "global_step": max(r.get("global_step", 0) for r in rounds),
        "initial_instances": len({r["instance"] for r in first_round}),
        "final_instances": last_round[-1]["num_instances"],
        "batch_size_start": batch_size_start,
        "batch_size_end": batch_size_end,
        "merges": sum(len(event["merged_from"]) for event in merge_events),
        "merge_events": merge_events,
        "total_tokens": max(r.get("total_tokens") or 0 for r in rounds),
        "total_samples": sum(r.get("samples") or 0 for r in rounds),
        "comm_bytes": sum(r.get("comm_bytes") or 0 for r in rounds),
        "comm_seconds": sum(r.get("comm_seconds") or 0.0 for r in rounds),
        "final_train_loss": final_train_loss,
        "final_eval_perplexity": final_eval[1] if final_eval else None,
        "final_eval_instance": final_eval[0].get("instance") if final_eval else None,
        "best_eval_perplexity": best_eval[1] if best_eval else None,
        "best_eval_instance": best_eval[0].get("instance") if best_eval else None,
        "best_eval_step": best_eval[0].get("global_step") if best_eval else None,
        "wall_seconds": max((r["elapsed_seconds"] for r in rounds if _finite(r.get("elapsed_seconds"))), default=None),
        "skipped_rounds": sum(bool(r.get("skipped")) for r in rounds),
    }


def _human(value: float, units: tuple[str, ...], base: float) -> str:
    """1234567 → "1.2M", 2000 → "2K": one decimal below 10 of a unit, none above."""
    exponent = 0
    while abs(value) >= base and exponent < len(units) - 1:
        value /= base
        exponent += 1
    if exponent == 0 and float(value).is_integer():
        return f"{int(value)}{units[0]}"
    number = f"{value:.1f}".removesuffix(".0") if abs(value) < 10 else f"{value:.0f}"
    return f"{number}{units[exponent]}"


def _count(value: float) -> str:
    return _human(value, ("", "K", "M", "B", "T"), 1000.0)


def _bytes(value: float) -> str:
    return _human(value, _BYTE_UNITS, 1024.0)


def _duration(seconds: float) -> str:
    seconds = int(round(seconds))
    hours, rest = divmod(seconds, 3600)
    minutes, seconds = divmod(rest, 60)
    if hours:
        return f"{hours}h {minutes:02d}m {seconds:02d}s"
    return f"{minutes}m {seconds:02d}s" if minutes else f"{seconds}s"


def _instance_name(instance: Any) -> str:
    return "merged model" if instance == MERGED else f"instance {instance}"


def format_summary(summary: dict[str, Any]) -> str:
    """Render `summarize_run`'s dict as an aligned plain-text table."""
    merged_into = {
        source: (event["survivor"], event["outer_step"])
        for event in summary["merge_events"]
        for source in event["merged_from"]
    }
    batch_rows = []
    for instance, start in summary["batch_size_start"].items():
        row = f"instance {instance}: {start} -> {summary['batch_size_end'][instance]}"
        if instance in merged_into:
            survivor, step = merged_into[instance]
            row += f"  (merged into {survivor} at round {step})"
        batch_rows.append(row)

    loss = summary["final_train_loss"]
    if summary["final_eval_perplexity"] is None:
        perplexity = "no evaluation"
    else:
        perplexity = (
            f"final {summary['final_eval_perplexity']:.2f} ({_instance_name(summary['final_eval_instance'])}), "
            f"best {summary['best_eval_perplexity']:.2f} ({_instance_name(summary['best_eval_instance'])}, "
            f"step {summary['best_eval_step']})"
        )
    wall = summary["wall_seconds"]
    rows = [
        ("rounds", f"{summary['rounds']} (global step {summary['global_step']})"),
        (
            "instances",
            f"{summary['initial_instances']} -> {summary['final_instances']} ({summary['merges']} merged away)",
        ),
        ("batch size per worker", batch_rows[0]),
        *[("", row) for row in batch_rows[1:]],
        ("tokens seen", f"{_count(summary['total_tokens'])} ({_count(summary['total_samples'])} samples)"),
        ("communicated", f"{_bytes(summary['comm_bytes'])} in {summary['comm_seconds']:.1f} s"),
        ("final train loss", "n/a (not finite)" if loss is None else f"{loss:.4f}"),
        ("eval perplexity", perplexity),
        ("wall time", "n/a" if wall is None else _duration(wall)),
        ("skipped rounds", str(summary["skipped_rounds"])),
    ]
    width = max(len(name) for name, _ in rows)
    lines = [f"AdLoCo run: {summary['output_dir']}"]
    lines += [f"  {name:<{width}}  {value}" for name, value in rows]
    return "\n".join(lines)


def _round_tokens(by_round: dict[int, list[dict[str, Any]]]) -> dict[int, float]:
    """Tokens seen by all instances at the end of each round (x axis of every panel)."""
    tokens, running = {}, 0.0
    for step, records in by_round.items():
        logged = [r["total_tokens"] for r in records if _finite(r.get("total_tokens"))]
        running = max(logged) if logged else running + sum(r.get("tokens") or 0 for r in records)
        tokens[step] = running
    return tokens


def plot_run(output_dir: str | os.PathLike, path: str | os.PathLike | None = None) -> str:
    """Draw a run's 2×2 overview over tokens seen and save it as a PNG.

    Panels: (a) requested batch size per worker of each instance, with merges marked; (b) number of
    instances; (c) train loss per instance (lines) and eval loss per instance and of the merged model
    (markers); (d) cumulative bytes communicated by all workers.

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
    summary = _summarize(output_dir, rounds, evals)
    by_round = _by_round(rounds)
    tokens = _round_tokens(by_round)
    steps = list(by_round)
    round_start = dict(zip(steps, [0.0] + [tokens[step] for step in steps[:-1]]))
    instances = sorted({r["instance"] for r in rounds})
    palette = [f"C{i}" for i in range(10)] if len(instances) <= 10 else list(colormaps["tab20"].colors)
    color = {instance: palette[i % len(palette)] for i, instance in enumerate(instances)}
    per_instance = {i: [r for r in rounds if r["instance"] == i] for i in instances}
    merged_away = {source for r in rounds for source in r.get("merged_from") or []}

    fig = Figure(figsize=(13, 8.5), dpi=120, layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(2, 2, sharex=True)
    (ax_batch, ax_count), (ax_loss, ax_comm) = axes
    token_formatter = FuncFormatter(lambda x, _: _count(x))

    # (a) A request holds over the whole round, so each value is drawn from the round's start to its end.
    for instance, records in per_instance.items():
        xs = [round_start[records[0]["outer_step"]]] + [tokens[r["outer_step"]] for r in records]
        ys = [records[0]["batch_size"]] + [r["batch_size"] for r in records]
        ax_batch.step(xs, ys, where="pre", color=color[instance], lw=2, label=_instance_name(instance))
        # Stars above crosses (zorder): a survivor and the instance it absorbed can sit on the same point.
        for r in records:
            if r.get("merged_from"):
                ax_batch.plot(
                    tokens[r["outer_step"]], r["batch_size"], "*", ms=15, color=color[instance], mec="k", zorder=4
                )
        if instance in merged_away:
            ax_batch.plot(xs[-1], ys[-1], "X", ms=8, color=color[instance], mec="k", zorder=3)
    batch_sizes = [r["batch_size"] for r in rounds]
    if max(batch_sizes) >= 8 * max(min(batch_sizes), 1):
        ax_batch.set_yscale("log", base=2)
    ax_batch.yaxis.set_major_formatter(FuncFormatter(lambda y, _: f"{y:g}"))
    ax_batch.set_title("(a) requested batch size per worker")
    ax_batch.set_ylabel("samples / worker / inner step")
    handles, _ = ax_batch.get_legend_handles_labels()
    if merged_away:
        handles += [
            Line2D([], [], ls="", marker="*", ms=12, color="0.6", mec="k", label="merge (survivor)"),
            Line2D([], [], ls="", marker="X", ms=9, color="0.6", mec="k", label="merged away"),
        ]
    ax_batch.legend(handles=handles, fontsize=9, ncols=2 if len(handles) > 6 else 1, loc="best")

    # (b) num_instances is logged after the round's merge: the count changes at the round's end.
    count_x = [0.0] + [tokens[step] for step in steps]
    count_y = [summary["initial_instances"]] + [records[-1]["num_instances"] for records in by_round.values()]
    ax_count.step(count_x, count_y, where="post", color="k", lw=2)
    ax_count.set_ylim(0, max(count_y) + 0.5)
    ax_count.yaxis.set_major_locator(MaxNLocator(integer=True))
    ax_count.set_title("(b) number of instances")
    ax_count.set_ylabel("instances")

    # (c) NaN losses become gaps in the lines instead of breaking the axis limits.
    any_loss = False
    for instance, records in per_instance.items():
        losses = [r["train_loss"] if _finite(r.get("train_loss")) else np.nan for r in records]
        any_loss |= any(np.isfinite(losses))
        xs = [tokens[r["outer_step"]] for r in records]
        ax_loss.plot(xs, losses, lw=1, marker=".", ms=4, color=color[instance], alpha=0.8)
    step_tokens = {step: tokens[step] for step in steps}
    for instance in instances + [MERGED]:
        points = [
            (
                e["total_tokens"] if _finite(e.get("total_tokens")) else step_tokens.get(e.get("outer_step")),
                e["eval_loss"],
            )
            for e in evals
            if e.get("instance") == instance and _finite(e.get("eval_loss"))
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
        legend.append(Line2D([], [], ls="", marker="o", ms=6, color="0.6", mec="k", label="eval loss (per instance)"))
    if any(e.get("instance") == MERGED for e in evals):
        legend.append(Line2D([], [], ls="", marker="D", ms=8, color="k", label="eval loss (merged model)"))
    ax_loss.legend(handles=legend, fontsize=9, loc="best")
    ax_loss.set_title("(c) loss")
    ax_loss.set_ylabel("cross-entropy")

    # (d) Everything every worker sent, so instances with more workers weigh more. Plotted in one unit so
    # that the ticks fall on round numbers of it.
    sent = np.cumsum([0.0] + [sum(r.get("comm_bytes") or 0 for r in records) for records in by_round.values()])
    exponent = min(int(math.log(sent[-1], 1024)) if sent[-1] >= 1 else 0, len(_BYTE_UNITS) - 1)
    ax_comm.plot(count_x, sent / 1024**exponent, color="k", lw=2, marker="o", ms=3)
    if sent[-1] == 0:
        ax_comm.set_ylim(0, 1)
        ax_comm.text(0.5, 0.5, "nothing sent: one worker per instance", transform=ax_comm.transAxes, ha="center")
    ax_comm.set_ylim(bottom=0)
    ax_comm.set_title(f"(d) bytes communicated (total {_bytes(sent[-1])})")
    ax_comm.set_ylabel(f"cumulative sent ({_BYTE_UNITS[exponent].strip()})")

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
            f"{_count(summary['total_tokens'])} tokens",
            *([] if perplexity is None else [f"final eval perplexity {perplexity:.2f}"]),
        ]
    )
    fig.suptitle(f"AdLoCo run: {output_dir.resolve().name}\n{subtitle}", fontsize=13)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    return str(path)
