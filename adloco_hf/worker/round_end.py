"""`RoundEnd`: the end of a round, every `inner_steps` inner steps, on every rank in the same order.

1. The outer step inside the instance (all-reduce of the pseudo-gradient), and this worker's `WorkerReport`.
2. One all-gather of every worker's report; `rounds.decide_round` then decides the same on every rank: next
   requests, a merge if one is due, the next round's H, every worker's plan for the next round, a failure after
   too many skipped rounds.
3. The next round's [`RoundPlan`] applied in one place (`apply`: the merge if due, the table, this worker's plan, H),
   and the round's lines finished (`rounds.decision.finish_lines`: the merge's traffic, totals, elapsed time).
4. Rank 0 writes the round's lines to `adloco_rounds.jsonl` and the console.
"""

from collections.abc import Callable

from ..batch.size_tests import GradientStatistics
from ..common.clock import Clock
from ..common.distributed import WorkerMonitor
from ..common.logs import get_logger
from ..instances.health import SkippedRoundsError
from ..instances.merges import MergeResult
from ..reporting.run_log import RunLog
from ..rounds.decision import RoundDecision, decide_round
from ..rounds.lines import finish_lines
from ..rounds.log_lines import round_message
from ..rounds.plan import RoundPlan
from ..rounds.rows import RoundLine, WorkerReport
from ..rounds.rules import RoundRules
from ..rounds.state import RoundResult
from .groups import WorkerGroups
from .inner_steps import InnerSteps
from .merging import WorkerMerges
from .outer_sync import OuterSync
from .plan_follower import PlanFollower
from .preemption import Preemption
from .replicas.replica import ReplicaParallel
from .round_state import RoundState


__all__ = ["RoundEnd"]

logger = get_logger(__name__)


