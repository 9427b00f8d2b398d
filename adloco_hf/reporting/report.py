"""What an AdLoCo run did, in words: its summary (numbers written with `common.formats`).

`summarize_run` condenses the run files (`adloco_hf.reporting.run_log`) into plain values and `format_summary`
renders them as a table. Nothing here imports torch or matplotlib.

Example:
    ```python
    from adloco_hf.reporting.report import format_summary, summarize_run

    print(format_summary(summarize_run("outputs/demo")))
    ```
"""

import math
import os
from pathlib import Path
from typing import Any

from ..common.formats import format_bytes, format_count, format_duration
from .card_details import batch_used
from .run_log import MERGED, ROUNDS_FILE, group_by_round, is_finite_number, load_evals, load_rounds


__all__ = [
    "first_dataset_evals",
    "format_summary",
    "instance_label",
    "summarize_records",
    "summarize_run",
    "summary_line",
]


def _demand(record: dict[str, Any]) -> int:
    """d_i = b_i × workers(i), the weight of an instance in merges and in the merged model."""
    return record["batch_size"] * len(record["workers"])


def _perplexity(record: dict[str, Any]) -> float | None:
    """A line's perplexity. Lines that name their `dataset` carry `eval_perplexity` exactly when the model is a causal
    LM (a classifier's has none); older lines without it get exp(eval_loss)."""
    perplexity = record.get("eval_perplexity")
    if is_finite_number(perplexity):
        return float(perplexity)
    if "dataset" in record:
        return None
    loss = record.get("eval_loss")
    if is_finite_number(loss):
        try:
            return math.exp(loss)
        except OverflowError:
            return math.inf
    return None


