"""The README's paragraph on the demo, rendered from the results file, and the README's section that holds it."""

import textwrap
from typing import Any

from adloco_hf.inspection import format_count


__all__ = [
    "README",
    "README_BEGIN",
    "README_END",
    "WIDTH",
    "duration",
    "readme_section",
    "render_markdown",
    "replace_readme_section",
]

README = "README.md"
README_BEGIN = (
    "<!-- demo-run:begin: written by `make demo-report` from docs/results/demo_run.json; do not edit by hand -->"
)
README_END = "<!-- demo-run:end -->"
WIDTH = 118  # the README's line length


def duration(seconds: float) -> str:
    """125.4 → "2 min 5 s", 42 → "42 s"."""
    minutes, rest = divmod(int(round(seconds)), 60)
    return f"{minutes} min {rest} s" if minutes else f"{rest} s"


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
