"""The results file of a finished demo: its config, the machine, the wall times, every round and evaluation, and the
highlights the README quotes (computed from the rounds and evaluations alone, so a test can recompute them)."""

import json
import os
import platform
from datetime import date
from typing import Any

from adloco_hf.inspection import MERGED, is_finite_number, load_evals, load_rounds


__all__ = [
    "ACCELERATE_CONFIG",
    "CONFIG",
    "DEMO_COMMAND",
    "PLOT",
    "RESULTS",
    "ROUND_KEYS",
    "build_results",
    "dump",
    "highlights",
]

CONFIG = "recipes/configs/demo.yaml"
ACCELERATE_CONFIG = "accelerate_configs/cpu_4_workers.yaml"
# `make demo`'s command, run from the repository root.
DEMO_COMMAND = (
    "accelerate",
    "launch",
    "--config_file",
    ACCELERATE_CONFIG,
    "recipes/pretrain_c4.py",
    "--config",
    CONFIG,
)
RESULTS = "docs/results/demo_run.json"
PLOT = "docs/results/demo_run.png"
ROUND_KEYS = ("outer_step", "global_step", "instance", "workers", "batch_size", "next_batch_size", "micro_batch_size",
              "accumulation_steps", "merged_from", "num_instances", "total_tokens")  # fmt: skip


def rounded(value: Any, digits: int) -> Any:
    """`value` rounded to `digits`, or None for a value that is not a finite number."""
    return round(float(value), digits) if is_finite_number(value) else None


def build_results(output_dir: str, config: dict, *, launch_seconds: float | None, workers: int) -> dict[str, Any]:
    """The results file's content, from a finished demo in `output_dir` (plain JSON values only)."""
    rows = []
    for record in load_rounds(output_dir):
        row = {key: record.get(key) for key in ROUND_KEYS}
        row["train_loss"] = rounded(record.get("train_loss"), 4)
        row["noise_scale"] = rounded(record.get("noise_scale"), 2)
        row["elapsed_seconds"] = rounded(record.get("elapsed_seconds"), 1)
        rows.append(row)
    evals = [
        {
            "global_step": record.get("global_step"),
            "instance": record.get("instance"),
            "eval_loss": rounded(record.get("eval_loss"), 4),
            "eval_perplexity": rounded(record.get("eval_perplexity"), 2),
        }
        for record in load_evals(output_dir)
    ]
    train_seconds = None
    train_results = os.path.join(output_dir, "train_results.json")
    if os.path.isfile(train_results):
        with open(train_results, encoding="utf-8") as file:
            train_seconds = rounded(json.load(file).get("train_runtime"), 1)
    results = {
        "command": " ".join(DEMO_COMMAND),
        "config": config,
        "workers": workers,
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "date": date.today().isoformat()},
        "launch_seconds": rounded(launch_seconds, 1),
        "train_seconds": train_seconds,
        "rounds": rows,
        "evals": evals,
    }
    results["highlights"] = highlights(results)
    return json.loads(json.dumps(results))  # exactly what the file will read back


def highlights(results: dict[str, Any]) -> dict[str, Any]:
    """What the README quotes, from the results' rounds and evaluations alone (the test recomputes it)."""
    rows, config = results["rounds"], results["config"]
    limit, gamma = config["max_batch_size"], config["switch_threshold"]
    largest = max(row["next_batch_size"] for row in rows)
    reached = next(row for row in rows if row["next_batch_size"] == largest)
    capped = [row for row in rows if row["accumulation_steps"] == 1 and row["batch_size"] > row["micro_batch_size"]]
    accumulated = [row for row in rows if row["accumulation_steps"] > 1]
    by_step = {(row["outer_step"], row["instance"]): row for row in rows}
    merges = []
    for row in rows:
        if not row["merged_from"]:
            continue
        after = by_step.get((row["outer_step"] + 1, row["instance"]))
        merges.append(
            {
                "round": row["outer_step"],
                "survivor": row["instance"],
                "merged_from": row["merged_from"],
                "instances_after": row["num_instances"],
                # per worker, on that many workers: the batch of the merge round (its next_batch_size is already the
                # merged instance's plan), then the batch of the round after it
                "request_before": [row["batch_size"], len(row["workers"])],
                "request_after": None if after is None else [after["batch_size"], len(after["workers"])],
            }
        )
    evals = [e for e in results["evals"] if e["eval_perplexity"] is not None]
    merged = [e for e in evals if e["instance"] == MERGED]
    first_step = min((e["global_step"] for e in evals), default=None)
    first = [e["eval_perplexity"] for e in evals if e["global_step"] == first_step and e["instance"] != MERGED]
    last = rows[-1]
    most = max(accumulated, key=lambda r: r["accumulation_steps"]) if accumulated else None
    return {
        "rounds": last["outer_step"],
        "steps": last["global_step"],
        "tokens": max(row["total_tokens"] for row in rows),
        "initial_request": config["per_device_train_batch_size"],
        "largest_request": largest,
        "largest_request_round": reached["outer_step"],
        "largest_request_instance": reached["instance"],
        "capped_requests": [min(r["batch_size"] for r in capped), max(r["batch_size"] for r in capped)]
        if capped
        else None,
        "accumulates_above": gamma * limit,
        "first_accumulation": pick(accumulated[0], "outer_step", "instance", "batch_size", "accumulation_steps")
        if accumulated
        else None,
        "most_accumulation": pick(most, "batch_size", "accumulation_steps") if most else None,
        "merges": merges,
        "final_perplexity": merged[-1]["eval_perplexity"] if merged else None,
        "first_eval_step": first_step,
        "first_eval_best_perplexity": min(first) if first else None,
    }


def pick(row: dict[str, Any], *keys: str) -> dict[str, Any]:
    return {key: row[key] for key in keys}


def dump(results: dict[str, Any]) -> str:
    """The results as JSON: indented, with one line per round and per evaluation."""
    items = []
    for key, value in results.items():
        if key in ("rounds", "evals"):
            body = "[\n" + ",\n".join("    " + json.dumps(item) for item in value) + "\n  ]"
        else:
            body = json.dumps(value, indent=2).replace("\n", "\n  ")
        items.append(f"  {json.dumps(key)}: {body}")
    return "{\n" + ",\n".join(items) + "\n}\n"
