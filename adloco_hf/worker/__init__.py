"""`Worker`: one process's part of AdLoCo, made of parts that own their state, with DDP or FSDP inside a worker.

- `core.py`: the `Worker`: the Trainer's calls, composed of the parts below;
- `settings.py`: what the worker reads of the config, once (`WorkerSettings`);
- `round_state.py`: the rounds so far, the instance table and this worker's plan (`RoundState`);
- `inner_steps.py`: one inner step under the round's plan: chunks, statistics, tally, timings (`InnerSteps`);
- `plan_follower.py`: the sampler and the inner optimizer follow the plan (`PlanFollower`);
- `outer_sync.py`: the outer step and Streaming DiLoCo's fragment syncs (`OuterSync`);
- `merging.py`: this worker's side of merges and of the final merge (`WorkerMerges`);
- `round_end.py`: the end of a round, in order (`RoundEnd`);
- `start.py`: the parts made (or restored) when training begins; `saved_state.py`: a checkpoint's worker state;
- `training.py`: what the Trainer hands over (`TrainingObjects`); `initialise.py`: initial weights and the largest
  micro-batch; `preemption.py`: stopping on SIGTERM;
- `groups.py`: the process groups; `replicas/`: how a worker's processes hold its replica (`replica.py`), `ddp.py` or `fsdp.py`.
"""

from typing import TYPE_CHECKING

from ..common.lazy import lazy_exports


if TYPE_CHECKING:
    from .core import Worker

__all__ = ["Worker"]
__getattr__ = lazy_exports(__name__, {"Worker": ".core"})
