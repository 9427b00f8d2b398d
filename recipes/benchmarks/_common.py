"""Helpers shared by the benchmarks: socket byte counters, curve interpolation, ratios, tables and JSON output.

Everything here is pure Python (no torch), so `tests/recipes/test_benchmarks.py` checks it on synthetic inputs. Launching
workers (`free_port`, `launch_command`, `run_workers`) is `adloco_hf.testing`'s, shared with the test suite.
"""

import json
import math
import os
import re
import shutil
import statistics
import subprocess
from collections.abc import Mapping, Sequence
from typing import Any

from adloco_hf.common.files import atomic_write_text
from adloco_hf.common.formats import format_bytes
from adloco_hf.outer.step import ring_all_reduce_bytes  # one byte model for DDP and AdLoCo alike


__all__ = [
    "REPO",
    "RESUMED_ROUND_KEYS",
    "choose_targets",
    "first_reach",
    "human_bytes",
    "interpolate_curve",
    "median_spread",
    "nice_ceiling",
    "parse_ss_bytes_sent",
    "ratio",
    "ring_all_reduce_bytes",
    "socket_bytes_sent",
    "start_broadcast_bytes",
    "table",
    "write_json",
]

# The repository root: benchmarks run their workers from it, with it on PYTHONPATH.
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# The rounds-file keys that a resumed run must reproduce exactly (timings and bytes of the wire may differ): what the
# fault benchmarks and the test suite's resume checks (`tests/helpers.py::COMPARED_ROUND_KEYS`) compare.
RESUMED_ROUND_KEYS = (
    "outer_step", "instance", "workers", "batch_size", "next_batch_size", "samples", "train_loss", "grad_variance",
    "pseudo_grad_norm", "merged_from", "num_instances", "worker_batch_sizes",
)  # fmt: skip


def start_broadcast_bytes(world_size: int, parameters: int, dtype_bytes: int = 4) -> int:
    """Bytes of the broadcast at the start of a run: rank 0 sends its weights to every other worker once (DDP's
    module sync, AdLoCo's initialisation), `(world_size − 1) × parameters × dtype_bytes`."""
    return max(world_size - 1, 0) * parameters * dtype_bytes


_PID = re.compile(r"pid=(\d+)")
_BYTES_SENT = re.compile(r"\bbytes_sent:(\d+)")


def parse_ss_bytes_sent(text: str) -> dict[int, int]:
    """Sum `bytes_sent` per owning process over the sockets of `ss -tinpH` output.

    `ss -tinpH` prints one line per socket (state, queues, addresses, `users:(("name",pid=N,fd=F),...)`) followed,
    with `-i`, by one indented line of TCP info that holds `bytes_sent:B` once the socket has sent anything. A socket
    shared by several processes counts for each of them. Sockets without a `users:` field (owned by another user, or
    `ss` run without `-p`) are ignored.

    Returns:
        `{pid: bytes sent}` over the sockets currently open.
    """
    totals: dict[int, int] = {}
    owners: list[int] = []
    for line in text.splitlines():
        if not line.strip():
            continue
        if not line[0].isspace():  # a socket line: remember its owners until its info line
            owners = sorted({int(p) for p in _PID.findall(line)}) if "users:(" in line else []
            for pid in owners:
                totals.setdefault(pid, 0)
            # Some ss builds print the info on the same line when the output is not a terminal.
            match = _BYTES_SENT.search(line)
        else:
            match = _BYTES_SENT.search(line)
        if match and owners:
            for pid in owners:
                totals[pid] += int(match.group(1))
            owners = []
    return totals


