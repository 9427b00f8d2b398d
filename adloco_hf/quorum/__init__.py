"""Live recovery's round quorum, on torchft (issue 52; `pip install 'adloco_hf[ft]'`).

The engine that lets the workers that are alive go on training when one dies, and lets a worker that starts late or
restarts join the next round with a live peer's state. Each worker is a torchft replica group (its own launch); the
workers agree once per round, where AdLoCo's workers must agree anyway (the outer step):

- `requirement.py`: torchft, imported where it is needed, with an error that names the extra when it is missing;
- `lighthouse.py`: the lighthouse every worker asks who is alive (torchft's `LighthouseServer`, its settings named
  in our words);
- `round_quorum.py`: one worker's membership of a round (`RoundQuorum`): the round's members and their process
  group, healing from a peer, the weighted average of the members' tensors, and whether the round committed.

Not yet used by `AdLoCoTrainer`: today's training still ends every worker when one fails and restarts from a
checkpoint (docs/faults.md). The worker's collectives move onto `RoundQuorum` in a later step.
"""

from typing import TYPE_CHECKING

from ..common.lazy import lazy_exports


if TYPE_CHECKING:
    from .lighthouse import LighthouseSettings, start_lighthouse
    from .requirement import import_torchft
    from .round_quorum import RoundMembers, RoundQuorum, replica_id

__all__ = ["LighthouseSettings", "RoundMembers", "RoundQuorum", "import_torchft", "replica_id", "start_lighthouse"]
__getattr__ = lazy_exports(
    __name__,
    {
        "LighthouseSettings": ".lighthouse",
        "start_lighthouse": ".lighthouse",
        "import_torchft": ".requirement",
        "RoundMembers": ".round_quorum",
        "RoundQuorum": ".round_quorum",
        "replica_id": ".round_quorum",
    },
)
