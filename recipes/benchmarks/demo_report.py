"""Run the demo (`make demo`) and write down what it did: docs/results/demo_run.json, docs/results/demo_run.png, the README's lines.

    python -m recipes.benchmarks.demo_report                           # the demo (about 3 minutes), then the files
    python -m recipes.benchmarks.demo_report --from_run outputs/demo   # the files from a finished demo, no launch

The demo is launched exactly as `make demo` launches it (`DEMO_COMMAND`, into outputs/demo, which is replaced). The
results file holds the demo's config (recipes/configs/demo.yaml as read), the machine, the wall times, every round of
every instance and every evaluation, and the highlights the README quotes: how far the batch grew, when switch mode
capped and when it accumulated, the merges and what they did to the per-worker batch, the merged model's perplexity.
The README's paragraph between `README_BEGIN` and `README_END` is `render_markdown(results)`;
tests/docs/test_demo_run.py checks that the README holds exactly it and that the recorded config is demo.yaml's.
"""

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import textwrap
import time
from datetime import date
from typing import Any

import yaml

from adloco_hf.common.files import atomic_write_text
from adloco_hf.common.formats import format_count
from adloco_hf.reporting.plotting import plot_run
from adloco_hf.reporting.run_log import MERGED, is_finite_number, load_evals, load_rounds

from ._common import REPO


__all__ = [
    "DEMO_COMMAND",
    "README_BEGIN",
    "README_END",
    "build_results",
    "highlights",
    "main",
    "parse_args",
    "readme_section",
    "render_markdown",
    "replace_readme_section",
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
README = "README.md"
README_BEGIN = "<!-- demo-run:begin: written by `make demo-report` from docs/results/demo_run.json; do not edit by hand -->"
README_END = "<!-- demo-run:end -->"
WIDTH = 118  # the README's line length
ROUND_KEYS = ("outer_step", "global_step", "instance", "workers", "batch_size", "next_batch_size", "micro_batch_size",
              "accumulation_steps", "merged_from", "num_instances", "total_tokens")  # fmt: skip


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--from_run", default=None, help="a finished demo's output_dir: write the files from it instead of launching"
    )
    parser.add_argument("--repo", default=REPO, help=argparse.SUPPRESS)  # where docs/ and README.md are (tests)
    return parser.parse_args(argv)


def duration(seconds: float) -> str:
    """125.4 → "2 min 5 s", 42 → "42 s"."""
    minutes, rest = divmod(int(round(seconds)), 60)
    return f"{minutes} min {rest} s" if minutes else f"{rest} s"


def _round(value: Any, digits: int) -> Any:
    return round(float(value), digits) if is_finite_number(value) else None


def build_results(output_dir: str, config: dict, *, launch_seconds: float | None, workers: int) -> dict[str, Any]:
    """The results file's content, from a finished demo in `output_dir` (plain JSON values only)."""
    rows = []
    for record in load_rounds(output_dir):
        row = {key: record.get(key) for key in ROUND_KEYS}
        row["train_loss"] = _round(record.get("train_loss"), 4)
        row["noise_scale"] = _round(record.get("noise_scale"), 2)
        row["elapsed_seconds"] = _round(record.get("elapsed_seconds"), 1)
        rows.append(row)
    evals = [
        {
            "global_step": record.get("global_step"),
            "instance": record.get("instance"),
            "eval_loss": _round(record.get("eval_loss"), 4),
            "eval_perplexity": _round(record.get("eval_perplexity"), 2),
        }
        for record in load_evals(output_dir)
    ]
    train_seconds = None
    train_results = os.path.join(output_dir, "train_results.json")
    if os.path.isfile(train_results):
        with open(train_results, encoding="utf-8") as file:
            train_seconds = _round(json.load(file).get("train_runtime"), 1)
    results = {
        "command": " ".join(DEMO_COMMAND),
        "config": config,
        "workers": workers,
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "date": date.today().isoformat()},
        "launch_seconds": _round(launch_seconds, 1),
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
                "request_before": [row["next_batch_size"], len(row["workers"])],  # per worker, on that many workers
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
        "first_accumulation": _pick(accumulated[0], "outer_step", "instance", "batch_size", "accumulation_steps")
        if accumulated
        else None,
        "most_accumulation": _pick(most, "batch_size", "accumulation_steps") if most else None,
        "merges": merges,
        "final_perplexity": merged[-1]["eval_perplexity"] if merged else None,
        "first_eval_step": first_step,
        "first_eval_best_perplexity": min(first) if first else None,
    }


def _pick(row: dict[str, Any], *keys: str) -> dict[str, Any]:
    return {key: row[key] for key in keys}


