"""Where a fault test or a fault benchmark breaks a real run on purpose: the library's functions it may wrap.

A fault harness (the fault benchmarks' `recipes/benchmarks/toolkit/worker/faults.py` and `kills.py`, which the test
suite's worker uses too) kills, hangs or fails a worker at a chosen point of a run: inside a checkpoint's save, at a
round's end, in a merge. Each point is one function of the library, replaced in the worker process before training
by [`wrap`]. This table is the one place that knows where each lives, so the folders inside the package can move
without breaking a harness (`recipes/` reads the package only through its public surface: `tests/test_layout.py`).

| point | the function wrapped (its arguments) |
|---|---|
| `"save_rank_state"` | one rank's state written into a checkpoint's staging folder `(checkpoint_dir, rank, state)` |
| `"save_model_folder"` | a model folder written, the final `merged/` among them `(folder, model, **kwargs)` |
| `"merge_at_round_end"` | a merge of instances at a round's end |
| `"final_merge"` | the merge of every instance at the end of training |
| `"outer_step"` | a worker's outer step (`OuterSync.round_end`: its all-reduce) `(self, step, instance, weight)` |
| `"round_end"` | a worker's whole round end (`RoundEnd.run`) `(self, global_step)` |

Besides: [`atomic_directory`] (how the library writes a folder: a harness dies halfway through one), and the
preemption protocol's waits shortened ([`set_preemption_timings`]) or watched ([`stop_requested`]).

Example:
```python
>>> import os
>>> from adloco_hf import fault_points
>>> def die_in_checkpoint_20(save):  # doctest: +SKIP
...     def dying(checkpoint_dir, rank, state):
...         if checkpoint_dir.endswith("checkpoint-20"):
...             os._exit(9)
...         return save(checkpoint_dir, rank, state)
...     return dying
>>> fault_points.wrap("save_rank_state", die_in_checkpoint_20)  # doctest: +SKIP
```

Nothing is imported before a point is wrapped: a launcher that imports this module stays light.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from .common.files import atomic_directory


__all__ = ["POINTS", "atomic_directory", "set_preemption_timings", "stop_requested", "wrap"]

# point → (module, attribute path in it): where the function lives that every caller reaches through that module.
POINTS = {
    "save_rank_state": ("adloco_hf.trainer.staged_save", "save_rank_state"),
    "save_model_folder": ("adloco_hf.checkpoint.folders", "save_model_folder"),
    "merge_at_round_end": ("adloco_hf.instances.merges", "merge_at_round_end"),
    "final_merge": ("adloco_hf.instances.merges", "final_merge"),
    "outer_step": ("adloco_hf.worker.outer_sync", "OuterSync.round_end"),
    "round_end": ("adloco_hf.worker.round_end", "RoundEnd.run"),
}


def wrap(point: str, wrapper: Callable[[Callable[..., Any]], Callable[..., Any]]) -> None:
    """Replace the function at `point` (a key of `POINTS`) with `wrapper(the function now there)`, in this process.

    Wrapping a point twice nests the wrappers: the last one runs first.
    """
    if point not in POINTS:
        raise ValueError(f"no fault point {point!r}: choose one of {sorted(POINTS)}")
    module, path = POINTS[point]
    *owners, name = path.split(".")
    owner: Any = importlib.import_module(module)
    for attribute in owners:
        owner = getattr(owner, attribute)
    setattr(owner, name, wrapper(getattr(owner, name)))


def set_preemption_timings(*, poll_seconds: float | None = None, agree_seconds: float | None = None) -> None:
    """Shorten the preemption protocol's waits in this process (None: left as they are).

    Args:
        poll_seconds: how often a worker without a signal looks for another's stop request (1 s; 0: after every
            step, so that a stop inside the round comes at a step a test can predict).
        agree_seconds: how long a worker waits for the others to post their steps beyond two polls and three step
            times, before it stops at the round's end instead (1 s; longer for a slow, loaded machine).
    """
    from .worker import preemption

    preemption.set_timings(poll_seconds=poll_seconds, agree_seconds=agree_seconds)


def stop_requested(store) -> bool:
    """Whether a worker has posted a stop request in `store` (the job's key-value store: the default group's)."""
    from .worker import preemption

    return preemption.stop_requested(store)
