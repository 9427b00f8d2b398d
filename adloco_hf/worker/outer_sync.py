"""`OuterSync`: a worker's side of the outer step: its instance's φ and outer optimizer ([`GlobalModel`]), synced
over the instance's process groups at a round's end, after every inner step with Streaming DiLoCo's fragments, and
every fragment at once before a merge and at the end of training."""

import math

from ..instances.table import Instance
from ..outer.step import GlobalModel, OuterStepResult, ring_all_reduce_bytes
from ..outer.streaming_diloco import FragmentTally
from .groups import WorkerGroups
from .replicas.replica import ReplicaParallel
from .training import TrainingObjects


__all__ = ["OuterSync"]


class OuterSync:
    """The outer step of this process's worker (module docstring).

    Args:
        global_model: φ of this worker's instance, its outer SGD and its all-reduce.
        groups: where this process sits and its groups (the outer all-reduce's own with `outer_overlap`).
        replica: how the worker's processes hold the replica (FSDP's shards are resharded before φ is read).
        training: the model and inner optimizer (cleaned after a skipped average).
    """

    def __init__(
        self, global_model: GlobalModel, groups: WorkerGroups, replica: ReplicaParallel, training: TrainingObjects
    ):
        self.global_model = global_model
        self.groups = groups
        self.replica = replica
        self.training = training

    def _group(self, instance: Instance):
        return self.groups.outer.get(self.groups.cross(instance.workers))

    def after_step(self, step: int, instance: Instance, *, offset: int, inner_steps: int) -> None:
        """Streaming DiLoCo (`num_fragments`), after every inner step on every rank: the fragment average due now is
        applied and the fragment due is sent (`outer/streaming_diloco.py`; fragment 0 is the round end's), `offset`
        steps into a round of `inner_steps`. A skipped average (non-finite) leaves clean inner-optimizer moments, as
        a skipped round does. Nothing without fragments."""
        streaming = self.global_model.streaming
        if streaming is None:
            return
        self.replica.reshard(self.training.model)  # FSDP: the fragments are read from and written into the shards
        skipped = streaming.after_step(
            step,
            offset=offset,
            inner_steps=inner_steps,
            group=self._group(instance),
            num_workers=len(instance.workers),
        )
        if skipped:
            self.training.clean_optimizer()

    def round_end(self, step: int, instance: Instance, weight: float | None) -> OuterStepResult:
        """The outer step inside `instance` at the end of a round (step `step`), this worker's pseudo-gradient
        weighing `weight` in the average (None: the plain mean)."""
        self.replica.reshard(self.training.model)  # φ is written into the sharded parameters
        group, workers = self._group(instance), len(instance.workers)
        if self.global_model.streaming is not None:
            result = self._fragments_round_end(step, group, workers)
        else:
            result = self.global_model.outer_step(group=group, num_workers=workers, weight=weight)
        if result.skipped or not result.local_finite:
            self.training.clean_optimizer()
        return result

    def _fragments_round_end(self, step: int, group, num_workers: int) -> OuterStepResult:
        """Streaming DiLoCo: fragment 0 is sent (and applied when τ = 0), and the round's fragment syncs are reported
        as one outer step: the norm of the averages applied in it, the bytes sent, the seconds the training thread
        spent in sends and applies; Σ ‖Δ_w‖² (for the outer noise) only when τ = 0, where the averages applied in a
        round are those of the fragments it sent."""
        streaming = self.global_model.streaming
        tally, _ = streaming.end_round(step, group=group, num_workers=num_workers)
        return OuterStepResult(
            pseudo_grad_norm=math.hypot(*tally.norms) if tally.norms else 0.0,
            payload_bytes=tally.payload_bytes,
            seconds=tally.seconds,
            skipped=tally.skipped,
            local_sq_norm=tally.local_sq_norm if streaming.delay == 0 else math.nan,
        )

    def flush(self, step: int, instance: Instance, worker_id: int) -> tuple[int, FragmentTally | None]:
        """Streaming DiLoCo: every fragment that trained on since it was sent is synced once more, so that φ holds
        every step's work (before a merge and at the end of training). Returns its ring bytes, counted once per
        instance (on its first worker's processes), and its `FragmentTally`; (0, None) without fragments."""
        streaming = self.global_model.streaming
        if streaming is None:
            return 0, None
        done = streaming.flush(step, group=self._group(instance), num_workers=len(instance.workers))
        first = worker_id == instance.first_worker
        return (ring_all_reduce_bytes(done.payload_bytes, len(instance.workers)) if first else 0), done

    def settle_before_merge(self, instance: Instance, worker_id: int) -> tuple[int, bool]:
        """Before a merge every worker of each instance must hold the same φ: the average in flight applied
        (overlapped outer steps), or with fragments every fragment synced at once (their bytes and seconds are the
        merge's). Returns the bytes sent and whether an average was skipped (the inner optimizer is cleaned then)."""
        streaming = self.global_model.streaming
        if streaming is not None:
            flushed, done = self.flush(streaming.step, instance, worker_id)
            skipped = done.skipped
        else:
            flushed, skipped = 0, self.global_model.settle()
        if skipped:
            self.training.clean_optimizer()
        return flushed, skipped
