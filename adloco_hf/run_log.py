"""The run's JSON-lines files: `adloco_rounds.jsonl` (one line per instance per round) and `adloco_eval.jsonl`."""

import json
import math
import os
from typing import Any

from .checkpoint import atomic_write_text


__all__ = ["EVAL_FILE", "ROUNDS_FILE", "ROUND_KEYS", "RunLog"]

ROUNDS_FILE = "adloco_rounds.jsonl"
EVAL_FILE = "adloco_eval.jsonl"
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
        """A fresh run starts empty files; a resumed run keeps only what happened up to its checkpoint."""
        os.makedirs(self.output_dir, exist_ok=True)
        if resumed_outer_step is None:
            for path in (self.rounds_path, self.eval_path):
                atomic_write_text(path, "")
            return
        self._truncate(self.rounds_path, lambda line: line.get("outer_step", 0) <= resumed_outer_step)
        self._truncate(self.eval_path, lambda line: line.get("global_step", 0) <= resumed_global_step)

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
