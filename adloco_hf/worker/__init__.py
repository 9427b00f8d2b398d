"""`Worker`: one process's part of AdLoCo (its instance, its round), with DDP or FSDP inside a worker.

- `core.py`: the `Worker` itself, its state and the end of training (the final merge);
- `start.py`: the set-up once training begins; `initialise.py`: initial weights and the largest micro-batch;
- `steps.py`: the batch plan and the inner steps; `round_end.py`: the end of a round;
- `resume.py`: the state a checkpoint holds, and how it is restored; `preemption.py`: stopping on SIGTERM;
- `groups.py`: the process groups; `replica.py`: how a worker's processes hold its replica, `ddp.py` or `fsdp.py`.
"""

import importlib
from typing import TYPE_CHECKING


if TYPE_CHECKING:
    from .core import Worker

__all__ = ["Worker"]
# Loaded on first use: importing a light module of this folder (e.g. `worker.preemption`) must not pull in the whole worker.
_LAZY = {"Worker": ".core"}


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
