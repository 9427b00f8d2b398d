"""`Worker`: one process's part of AdLoCo (its instance, its round), with DDP or FSDP inside a worker.

- `core.py`: the `Worker` itself, its state and the end of training (the final merge);
- `settings.py`: what the worker reads of the config, once (`WorkerSettings`);
- `start.py`: the set-up once training begins; `initialise.py`: initial weights and the largest micro-batch;
- `steps.py`: the batch plan and the inner steps; `round_end.py`: the end of a round;
- `resume.py`: the state a checkpoint holds, and how it is restored; `preemption.py`: stopping on SIGTERM;
- `groups.py`: the process groups; `replica.py`: how a worker's processes hold its replica, `ddp.py` or `fsdp.py`.
"""

from typing import TYPE_CHECKING

from ..common.lazy import lazy_exports


if TYPE_CHECKING:
    from .core import Worker

__all__ = ["Worker"]
__getattr__ = lazy_exports(__name__, {"Worker": ".core"})
