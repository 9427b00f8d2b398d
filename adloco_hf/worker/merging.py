"""`WorkerMerges`: a worker's side of merges: the merge a round's decision planned, and the final merge.

The merges themselves (who sends what, the weighted average) are `instances/merges.py`'s; this part hands them this
worker's pieces: its place, φ and inner optimizer, the monitor that bounds every wait, and what a sharded worker
gathers before rank 0 writes.
"""

import time
from collections.abc import Callable

from ..common.clock import Clock
from ..common.distributed import WorkerMonitor
from ..common.logs import get_logger
from ..instances import merges as merging
from ..instances.health import final_merge_warnings
from ..instances.merge_settings import MergePlace
from ..instances.merges import MergeResult
from ..instances.table import MergePlan, instance_of
from .groups import WorkerGroups
from .inner_steps import InnerSteps
from .outer_sync import OuterSync
from .replicas.replica import ReplicaParallel
from .round_state import RoundState
from .settings import WorkerSettings
from .training import TrainingObjects


__all__ = ["WorkerMerges"]

logger = get_logger(__name__)


class WorkerMerges:
    """Merges as one worker process takes part in them.

    Args:
        settings: the worker's settings (`merges`: transport, payload, saving).
        groups: where this process sits and the run's process groups.
        monitor: bounds every wait by `worker_timeout` and names a lost worker.
        outer: the outer step (φ, settled or flushed before a merge).
        replica: DDP or FSDP inside the worker (the optimizer a merge moves, what rank 0 writes).
        training: the model and inner optimizer.
        steps: the inner steps (a worker that changes instance forgets its kept gradient).
        hint: what to do after a lost worker.
        clock: the clock of the worker's timings, told what each merge sent (`Clock.merge`).
    """

    def __init__(
        self,
        settings: WorkerSettings,
        groups: WorkerGroups,
        monitor: WorkerMonitor,
        outer: OuterSync,
        replica: ReplicaParallel,
        training: TrainingObjects,
        steps: InnerSteps,
        hint: Callable[[], str],
        clock: Clock,
    ):
        self.settings = settings
        self.groups = groups
        self.monitor = monitor
        self.outer = outer
        self.replica = replica
        self.training = training
        self.steps = steps
        self.hint = hint
        self.clock = clock

    def at_round_end(self, plan: MergePlan, rounds: RoundState) -> MergeResult:
        """Carry out the merge `plan` decided at the end of round `rounds.outer_step` (every rank, same order)."""
        # Overlapped outer steps: every worker applies its instance's average in flight first, so that the workers
        # of each instance hold the same φ (all ranks merge in the same round, so all of them settle here).
        # Fragments: a merge is a point where every fragment is synced: each instance applies the average in flight
        # and syncs at once every fragment that trained on since it was sent, so the merged φ holds every step's
        # work; its bytes and seconds are the merge's.
        groups, global_model = self.groups, self.outer.global_model
        started = time.perf_counter()
        instance = rounds.instance_of(groups.worker_id)
        flushed, _ = self.outer.settle_before_merge(instance, groups.worker_id)
        flush_seconds = time.perf_counter() - started
        model = self.training.model
        result, changed_instance = merging.merge_at_round_end(
            plan,
            f"merge at round {rounds.outer_step}",
            place=MergePlace(
                groups.worker_id,
                rank=groups.rank,
                local_rank=groups.local_rank,
                layout=groups.layout,
                groups=groups.cache,  # every rank creates the merge's groups here, in the same order
            ),
            settings=self.settings.merges,
            global_model=global_model,
            inner_optimizer=self.replica.merge_optimizer(self.training.optimizer),
            monitor=self.monitor,
            hint=self.hint,
            gather=self.replica.merge_gather(
                lambda flat: self.replica.full_save_state(model, global_model.views_of(flat))
            ),
            before=(flushed, flush_seconds),
        )
        self.clock.merge(round_number=rounds.outer_step, sent_bytes=result.rank_bytes)
        if changed_instance:
            self.steps.collector.forget()  # its kept gradient belongs to the old instance's weights
        if instance_of(plan.after, groups.worker_id).workers != instance.workers or changed_instance:
            global_model.reset_error_feedback()  # the residual belonged to the old ring
        rounds.totals.merges += 1
        return result

    def final(self, rounds: RoundState) -> None:
        """Turn the surviving instances into one model on every worker (collective; idempotent)."""
        if rounds.final_merged:
            return
        groups, global_model = self.groups, self.outer.global_model
        if groups.rank == 0:
            for warning in final_merge_warnings(rounds.instances):
                logger.warning(warning)
        self.replica.reshard(self.training.model)  # φ is written into the sharded parameters
        instance = rounds.instance_of(groups.worker_id)
        with self.monitor.watch("final merge", self.hint):
            flushed, _ = self.outer.flush(rounds.last_synced_step, instance, groups.worker_id)
            global_model.settle()  # overlapped: the last round's average, so every instance's workers agree
            several = groups.processes_per_worker > 1
            sent = merging.final_merge(
                rounds.instances,
                rank=groups.worker_id,
                global_model=global_model,
                group=self.monitor.message_group,
                layout=groups.layout if several else None,
                local_rank=groups.local_rank,
                broadcast_group=groups.all_workers if several else None,
            )
        rows = self.monitor.gather_rows([sent + flushed], "final merge", self.hint)
        rounds.totals.comm_bytes += int(sum(r[0] for r in rows))
        rounds.final_merged = True