def socket_bytes_sent(pid: int | None = None) -> int | None:
    """Bytes sent so far over the TCP sockets that process `pid` (default: this one) has open, from `ss -tinpH`.

    Returns None when `ss` is missing or fails. Bytes of sockets closed in the meantime are not counted: measure
    before and after a section during which the process groups' sockets stay open.
    """
    pid = os.getpid() if pid is None else pid
    if shutil.which("ss") is None:
        return None
    try:
        out = subprocess.run(["ss", "-tinpH"], capture_output=True, text=True, timeout=30, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return parse_ss_bytes_sent(out).get(pid, 0)


def interpolate_curve(curve: Sequence[Sequence[float]], x: float) -> float | None:
    """Perplexity at `x` tokens on a curve of `[tokens, perplexity]` points, or None outside its range.

    Interpolates the loss (log-perplexity) linearly in tokens, which is how the Trainer's loss evolves between two
    evaluations far better than the perplexity itself. Points need not be sorted; a repeated x keeps the last one.
    """
    points = {}
    for tokens, ppl in curve:
        if ppl is not None and math.isfinite(ppl) and ppl > 0:
            points[float(tokens)] = float(ppl)
    xs = sorted(points)
    if not xs or x < xs[0] or x > xs[-1]:
        return None
    for left, right in zip(xs, xs[1:]):
        if left <= x <= right:
            if right == left:
                return points[right]
            t = (x - left) / (right - left)
            return math.exp((1 - t) * math.log(points[left]) + t * math.log(points[right]))
    return points[xs[-1]]


def first_reach(points: Sequence[Mapping], target: float, fields: Mapping[str, str]) -> dict | None:
    """Where a run's eval curve first reaches perplexity `target` (eval_ppl <= target), or None if it never does.

    `points` are the run's evaluations in order (dicts with `"eval_ppl"` and the keys named in `fields`), the first
    one usually the initial model. Between the two evaluations around the crossing every field is interpolated
    linearly, at the fraction where log-perplexity crosses `log(target)`. Returns `{name: value}` for `fields`
    (`{output name: point key}`); a field missing on either point is None. Non-finite perplexities are skipped.
    """
    points = [
        p for p in points if p.get("eval_ppl") is not None and math.isfinite(p["eval_ppl"]) and p["eval_ppl"] > 0
    ]
    for i, point in enumerate(points):
        if point["eval_ppl"] > target:
            continue
        before = points[i - 1] if i else point
        span = math.log(before["eval_ppl"]) - math.log(point["eval_ppl"])
        t = 1.0 if span <= 0 else (math.log(before["eval_ppl"]) - math.log(target)) / span
        out = {}
        for name, key in fields.items():
            a, b = before.get(key), point.get(key)
            out[name] = None if a is None or b is None else a + t * (b - a)
        return out
    return None


def nice_ceiling(x: float) -> float:
    """`x` rounded up to two significant digits (187.3 -> 190, 1234 -> 1300, 9.71 -> 9.8)."""
    if x <= 0 or not math.isfinite(x):
        return x
    step = 10 ** (math.floor(math.log10(x)) - 1)
    return math.ceil(round(x / step, 9)) * step


def choose_targets(best_ppls: Sequence[float], factors: Sequence[float] = (1.3, 1.1, 1.0)) -> list[float]:
    """Target perplexities that every run reaches, from each run's best (lowest) perplexity: the worst of those
    bests, and `factors` above it, each rounded up to two significant digits; highest first, no repeats."""
    best = [p for p in best_ppls if p is not None and math.isfinite(p)]
    if not best:
        return []
    worst_best = max(best)
    return sorted({nice_ceiling(worst_best * f) for f in factors}, reverse=True)


def ratio(value: float | None, reference: float | None) -> float | None:
    """`value / reference`, or None when either is missing or the reference is 0 or not finite."""
    if value is None or reference is None:
        return None
    if not math.isfinite(reference) or reference == 0 or not math.isfinite(value):
        return None
    return value / reference


def median_spread(values: Sequence[float]) -> dict[str, float]:
    """Median, min, max, and the half-width of the inter-quartile range relative to the median (a robust spread)."""
    if not values:
        raise ValueError("median_spread needs at least one value")
    data = sorted(float(v) for v in values)
    median = statistics.median(data)
    if len(data) >= 4:
        q1, _, q3 = statistics.quantiles(data, n=4, method="inclusive")
    else:
        q1, q3 = data[0], data[-1]
    return {
        "median": median,
        "min": data[0],
        "max": data[-1],
        "iqr_half_rel": (q3 - q1) / 2 / abs(median) if median else math.inf,
        "n": len(data),
    }


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
