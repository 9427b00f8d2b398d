"""Writing a benchmark's results: Markdown tables, JSON files (atomic, as the library writes its own), the report.

Pure Python (no torch): `tests/recipes/benchmarks/test_toolkit.py` checks it on synthetic inputs.
"""

import json
import math
import os
from collections.abc import Sequence
from typing import Any

from adloco_hf.inspection import atomic_write_text, format_bytes


__all__ = ["human_bytes", "read_json", "table", "write_json", "write_report"]


def human_bytes(n: float | None) -> str:
    """The library's byte formatter (binary units, as the run log and summary print them); `-` for a missing value."""
    return "-" if n is None else format_bytes(n)


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        if not math.isfinite(value):
            return str(value)
        if abs(value) >= 1000:
            return f"{value:,.0f}"
        if abs(value) >= 10:
            return f"{value:.1f}"
        return f"{value:.3f}"
    return str(value)


def table(rows: Sequence[dict[str, Any]], columns: Sequence[str]) -> str:
    """A GitHub-flavoured Markdown table: `columns` in order, one line per row, missing cells as '-'."""
    cells = [[_cell(row.get(c)) for c in columns] for row in rows]
    widths = [max([len(c), *(len(r[i]) for r in cells)]) for i, c in enumerate(columns)]
    lines = [
        "| " + " | ".join(c.ljust(w) for c, w in zip(columns, widths)) + " |",
        "|" + "|".join("-" * (w + 2) for w in widths) + "|",
    ]
    lines += ["| " + " | ".join(v.rjust(w) for v, w in zip(r, widths)) + " |" for r in cells]
    return "\n".join(lines)


def write_json(path: str, obj: Any) -> None:
    """Write JSON atomically (the library's `atomic_write_text`): a reader never sees half a file."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    atomic_write_text(path, json.dumps(obj, indent=2, allow_nan=True) + "\n")


def read_json(path: str) -> Any | None:
    """A JSON file's content, or None when there is no such file."""
    if not os.path.exists(path):
        return None
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def write_report(output_dir: str, report: str) -> str:
    """The report as the benchmark prints it: into `output_dir/table.md`, then on stdout. Returns the file's path."""
    path = os.path.join(output_dir, "table.md")
    with open(path, "w", encoding="utf-8") as f:
        f.write(report + "\n")
    print(report)
    return path