class RoundEnd:
    """The end of every round for one worker process (module docstring); it owns nothing but the order of steps.

    Args:
        groups: where this process sits and its groups (refreshed after a merge).
        replica: DDP or FSDP inside the worker (whether this process's statistics go into its report).
        monitor: bounds the round's all-gather by `worker_timeout`.
        run_log: the rounds file, written by rank 0.
        rounds: the rounds' state, which the round's end moves on.
        steps: the round's inner steps (their tally goes into the report; a new round starts a new one).
        outer: the outer step.
        merges: the merges.
        follower: applies the next round's plan to the sampler and the inner optimizer.
        rules: the settings of the round's decision, now.
        preemption: whether this worker was asked to stop.
        clock: the clock of the outer step's timing.
        hint: what to do after a lost worker.
    """

    def __init__(
        self,
        *,
        groups: WorkerGroups,
        replica: ReplicaParallel,
        monitor: WorkerMonitor,
        run_log: RunLog,
        rounds: RoundState,
        steps: InnerSteps,
        outer: OuterSync,
        merges: WorkerMerges,
        follower: PlanFollower,
        rules: Callable[[], RoundRules],
        preemption: Preemption,
        clock: Clock,
        hint: Callable[[], str],
    ):
        self.groups, self.replica, self.monitor, self.run_log = groups, replica, monitor, run_log
        self.rounds, self.steps, self.outer, self.merges, self.follower = rounds, steps, outer, merges, follower
        self.rules, self.preemption, self.clock, self.hint = rules, preemption, clock, hint

    def run(self, global_step: int) -> RoundResult:
        """Outer step, decisions from the all-gathered reports, the next round's plan applied, logs."""
        rounds = self.rounds
        where = f"round {rounds.outer_step + 1} (step {global_step})"
        self.monitor.check(where, self.hint)
        rounds.outer_step += 1
        report = self._report(global_step)
        rows = self.monitor.gather_rows(report.to_row(), f"{where}, reports", self.hint)
        reports = [WorkerReport.from_row(row) for row in rows]
        decision = decide_round(
            rounds.instances,
            reports,
            outer_step=rounds.outer_step,
            global_step=global_step,
            rules=self.rules(),
            inner_steps=rounds.inner_steps,
            startup=rounds.startup_profile,
        )
        totals = rounds.totals
        totals.tokens += int(sum(r.tokens for r in reports))
        ran = global_step - rounds.last_synced_step
        merge = self.apply(decision.plan)
        lines = finish_lines(
            decision.lines,
            decision.plan,
            merge,
            inner_steps=ran,
            tokens=totals.tokens,
            elapsed_seconds=rounds.elapsed(),
        )
        totals.comm_bytes += sum(line.comm_bytes for line in lines)
        totals.skipped_rounds += sum(1 for line in lines if line.skipped)
        self.steps.new_round()
        rounds.last_synced_step = global_step
        if self.groups.rank == 0:
            self._log(lines, decision, merge)
        if decision.failure is not None:  # every rank decides it alike, so all of them stop here
            raise SkippedRoundsError(f"{decision.failure} {self.hint()}")
        return RoundResult(lines=lines, merge=merge, preempted=any(r.preempt for r in reports))

    def apply(self, plan: RoundPlan) -> MergeResult | None:
        """The one place a round's plan takes effect, at the start of training (`first_plan`) and at every round's
        end (`decide_round`'s): the merge it carries out, the instance table (and its groups), this worker's plan to
        its sampler and inner optimizer, and the round's inner steps. Returns what the merge did (None: none)."""
        rounds = self.rounds
        merge = None if plan.merge is None else self.merges.at_round_end(plan.merge, rounds)
        rounds.instances = list(plan.instances)
        if merge is not None:  # only a merge moves workers between instances (the start refreshed the first table)
            self.groups.refresh(rounds.instances)
        rounds.plan = plan.worker(self.groups.worker_id)
        self.follower.apply(rounds.plan)
        if plan.inner_steps is not None and plan.inner_steps != rounds.inner_steps:
            self._log_inner_steps(rounds.inner_steps, plan.inner_steps)
            rounds.inner_steps = plan.inner_steps
        return merge

    def _report(self, global_step: int) -> WorkerReport:
        """The outer step inside this worker's instance, and the round as this process reports it."""
        rounds = self.rounds
        instance = rounds.instance_of(self.groups.worker_id)
        started = self.clock.now()
        result = self.outer.round_end(global_step, instance, rounds.plan.sample_weight)
        self.clock.outer_step(
            round_number=rounds.outer_step, workers=len(instance.workers), payload_bytes=result.payload_bytes
        )
        tally = self.steps.tally
        stats = tally.stats if self.replica.reports_statistics else None
        return WorkerReport(
            instance=instance.id,
            stats=stats or GradientStatistics.missing(),
            loss_sum=float(tally.loss_sum),
            loss_steps=tally.loss_steps,
            samples=tally.samples,
            tokens=float(tally.tokens),
            pseudo_grad_norm=result.pseudo_grad_norm,
            payload_bytes=result.payload_bytes,
            comm_seconds=result.seconds,
            outer_seconds=self.clock.now() - started,
            skipped=result.skipped,
            preempt=self.preemption.requested,
            local_sq_norm=result.local_sq_norm,
            step_seconds=tally.seconds,
            timing=tally.timing,
        )

    def _log_inner_steps(self, before: int, after: int) -> None:
        """`inner_steps_rule="outer_noise"`: rank 0 says when the next round's H changed."""
        if self.groups.rank == 0:
            logger.info(
                "inner steps per round: %d -> %d (the workers' pseudo-gradients agreed in the last round)",
                before,
                after,
            )

    def _log(self, lines: list[RoundLine], decision: RoundDecision, merge: MergeResult | None) -> None:
        """Rank 0: the round's lines in `adloco_rounds.jsonl`, and one console line (WARNING if a round skipped)."""
        self.run_log.write_rounds([line.to_json() for line in lines])
        message = round_message(lines, len(self.rounds.instances), None if merge is None else merge.plan)
        (logger.warning if any(line.skipped for line in lines) else logger.info)(message)
        for warning in decision.warnings:  # a merged instance that made no progress
            logger.warning(warning)
