"""The run's JSON-lines files, written and read: `adloco_rounds.jsonl` and `adloco_eval.jsonl` (DESIGN §4), and
`adloco_resumes.jsonl` (one line per elastic resume: a resume with another number of workers, `checkpoint/elastic.py`),
and `adloco_startup_profile.json` (the goodput rule's startup profile, `batch/startup_profile.py`, and the first
requests it gave).

Global rank 0 writes both into the run's `output_dir`: one line per instance per round to `adloco_rounds.jsonl`
(the keys of `ROUND_KEYS` and a few more) and one line per evaluation to `adloco_eval.jsonl`, whose `instance` is
an int id or `MERGED` for a merged model: the final one (`final`: true; lines written before `final` existed are
final ones too) or, with `eval_merged_model`, the merge of the instances evaluated while they train (`final`:
false). JSON has no NaN, so non-finite numbers are written as `null`.

Reading needs neither torch nor a process group: `load_rounds` and `load_evals` work on a finished run, on one
still training, and on one that crashed in the middle of writing a line.
"""

import json
import math
import os
import warnings
from collections import defaultdict
from pathlib import Path
from typing import Any

from ..common.files import atomic_write_text


__all__ = [
    "EVAL_FILE",
    "MERGED",
    "PROFILE_FILE",
    "RESUMES_FILE",
    "ROUNDS_FILE",
    "ROUND_KEYS",
    "RunLog",
    "group_by_round",
    "is_finite_number",
    "load_evals",
    "load_rounds",
]

ROUNDS_FILE = "adloco_rounds.jsonl"
EVAL_FILE = "adloco_eval.jsonl"
RESUMES_FILE = "adloco_resumes.jsonl"
PROFILE_FILE = "adloco_startup_profile.json"
MERGED = "merged"  # the `instance` of a merged model's evaluation lines (`final`: false while training)
# The keys of DESIGN §4 (contract); lines carry a few more (tokens, total_tokens, elapsed_seconds, skipped, ...).
ROUND_KEYS = (
    "outer_step",
    "global_step",
    "instance",
    "workers",
    "num_instances",
    "batch_size",
    "next_batch_size",
    "micro_batch_size",
    "accumulation_steps",
    "samples",
    "train_loss",
    "grad_variance",
    "grad_sq_norm",
    "pseudo_grad_norm",
    "comm_bytes",
    "comm_seconds",
    "merged_from",
)


def _clean(value: Any) -> Any:
    """JSON has no NaN: non-finite floats become null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    return value


class RunLog:
    """Appends lines to the run files; only the writing rank (global rank 0) creates one."""

    def __init__(self, output_dir: str):
        self.output_dir = output_dir
        self.rounds_path = os.path.join(output_dir, ROUNDS_FILE)
        self.eval_path = os.path.join(output_dir, EVAL_FILE)

    def start(self, *, resumed_outer_step: int | None, resumed_global_step: int | None) -> None:
        """A fresh run starts empty files; a resumed run keeps only what happened up to its checkpoint (the final
        merged model's evaluation comes after the last one: a run resumed from it evaluates the merged model again;
        the merges evaluated while training, `final`: false, are kept like the instances' lines)."""
        os.makedirs(self.output_dir, exist_ok=True)
        if resumed_outer_step is None:
            for path in (self.rounds_path, self.eval_path):
                atomic_write_text(path, "")
            return
        self._truncate(self.rounds_path, lambda line: line.get("outer_step", 0) <= resumed_outer_step)
        self._truncate(
            self.eval_path,
            lambda line: (
                line.get("global_step", 0) <= resumed_global_step
                and (line.get("instance") != MERGED or line.get("final") is False)
            ),
        )

    @staticmethod
    def _truncate(path: str, keep) -> None:
        if not os.path.exists(path):
            atomic_write_text(path, "")
            return
        kept = []
        with open(path, encoding="utf-8") as f:
            for raw in f:
                try:
                    line = json.loads(raw)
                except json.JSONDecodeError:
                    continue  # a line cut short by the interrupted run
                if keep(line):
                    kept.append(raw if raw.endswith("\n") else raw + "\n")
        atomic_write_text(path, "".join(kept))

    def _append(self, path: str, lines: list[dict[str, Any]]) -> None:
        with open(path, "a", encoding="utf-8") as f:
            for line in lines:
                f.write(json.dumps(_clean(line)) + "\n")
            f.flush()
            os.fsync(f.fileno())

    def write_rounds(self, lines: list[dict[str, Any]]) -> None:
        self._append(self.rounds_path, lines)

    def write_eval(self, lines: list[dict[str, Any]]) -> None:
        self._append(self.eval_path, lines)

    def record_profile(self, record: dict[str, Any]) -> None:
        """Write the startup profile the goodput rule decides from (replaced by a later start of the run)."""
        os.makedirs(self.output_dir, exist_ok=True)
        atomic_write_text(os.path.join(self.output_dir, PROFILE_FILE), json.dumps(_clean(record), indent=1))

    def record_resume(self, line: dict[str, Any]) -> None:
        """Append an elastic resume to `adloco_resumes.jsonl` (kept across resumes: the run's history)."""
        self._append(os.path.join(self.output_dir, RESUMES_FILE), [line])


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

    Global rank 0 writes each round's lines in instance order; the sort also orders files that were assembled
    or edited by hand.

    Args:
        output_dir: the run's `output_dir`.

    Returns:
        The records as written (`null` → `None`, `NaN` → `float("nan")`).

    Raises:
        FileNotFoundError: the directory holds no `adloco_rounds.jsonl`.
        ValueError: a line other than the last is not a JSON object.
    """
    path = Path(output_dir) / ROUNDS_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found: is {output_dir} the output_dir of an AdLoCo run?")
    records = _read_jsonl(path)
    return sorted(records, key=lambda record: (record["outer_step"], record["instance"]))


def load_evals(output_dir: str | os.PathLike) -> list[dict[str, Any]]:
    """Read `adloco_eval.jsonl`: one dict per evaluation, ordered by global step; `[]` when there is none.

    `instance` is an int id, or `MERGED` (`"merged"`) for a merged model: the final one, or (`final` false) the
    instances' merge evaluated while training (`eval_merged_model`).
    """
    path = Path(output_dir) / EVAL_FILE
    if not path.is_file():
        return []
    return sorted(_read_jsonl(path), key=lambda record: record.get("global_step", 0))


def group_by_round(rounds: list[dict[str, Any]]) -> dict[int, list[dict[str, Any]]]:
    """`load_rounds`'s records grouped by outer step, in increasing order: {outer_step: [one per instance]}."""
    grouped: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for record in rounds:
        grouped[record["outer_step"]].append(record)
    return dict(sorted(grouped.items()))


def is_finite_number(value: Any) -> bool:
    """Whether a logged value is a usable number (not missing, `null`, NaN, infinite or a bool)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