def first_dataset_evals(evals: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The evaluation lines of one eval dataset, the first named in the file (every line for a single dataset): with
    `eval_dataset={"in": ..., "other": ...}` the summary and the plot follow "in" alone."""
    first = evals[0].get("dataset") if evals else None
    return [record for record in evals if record.get("dataset") == first]


def summarize_run(output_dir: str | os.PathLike) -> dict[str, Any]:
    """Condense a run's logs into a dict of plain, JSON-serialisable Python values.

    Keys:
        `output_dir`, `rounds` (outer steps logged), `global_step` (last), `initial_instances`,
        `final_instances` (after the last round's merge), `batch_size_start` / `batch_size_end`
        ({instance: the per-worker batch that ran} in the instance's first round / in its last round: switch mode
        may run less than the request), `batch_size_next` ({instance: the per-worker request planned for a next
        round}, for the instances that were not merged away; no step ran it),
        `merges` (number of instances merged away), `merge_events` (list of
        `{"outer_step", "survivor", "merged_from"}`), `total_tokens`, `total_samples`, `comm_bytes`,
        `comm_seconds` (summed over instances and rounds), `final_train_loss` (last round's losses
        averaged with weights d_i = b_i × workers(i), ignoring non-finite ones; `None` if none is
        finite), `final_eval_perplexity` with `final_eval_instance` (the merged model's last evaluation
        if there is one, else the best instance at the last evaluated step), `best_eval_perplexity` with
        `best_eval_instance` and `best_eval_step` (the lowest over all evaluations), `wall_seconds` and
        `skipped_rounds` (instance-rounds skipped for non-finite values). The evaluations are those of the first
        eval dataset (`first_dataset_evals`); a model that is not a causal LM has no perplexity.

    Raises:
        FileNotFoundError: no rounds file. ValueError: the rounds file holds no round.
    """
    return summarize_records(load_rounds(output_dir), load_evals(output_dir), output_dir)


def merge_events_of(rounds: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """`{"outer_step", "survivor", "merged_from"}` of every merge in a rounds file's records."""
    return [
        {"outer_step": r["outer_step"], "survivor": r["instance"], "merged_from": list(r["merged_from"])}
        for r in rounds
        if r.get("merged_from")
    ]


def summarize_records(
    rounds: list[dict[str, Any]], evals: list[dict[str, Any]], output_dir: str | os.PathLike
) -> dict[str, Any]:
    """`summarize_run` on records already read with `load_rounds` / `load_evals` (`output_dir` names the run)."""
    if not rounds:
        raise ValueError(f"{Path(output_dir) / ROUNDS_FILE} holds no round yet")
    by_round = group_by_round(rounds)
    first_round, last_round = next(iter(by_round.values())), list(by_round.values())[-1]

    batch_size_start: dict[int, int] = {}
    batch_size_end: dict[int, int] = {}
    batch_size_next: dict[int, int] = {}
    for record in rounds:  # what ran (switch mode may cap a request), and the request planned for a next round
        batch_size_start.setdefault(record["instance"], batch_used(record))
        batch_size_end[record["instance"]] = batch_used(record)
        if record.get("merged_into") is None and record.get("next_batch_size") is not None:
            batch_size_next[record["instance"]] = record["next_batch_size"]
    for event in merge_events_of(rounds):  # an instance merged away has no next round
        for merged in event["merged_from"]:
            batch_size_next.pop(merged, None)

    merge_events = merge_events_of(rounds)

    weighted = [(_demand(r), r["train_loss"]) for r in last_round if is_finite_number(r.get("train_loss"))]
    total_demand = sum(demand for demand, _ in weighted)
    final_train_loss = sum(d * loss for d, loss in weighted) / total_demand if total_demand else None

    scored = [(record, _perplexity(record)) for record in first_dataset_evals(evals)]
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

    elapsed = [r["elapsed_seconds"] for r in rounds if is_finite_number(r.get("elapsed_seconds"))]
    return {
        "output_dir": str(output_dir),
        "rounds": len(by_round),
        "global_step": max(r.get("global_step", 0) for r in rounds),
        "initial_instances": len({r["instance"] for r in first_round}),
        "final_instances": last_round[-1]["num_instances"],
        "batch_size_start": batch_size_start,
        "batch_size_end": batch_size_end,
        "batch_size_next": batch_size_next,
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
        "wall_seconds": max(elapsed, default=None),
        "skipped_rounds": sum(bool(r.get("skipped")) for r in rounds),
    }


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
        if instance in summary.get("batch_size_next", {}):
            row += f" (next round's request: {summary['batch_size_next'][instance]})"
        if instance in merged_into:
            survivor, step = merged_into[instance]
            row += f"  (merged into {survivor} at round {step})"
        batch_rows.append(row)

    loss = summary["final_train_loss"]
    if summary["final_eval_perplexity"] is None:
        perplexity = "none (no evaluation, or not a causal LM)"
    else:
        perplexity = (
            f"final {summary['final_eval_perplexity']:.2f} ({instance_label(summary['final_eval_instance'])}), "
            f"best {summary['best_eval_perplexity']:.2f} ({instance_label(summary['best_eval_instance'])}, "
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
        ("tokens seen", f"{format_count(summary['total_tokens'])} ({format_count(summary['total_samples'])} samples)"),
        ("communicated", f"{format_bytes(summary['comm_bytes'])} in {summary['comm_seconds']:.1f} s"),
        ("final train loss", "n/a (not finite)" if loss is None else f"{loss:.4f}"),
        ("eval perplexity", perplexity),
        ("wall time", "n/a" if wall is None else format_duration(wall)),
        ("skipped rounds", str(summary["skipped_rounds"])),
    ]
    width = max(len(name) for name, _ in rows)
    lines = [f"AdLoCo run: {summary['output_dir']}"]
    lines += [f"  {name:<{width}}  {value}" for name, value in rows]
    return "\n".join(lines)


def summary_line(summary: dict[str, Any]) -> str:
    """`summarize_run`'s dict in one line: what a script prints when training ends (`format_summary` is the table)."""
    parts = [
        f"{summary['rounds']} rounds (step {summary['global_step']})",
        f"instances {summary['initial_instances']} -> {summary['final_instances']}",
        f"{format_count(summary['total_tokens'])} tokens",
        f"{format_bytes(summary['comm_bytes'])} sent",
    ]
    if summary["final_train_loss"] is not None:
        parts.append(f"train loss {summary['final_train_loss']:.4f}")
    if summary["final_eval_perplexity"] is not None:
        label = instance_label(summary["final_eval_instance"])
        parts.append(f"eval perplexity {summary['final_eval_perplexity']:.2f} ({label})")
    output_dir = summary["output_dir"]
    return (
        f"AdLoCo run done: {', '.join(parts)}. Merged model: {os.path.join(output_dir, 'merged')}; the table: "
        f"adloco-hf summary {output_dir}"
    )


def instance_label(instance: Any) -> str:
    """How an evaluation's or a round's `instance` is named for people: "instance 2", "merged model"."""
    return "merged model" if instance == MERGED else f"instance {instance}"
