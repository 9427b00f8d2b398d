"""The end of a round (`Worker.end_round`), every `inner_steps` inner steps, on every rank in the same order.

1. The outer step inside the instance (all-reduce of the pseudo-gradient), and this worker's `WorkerReport`.
2. One all-gather of every worker's report; `rounds.decide_round` then decides the same on every rank: next batch
   sizes, a merge if one is due, the next round's H, a failure after too many skipped rounds.
3. The merge if due, the round's lines (totals, elapsed time) and the next round's batch plan.
4. Rank 0 writes the round's lines to `adloco_rounds.jsonl` and the console.
"""

import math
import time

import torch

from ..batch.size_tests import GradientStatistics
from ..common.logs import get_logger
from ..instances import merges as merging
from ..instances.health import SkippedRoundsError
from ..instances.merges import MergeResult
from ..instances.table import MergePlan, instance_of
from ..outer.step import OuterStepResult
from ..rounds.decision import RoundDecision, decide_round
from ..rounds.log_lines import round_message
from ..rounds.rows import RoundLine, WorkerReport
from ..rounds.state import RoundResult
from ..rounds.tally import RoundTally


__all__ = ["RoundEnd"]

logger = get_logger(__name__)


class RoundEnd:
    """`Worker.end_round` and its steps (a part of [`Worker`], which holds the state they change)."""

    def end_round(self, global_step: int) -> RoundResult:
        """Outer step, decisions from the all-gathered reports, merge if due, logs (every rank, same order)."""
        where = f"round {self.outer_step + 1} (step {global_step})"
        self.monitor.check(where, self.resume_hint)
        self.replica.reshard(self._model)  # φ is written into the sharded parameters
        self.outer_step += 1
        report = self._outer_step(global_step)
        rows = self.monitor.gather_rows(report.to_row(), f"{where}, reports", self.resume_hint)
        reports = [WorkerReport.from_row(row) for row in rows]
        decision = decide_round(
            self.instances,
            reports,
            outer_step=self.outer_step,
            global_step=global_step,
            rules=self.rules,
            inner_steps=self.inner_steps,
        )
        merge = self._merge_if_due(decision)
        self.instances = decision.instances
        if merge is not None:
            self.process_groups.refresh(self.instances)
        lines = self._round_lines(decision, reports, global_step)
        self._apply_plan()
        self._tally = RoundTally()
        self.last_synced_step = global_step
        self._next_inner_steps(decision.next_inner_steps, lines)
        if self.rank == 0:
            self._log_round(lines, decision, merge)
        if decision.failure is not None:  # every rank decides it alike, so all of them stop here
            raise SkippedRoundsError(f"{decision.failure} {self.resume_hint()}")
        return RoundResult(lines=lines, merge=merge, preempted=any(r.preempt for r in reports))

    def _outer_step(self, global_step: int) -> WorkerReport:
        """The outer step inside this worker's instance, and the round as this process reports it."""
        inst = self.instance
        started = self.clock()
        group = self.outer_groups.get(self.process_groups.cross(inst.workers))
        if self.global_model.streaming is not None:
            result = self._fragments_round_end(global_step, group, len(inst.workers))
        else:
            result = self.global_model.outer_step(
                group=group, num_workers=len(inst.workers), weight=self.sample_weight()
            )
        if result.skipped or not result.local_finite:
            self._clean_inner_optimizer()
        tally = self._tally
        stats = tally.stats if self.replica.reports_statistics else None
        return WorkerReport(
            instance=inst.id,
            stats=stats or GradientStatistics.missing(),
            loss_sum=float(tally.loss_sum),
            loss_steps=tally.loss_steps,
            samples=tally.samples,
            tokens=float(tally.tokens),
            pseudo_grad_norm=result.pseudo_grad_norm,
            payload_bytes=result.payload_bytes,
            comm_seconds=result.seconds,
            outer_seconds=self.clock() - started,
            skipped=result.skipped,
            preempt=self.preemption.requested,
            local_sq_norm=result.local_sq_norm,
            step_seconds=tally.seconds,
            timing=tally.timing,
        )

    def _fragments_round_end(self, global_step: int, group, num_workers: int) -> OuterStepResult:
        """Streaming DiLoCo: fragment 0 is sent (and applied when τ = 0), and the round's fragment syncs are reported
        as one outer step: the norm of the averages applied in it, the bytes sent, the seconds the training thread
        spent in sends and applies; Σ ‖Δ_w‖² (for the outer noise) only when τ = 0, where the averages applied in a
        round are those of the fragments it sent."""
        streaming = self.global_model.streaming
        tally, _ = streaming.end_round(global_step, group=group, num_workers=num_workers)
        return OuterStepResult(
            pseudo_grad_norm=math.hypot(*tally.norms) if tally.norms else 0.0,
            payload_bytes=tally.payload_bytes,
            seconds=tally.seconds,
            skipped=tally.skipped,
            local_sq_norm=tally.local_sq_norm if streaming.delay == 0 else math.nan,
        )

    def _clean_inner_optimizer(self) -> None:
        """After a skipped round, non-finite inner-optimizer moments would poison every later step: zero them."""
        for values in self._optimizer.state.values():
            for value in values.values():
                if torch.is_tensor(value) and value.is_floating_point():
                    torch.nan_to_num_(value, nan=0.0, posinf=0.0, neginf=0.0)

    def _merge_if_due(self, decision: RoundDecision) -> MergeResult | None:
        """The decided merge, its traffic and time on the surviving instance's line."""
        if decision.merge is None:
            return None
        merge = self._merge(decision.merge)
        survivor = decision.lines[merge.plan.survivor]
        survivor.comm_bytes += merge.bytes
        survivor.merge_bytes = merge.bytes
        survivor.merge_seconds = merge.seconds
        return merge

    def _merge(self, plan: MergePlan) -> MergeResult:
        # Overlapped outer steps: every worker applies its instance's average in flight first, so that the workers
        # of each instance hold the same φ (all ranks merge in the same round, so all of them settle here).
        # Fragments: a merge is a point where every fragment is synced: each instance applies the average in flight
        # and syncs at once every fragment that trained on since it was sent, so the merged φ holds every step's
        # work; its bytes and seconds are the merge's.
        started = time.perf_counter()
        streaming = self.global_model.streaming
        if streaming is not None:
            flushed, done = self._flush_fragments(streaming.step)
            skipped = done.skipped
        else:
            flushed, skipped = 0, self.global_model.settle()
        if skipped:
            self._clean_inner_optimizer()
        flush_seconds = time.perf_counter() - started
        workers_before = self.instance.workers
        result, changed_instance = merging.merge_at_round_end(
            plan,
            f"merge at round {self.outer_step}",
            rank=self.worker_id,
            global_model=self.global_model,
            inner_optimizer=self.replica.merge_optimizer(self._optimizer),
            with_momentum=self.settings.outer.with_momentum,
            save=self.settings.save_merges,
            monitor=self.monitor,
            hint=self.resume_hint,
            transport=self.settings.merge_transport,
            payload=self.settings.merge_payload,
            block_size=self.settings.outer.compression_block_size,
            groups=self.groups,  # every rank creates the merge's groups here, in the same order
            layout=self.layout,
            local_rank=self.local_rank,
            global_rank=self.rank,
            gather=self.replica.merge_gather(self.full_save_state),
            before=(flushed, flush_seconds),
        )
        if changed_instance:
            self.collector.forget()  # its kept gradient belongs to the old instance's weights
        if instance_of(plan.after, self.worker_id).workers != workers_before or changed_instance:
            self.global_model.reset_error_feedback()  # the residual belonged to the old ring
        self.totals.merges += 1
        return result

    def _round_lines(self, decision: RoundDecision, reports: list[WorkerReport], global_step: int) -> list[RoundLine]:
        """The round's lines in instance order, completed with the run's totals, which they are added to."""
        lines = [decision.lines[i] for i in sorted(decision.lines)]
        for line in lines:
            line.inner_steps = global_step - self.last_synced_step
        self.totals.tokens += int(sum(r.tokens for r in reports))
        self.totals.comm_bytes += sum(line.comm_bytes for line in lines)
        self.totals.skipped_rounds += sum(1 for line in lines if line.skipped)
        elapsed = self._elapsed()
        for line in lines:
            line.num_instances, line.total_tokens, line.elapsed_seconds = (
                len(self.instances),
                self.totals.tokens,
                elapsed,
            )
        return lines

    def _next_inner_steps(self, next_inner_steps: int | None, lines: list[RoundLine]) -> None:
        """`inner_steps_rule="outer_noise"`: the next round's H, when the decision changed it."""
        if next_inner_steps == self.inner_steps or next_inner_steps is None:
            return
        if self.rank == 0:
            logger.info(
                "inner steps per round: %d -> %d (the workers' pseudo-gradients agree: outer noise %s)",
                self.inner_steps,
                next_inner_steps,
                ", ".join(f"{line.outer_noise:.3g}" for line in lines if line.outer_noise is not None),
            )
        self.inner_steps = next_inner_steps

    def _log_round(self, lines: list[RoundLine], decision: RoundDecision, merge: MergeResult | None) -> None:
        """Rank 0: the round's lines in `adloco_rounds.jsonl`, and one console line (WARNING if a round skipped)."""
        self.run_log.write_rounds([line.to_json() for line in lines])
        message = round_message(lines, len(self.instances), None if merge is None else merge.plan)
        (logger.warning if any(line.skipped for line in lines) else logger.info)(message)
        for warning in decision.warnings:  # a merged instance that made no progress
            logger.warning(warning)
