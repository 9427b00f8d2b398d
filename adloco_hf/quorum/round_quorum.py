"""`RoundQuorum`: one worker's membership of a round, on torchft's `Manager`.

A round under live recovery, on every worker that is alive:

1. [`RoundQuorum.begin_round`]: ask the lighthouse who is alive (torchft's quorum), reconfigure the quorum's process
   group over them, and, where this worker is behind (it started late or restarted), take a live peer's state first
   (healing: the `state_dict` and `load_state_dict` given to it, sent by torchft's checkpoint transport). Returns the
   round's [`RoundMembers`]: the workers, their group, the round number they agreed on.
2. The round's collectives, on `members.group` only, each through [`RoundQuorum.collective`] so that a failure (a
   member died) marks the round as failed instead of raising: e.g. [`RoundQuorum.weighted_average`],
   [`RoundQuorum.gather`] (the members' reports), or the outer step's average with [`RoundQuorum.agree`] (which
   also votes).
3. [`RoundQuorum.commit`]: True when every member's collectives of the round succeeded (torchft's `should_commit`,
   itself a vote of all members); then the round number advances. On False the round's results are dropped by every
   member alike, and the next `begin_round` leaves out whoever died.

The process group has one process per worker (the worker's first process: `rank` 0 of its launch); the averages are
ours, not `Manager.allreduce` (which sums in the tensors' dtype and then divides: in bf16 not today's average).
"""

import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from .requirement import import_torchft


__all__ = ["RoundMembers", "RoundQuorum", "replica_id"]


def replica_id(worker_id: int) -> str:
    """The torchft replica id of worker `worker_id`: zero-padded, so that torchft's ordering of the ids (as strings)
    is the workers' order."""
    if worker_id < 0:
        raise ValueError(f"worker_id={worker_id}: set an integer >= 0")
    return f"worker{worker_id:05d}"


@dataclass(frozen=True)
class RoundMembers:
    """The workers of one round, as the quorum formed it.

    Attributes:
        workers: their ids, ascending (this worker's included).
        group: their process group (one process per worker), reconfigured for this quorum.
        round_number: the round they agreed on: the rounds committed so far by the most advanced member.
        healed: whether this worker took a peer's state at the start of this round.
    """

    workers: tuple[int, ...]
    group: Any
    round_number: int
    healed: bool

    @property
    def size(self) -> int:
        return len(self.workers)


