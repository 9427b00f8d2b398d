"""What a round says to people and trackers: its log line, its `adloco/*` values, the run's summary for model
cards, and a merge's `adloco_merge.json`."""

import math
from typing import Any

from ..common.formats import format_bytes
from ..instances.table import Instance, MergePlan
from .rows import RoundLine
from .state import AdLoCoState


__all__ = ["merge_record", "round_logs", "round_message", "run_summary"]


def run_summary(state: AdLoCoState, world_size: int, processes_per_worker: int = 1) -> dict[str, Any]:
    """The run in a few numbers, for model cards (`world_size`: the processes of the launch). The requests for a next
    round are left out: no step ran them (a card adds the batch that ran, from the rounds file)."""
    summary = {
        "rounds": state.rounds,
        "steps per worker": state.last_round_step,  # the global step; H is the settings' inner_steps
        "workers": world_size // processes_per_worker,
        "instances at the end": state.num_instances,
        "merges": state.merges,
        "tokens": state.tokens,
        "bytes communicated": state.comm_bytes,
        "skipped rounds": state.skipped_rounds,
    }
    if processes_per_worker > 1:
        summary["processes per worker"] = processes_per_worker
    return summary


def round_message(lines: list[RoundLine], num_instances: int, merge: MergePlan | None) -> str:
    """The one log line of a round, e.g. `round 3 (step 60) | instances 2 | batch i0=4→6 | loss 5.1 | sent 3.8 MiB`:
    each instance's request this round and the request planned for its next (`_batch_text`)."""
    batches = ", ".join(_batch_text(line) for line in lines)
    losses = [line.train_loss for line in lines if line.train_loss is not None]
    message = (
        f"round {lines[0].outer_step} (step {lines[0].global_step}) | instances {num_instances} | "
        f"batch {batches} | loss {min(losses) if losses else float('nan'):.4f} | "
        f"sent {format_bytes(sum(line.comm_bytes for line in lines))}"
    )
    if merge is not None:
        message += f" | merged {merge.merged}→{merge.survivor} (weights {merge.weights[0]:.2f}/{merge.weights[1]:.2f})"
    skipped = [line for line in lines if line.skipped]
    if skipped:
        in_a_row = ", ".join(f"i{line.instance}: {line.skipped_in_a_row} in a row" for line in skipped)
        message += f" | SKIPPED (non-finite) {[line.instance for line in skipped]} ({in_a_row})"
    return message


def _batch_text(line: RoundLine) -> str:
    """`i0=4→6`: the request this round, and the one planned for the next (after this round's merge); `i0=10 ran
    8→12` where switch mode capped the request; `i1=4→merged` for an instance merged away at the round's end."""
    ran = "" if line.batch_size_used == line.batch_size else f" ran {line.batch_size_used}"
    after = "merged" if line.merged_into is not None else str(line.next_batch_size)
    return f"i{line.instance}={line.batch_size}{ran}→{after}"


def round_logs(lines: list[RoundLine], state: AdLoCoState, instances: list[Instance]) -> dict[str, float]:
    """The `adloco/*` values a round adds to the Trainer's logs (TensorBoard, W&B, ...).

    `adloco/batch_size` is the mean per-worker request for the next round, over all workers; per instance,
    `batch_size_used` is what each of its workers ran in this round and `next_batch_size` its request for the next.
    """
    world_size = sum(len(i.workers) for i in instances)
    demand = {inst.id: inst.demand for inst in instances}
    logs = {
        "adloco/round": state.rounds,
        "adloco/num_instances": state.num_instances,
        "adloco/batch_size": sum(i.batch_size * len(i.workers) for i in instances) / world_size,
        "adloco/comm_bytes": state.comm_bytes,
        "adloco/tokens": state.tokens,
        "adloco/skipped_rounds": state.skipped_rounds,
    }
    variances = [(line.grad_variance, demand.get(line.instance, 0.0)) for line in lines]
    finite = [(v, d) for v, d in variances if v is not None and math.isfinite(v)]
    if finite and sum(d for _, d in finite) > 0:
        logs["adloco/grad_variance"] = sum(v * d for v, d in finite) / sum(d for _, d in finite)
    for line in lines:
        prefix = f"adloco/instance_{line.instance}"
        logs[f"{prefix}/batch_size_used"] = line.batch_size_used
        logs[f"{prefix}/next_batch_size"] = line.next_batch_size
        if line.train_loss is not None and math.isfinite(line.train_loss):
            logs[f"{prefix}/train_loss"] = line.train_loss
        if line.outer_noise is not None:
            logs[f"{prefix}/outer_noise"] = line.outer_noise
    return logs


def merge_record(plan: MergePlan, outer_step: int) -> dict[str, Any]:
    """`adloco_merge.json` of a merge folder (DESIGN §4): instances, demands and weights in the same order."""
    return {
        "outer_step": outer_step,
        "instances": [plan.survivor, plan.merged],
        "demands": list(plan.demands),
        "weights": list(plan.weights),
        "survivor": plan.survivor,
    }
