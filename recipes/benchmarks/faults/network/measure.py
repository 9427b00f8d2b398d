"""A scenario's figures from what its run left (pure): when the fault was named, when training went on, the steps
trained again, the restarts, and the rounds' seconds and batch split around a slowed link.

- fault: the first change of the links (`cut`, `partition`, `slow`); its end: the change that undid it (`restore`,
  `heal`; none for a link down for good or a link left slow).
- detection: the first launch-log line, read after the fault, in which the library names a worker it lost
  (`NAMED`); "seconds to detection" is from the fault to it.
- the first step after the fault: with a restart, the first step the next launch attempt completed; without one, the
  first round's end completed after the fault began (a round's end needs every worker: the round the fault held).
- work lost: the steps trained again, per restart the furthest step of the attempt that failed less the step the
  next one resumed from (every restart summed).
"""

import json
import os
import statistics
from collections.abc import Sequence


__all__ = ["NAMED", "detection", "fault_window", "first_step_after", "round_figures", "summary", "work_lost"]

# What the library prints when it names a lost worker (`common/distributed.py`, `worker/preemption.py`; the peer
# watch, `common/liveness.py`: "worker rank(s) 3 gave no pulse for 45 s").
NAMED = ("WorkerTimeoutError", "gave no pulse")
_FAULTS = ("cut", "partition", "slow")
_UNDO = {"cut": "restore", "partition": "heal", "slow": "unslow"}


def fault_window(events: Sequence) -> tuple[float | None, float | None]:
    """(when the first fault took effect, when the last change undid one; None if nothing was undone), from the
    link changes (`FaultEvent`s or dicts with `time` and `action`)."""
    rows = [(e["time"], e["action"]) if isinstance(e, dict) else (e.time, e.action) for e in events]
    starts = [t for t, action in rows if action in _FAULTS]
    ends = [t for t, action in rows if action in _UNDO.values()]
    return (min(starts) if starts else None), (max(ends) if ends else None)


def detection(lines: Sequence, since: float) -> tuple[float, int, str] | None:
    """The first (time, machine, text) log line read at or after `since` that names a lost worker."""
    for line in lines:
        if line[0] >= since and any(needle in line[2] for needle in NAMED):
            return tuple(line)
    return None


def first_step_after(starts: dict, steps: dict, fault: float, inner_steps: int) -> float | None:
    """When training went on after the fault (module docstring): `starts[attempt][rank]` (the step resumed from) and
    `steps[attempt][rank]` = [(step, time)] are `faults.progress.Progress`'s."""
    fault_attempt = max((a for a, ranks in steps.items() for p in ranks.values() if p and p[0][1] <= fault), default=0)
    later = [a for a in steps if a > fault_attempt]
    if later:
        return min(t for ranks in steps[min(later)].values() for _, t in ranks[:1])
    round_ends = [
        t for ranks in steps.get(fault_attempt, {}).values() for s, t in ranks if t > fault and not s % inner_steps
    ]
    return min(round_ends, default=None)


def work_lost(starts: dict, steps: dict) -> int:
    """Steps trained again over every restart (module docstring)."""
    lost = 0
    for attempt in sorted(steps):
        reached = max((s for points in steps[attempt].values() for s, _ in points), default=None)
        # the next attempt that started training (one that failed before it, as during a partition, is skipped)
        resumed = next((starts[a] for a in sorted(starts) if a > attempt and starts[a]), None)
        if reached is not None and resumed:
            lost += max(0, reached - min(resumed.values()))
    return lost


def round_figures(out: str, since_step: int) -> dict:
    """Around a slowed link, from the rounds file: the mean seconds per round before and after `since_step`
    (elapsed time between rounds' ends) and the last round's per-worker batches (`worker_batch_sizes`)."""
    path = os.path.join(out, "adloco_rounds.jsonl")
    if not os.path.exists(path):
        return {}
    with open(path, encoding="utf-8") as f:
        lines = [json.loads(line) for line in f]
    ends = sorted({(line["global_step"], line["elapsed_seconds"]) for line in lines if "elapsed_seconds" in line})
    before = [b[1] - a[1] for a, b in zip(ends, ends[1:]) if b[0] <= since_step]
    after = [b[1] - a[1] for a, b in zip(ends, ends[1:]) if a[0] >= since_step]
    return {
        "seconds_per_round_before": statistics.fmean(before) if before else None,
        "seconds_per_round_after": statistics.fmean(after) if after else None,
        "last_worker_batch_sizes": next(
            (line.get("worker_batch_sizes") for line in reversed(lines) if line.get("worker_batch_sizes")), None
        ),
    }


def summary(
    *,
    events: Sequence,
    lines: Sequence,
    starts: dict,
    steps: dict,
    inner_steps: int,
    codes: Sequence,
    stopped_at_deadline: bool,
) -> dict:
    """The scenario's row: restarts, seconds to detection and to the first step after the fault, work lost, what the
    user read, and whether it ended by itself."""
    fault, restored = fault_window(events)
    named = None if fault is None else detection(lines, fault)
    after = None if fault is None else first_step_after(starts, steps, fault, inner_steps)
    restarts = max(steps, default=0)
    return {
        "fault_at": fault,
        "restored_at": restored,
        "restarts": restarts,
        "detected_seconds": None if named is None else round(named[0] - fault, 1),
        "named_by_machine": None if named is None else named[1],
        "message": None if named is None else named[2].split("]: ", 1)[-1].strip(),
        "first_step_seconds": None if after is None else round(after - fault, 1),
        "work_lost_steps": work_lost(starts, steps),
        "exit_codes": list(codes),
        "ended_by_itself": not stopped_at_deadline,
    }