class RoundQuorum:
    """Worker `worker_id`'s membership of the rounds of a job, under the lighthouse at `lighthouse`.

    Args:
        worker_id: this worker's id (its place in the job; a restarted worker keeps its id).
        lighthouse: the lighthouse's address (`start_lighthouse(...).address()`).
        state_dict: what a peer that heals from this worker receives (called between rounds).
        load_state_dict: applies what this worker receives when it heals.
        min_workers: the fewest workers a round may have.
        timeout: how long a collective, a quorum or a connection may take before the round fails (`worker_timeout`:
            above the lighthouse's `join_timeout`, so that a quorum's wait for a late worker ends first).
        hostname: the address peers reach this worker's store and checkpoint server at.
    """

    def __init__(
        self,
        worker_id: int,
        *,
        lighthouse: str,
        state_dict: Callable[[], dict[str, Any]],
        load_state_dict: Callable[[dict[str, Any]], None],
        min_workers: int = 1,
        timeout: float = 1800.0,
        hostname: str = "127.0.0.1",
    ):
        torchft = import_torchft()
        from torchft.process_group import ProcessGroupGloo

        self.worker_id = worker_id
        self.lighthouse, self.min_workers, self.timeout = lighthouse, min_workers, timeout
        self._healed = False

        def heal(state: dict[str, Any]) -> None:
            self._healed = True
            load_state_dict(state)

        limit = timedelta(seconds=timeout)
        # The worker's own store (torchft's per-replica-group store; its process group's rendezvous goes there).
        self.store = dist.TCPStore(hostname, 0, is_master=True, wait_for_workers=False, timeout=limit)
        self.group = ProcessGroupGloo(timeout=limit)
        self.manager = torchft.Manager(
            pg=self.group,
            load_state_dict=heal,
            state_dict=state_dict,
            min_replica_size=min_workers,
            use_async_quorum=False,  # every member of a round runs it whole: a healing worker first heals
            timeout=limit,
            quorum_timeout=limit,
            connect_timeout=limit,
            rank=0,
            world_size=1,
            store_addr=hostname,
            store_port=self.store.port,
            lighthouse_addr=lighthouse,
            replica_id=replica_id(worker_id),
            hostname=hostname,
            init_sync=False,  # a fresh job's workers start from the same seed: nothing to fetch at round 0
        )

    def begin_round(self, *, wait_for: int = 1) -> RoundMembers:
        """Join the next round's quorum (blocking; healing first where this worker is behind). With `wait_for`, ask
        again until the quorum has at least that many workers: a fresh job's first round waits for all of its workers,
        which start at their own pace (the lighthouse forms a quorum of those that have started), so that nothing
        fails and no worker heals in a job whose workers all start."""
        deadline = time.monotonic() + self.timeout
        while True:
            members = self._join()
            if members.size >= wait_for:
                return members
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"worker {self.worker_id}: the round quorum has {members.size} of the {wait_for} workers it waits "
                    f"for after {self.timeout:g} s ({list(members.workers)}); start the others, or wait for fewer"
                )
            time.sleep(0.05)

    def _join(self) -> RoundMembers:
        self._healed = False
        try:
            self.manager.start_quorum()
        except TimeoutError as error:
            raise TimeoutError(
                f"worker {self.worker_id}: no round quorum within {self.timeout:g} s: is the lighthouse at "
                f"{self.lighthouse} reachable, and are at least min_workers={self.min_workers} workers running? ({error})"
            ) from error
        members = torch.zeros(self.manager.num_participants(), dtype=torch.int64)
        mine = torch.tensor([self.worker_id], dtype=torch.int64)
        if not self.collective(lambda: dist.all_gather(list(members.split(1)), mine, group=self.group)):
            members = mine  # the round failed already: commit() says so; no collective of it counts
        return RoundMembers(
            workers=tuple(sorted(int(w) for w in members)),
            group=self.group,
            round_number=self.manager.current_step(),
            healed=self._healed,
        )

    def collective(self, call: Callable[[], Any]) -> bool:
        """Run one collective of the round on its group: False (the round is failed, and `commit` says so) when a
        member died or the group broke, instead of raising."""
        if self.manager.errored() is not None:
            return False
        try:
            call()
        except Exception as error:  # gloo's errors of a lost peer are RuntimeErrors of many kinds
            self.manager.report_error(error)
            return False
        return True

    def agree(self, average: Callable[[], None]) -> bool:
        """Run the round's average (a collective on the members' group, e.g. the outer step's: `GlobalModel.outer_step`'s
        `agree`) and vote: True when every member's average succeeded, so all of them apply it or none does."""
        self.collective(average)
        return self.commit()

    def weighted_average(self, tensor: torch.Tensor, weight: float) -> torch.Tensor | None:
        """The members' average of `tensor` weighted by their `weight` (e.g. the samples each trained), in float32,
        or None when the round failed. Every member passes a tensor of the same shape."""
        buffer = torch.cat([tensor.detach().reshape(-1).float() * float(weight), torch.tensor([float(weight)])])
        if not self.collective(lambda: dist.all_reduce(buffer, group=self.group)):
            return None
        return (buffer[:-1] / buffer[-1]).reshape(tensor.shape)

    def gather(self, obj: Any) -> list[Any] | None:
        """Every member's `obj` (picklable; e.g. its report of the round), in the members' order, or None when the
        round failed."""
        gathered: list[Any] = [None] * self.manager.num_participants()
        if not self.collective(lambda: dist.all_gather_object(gathered, obj, group=self.group)):
            return None
        return gathered

    def commit(self) -> bool:
        """Whether the round counts: every member's collectives succeeded (a vote of all members). True advances
        the round number."""
        return bool(self.manager.should_commit())

    def shutdown(self) -> None:
        """Leave the job: stop the manager's servers (the lighthouse sees the heartbeats stop)."""
        self.manager.shutdown(wait=True)