def render_markdown(results: dict[str, Any]) -> str:
    """The README's paragraph on the demo run (between the markers), from the results file."""
    h, config = results["highlights"], results["config"]
    limit = config["max_batch_size"]
    times = []
    if results["train_seconds"] is not None:
        times.append(f"{duration(results['train_seconds'])} of training")
    if results["launch_seconds"] is not None:
        times.append(f"{duration(results['launch_seconds'])} for the whole launch (start, evaluations and saves)")
    cpus = results["machine"]["cpus"]
    lines = [
        f"The demo's last run ([docs/results/demo_run.json](docs/results/demo_run.json), {results['machine']['date']}): "
        f"{results['workers']} workers, {h['rounds']} rounds of {config['inner_steps']} inner steps, "
        f"{format_count(h['tokens'])} tokens, {' and '.join(times) or 'no time recorded'} on {cpus} shared CPU cores.",
        "",
        f"* **Batch growth.** The norm test (η = {config['eta']:g}) grows the requests from {h['initial_request']} to "
        f"{h['largest_request']} samples per worker"
        + (" (`batch_size_cap`)" if h["largest_request"] == config.get("batch_size_cap") else "")
        + f"; instance {h['largest_request_instance']} asks for it after round {h['largest_request_round']}.",
    ]
    switch = f"* **Switch mode** (`max_batch_size` {limit}, `switch_threshold` {config['switch_threshold']:g}):"
    if h["capped_requests"]:
        low, high = h["capped_requests"]
        span = f"{low}" if low == high else f"{low} to {high}"
        switch += f" requests of {span} ran capped at {limit} samples in one pass;"
    if h["first_accumulation"]:
        first, most = h["first_accumulation"], h["most_accumulation"]
        switch += (
            f" from round {first['outer_step']} on, requests above {h['accumulates_above']:g} ran whole as accumulated "
            f"micro-batches of at most {limit} ({first['batch_size']} samples as {first['accumulation_steps']}, "
            f"{most['batch_size']} as {most['accumulation_steps']})."
        )
    else:
        switch += f" no request went above {h['accumulates_above']:g}, so nothing was accumulated."
    lines.append(switch)
    if h["merges"]:
        rounds = [str(m["round"]) for m in h["merges"]]
        counts = [str(h["merges"][0]["instances_after"] + len(h["merges"][0]["merged_from"]))]
        counts += [str(m["instances_after"]) for m in h["merges"]]
        merged = (
            f"* **Merges.** {' → '.join(counts)} instances at rounds "
            f"{', '.join(rounds[:-1]) + ' and ' + rounds[-1] if len(rounds) > 1 else rounds[0]}"
        )
        falls = [m for m in h["merges"] if m["request_after"] and m["request_after"][1] > m["request_before"][1]]
        if falls and config.get("merge_batch_rule", "preserve_total") == "preserve_total":
            m = max(falls, key=lambda m: m["request_before"][0] / m["request_after"][0])
            (before, n_before), (after, n_after) = m["request_before"], m["request_after"]
            merged += (
                f'. A merged instance keeps its total batch (`merge_batch_rule="preserve_total"`), so its request '
                f"per worker falls as it gains workers (round {m['round']}: {before} on {n_before} worker"
                f"{'s' if n_before > 1 else ''} → {after} on {n_after})"
            )
            later = [r["next_batch_size"] for r in results["rounds"] if r["instance"] == m["survivor"]]
            if later and later[-1] > after:
                merged += f", and the test grows it again (to {later[-1]} after the last round)"
        lines.append(merged + ".")
    if h["final_perplexity"] is not None:
        line = f"* **Perplexity** of the merged model on the held-out files: {h['final_perplexity']:.1f}"
        if h["first_eval_best_perplexity"] is not None:
            line += f" (at step {h['first_eval_step']}, the best instance's: {h['first_eval_best_perplexity']:.1f})"
        lines.append(line + ".")
    wrapped = [textwrap.fill(line, WIDTH, subsequent_indent="  " if line.startswith("* ") else "") for line in lines]
    return "\n".join(wrapped)


def readme_section(text: str) -> str:
    """The README's text between the markers (without them); a clear error when they are missing."""
    if README_BEGIN not in text or README_END not in text:
        raise ValueError(f"{README} has no demo section: put the lines {README_BEGIN!r} and {README_END!r} around it")
    return text[text.index(README_BEGIN) + len(README_BEGIN) : text.index(README_END)].strip("\n")


def replace_readme_section(text: str, section: str) -> str:
    readme_section(text)  # the markers are there
    start, end = text.index(README_BEGIN) + len(README_BEGIN), text.index(README_END)
    return text[:start] + "\n" + section + "\n" + text[end:]


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


def launch_demo(repo: str) -> float:
    """`make demo`'s launch into a fresh outputs/demo; the wall seconds it took."""
    with open(os.path.join(repo, CONFIG), encoding="utf-8") as file:
        output_dir = os.path.join(repo, yaml.safe_load(file)["output_dir"])
    if os.path.isdir(output_dir):
        print(f"removing the previous demo run {output_dir}", flush=True)
        shutil.rmtree(output_dir)
    accelerate = os.path.join(os.path.dirname(sys.executable), "accelerate")
    command = [accelerate if os.path.exists(accelerate) else "accelerate", *DEMO_COMMAND[1:]]
    print("running", " ".join(command), flush=True)
    start = time.perf_counter()
    subprocess.run(command, cwd=repo, check=True)
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    repo = args.repo
    with open(os.path.join(repo, CONFIG), encoding="utf-8") as file:
        config = yaml.safe_load(file)
    with open(os.path.join(repo, ACCELERATE_CONFIG), encoding="utf-8") as file:
        workers = yaml.safe_load(file)["num_processes"]
    launch_seconds = None
    output_dir = args.from_run
    if output_dir is None:
        launch_seconds = launch_demo(repo)
        output_dir = os.path.join(repo, config["output_dir"])
    results = build_results(output_dir, config, launch_seconds=launch_seconds, workers=workers)
    os.makedirs(os.path.join(repo, os.path.dirname(RESULTS)), exist_ok=True)
    atomic_write_text(os.path.join(repo, RESULTS), dump(results))
    plot_run(output_dir, os.path.join(repo, PLOT))
    readme = os.path.join(repo, README)
    with open(readme, encoding="utf-8") as file:
        text = file.read()
    section = render_markdown(results)
    with open(readme, "w", encoding="utf-8") as file:
        file.write(replace_readme_section(text, section))
    print(section)
    print(f"wrote {RESULTS}, {PLOT} and the demo section of {README}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
