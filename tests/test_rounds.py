"""`rounds.decide_round` and its records as pure cases: no process group, no model, no Trainer."""

import math

import pytest

from adloco_hf.batch_size import GradientStatistics
from adloco_hf.instances import Instance
from adloco_hf.rounds import (
    AdLoCoState,
    RoundRules,
    WorkerReport,
    decide_round,
    merge_record,
    round_logs,
    round_message,
    run_summary,
)


def rules(**overrides) -> RoundRules:
    base = dict(
        batch_size_test="norm",
        eta=0.5,
        theta=0.3,
        nu=0.3,
        max_batch_size=8,
        switch_threshold=2.0,
        request_cap=None,
        merge_every=0,
        merge_policy="smallest_pair",
    )
    return RoundRules(**{**base, **overrides})


def stats(variance: float, grad_sq_norm: float, samples: float = 4.0, dof: float = 1.0) -> GradientStatistics:
    """One worker's numerators for a step of `samples` samples whose per-sample variance is `variance`."""
    return GradientStatistics(variance * dof, math.nan, math.nan, dof, grad_sq_norm, samples)


def report(instance: int, statistics: GradientStatistics | None = None, *, skipped=False, loss=2.0, tokens=100.0):
    return WorkerReport(
        instance=instance,
        stats=statistics or GradientStatistics.missing(),
        loss_sum=loss * 5,
        loss_steps=5,
        samples=20,
        tokens=tokens,
        pseudo_grad_norm=0.5,
        payload_bytes=1000,
        comm_seconds=0.01 * (instance + 1),
        outer_seconds=0.02 * (instance + 1),
        skipped=skipped,
    )


def test_a_report_survives_the_all_gather_row():
    original = report(3, stats(2.0, 0.25), skipped=True)
    assert WorkerReport.from_row(original.to_row()) == original
    assert all(isinstance(v, float) for v in original.to_row())


def test_noise_above_the_signal_grows_the_request_by_the_norm_test():
    # One worker, per-sample variance 8, ‖∇F‖² estimate 1 − 8/4 < 0 is clamped: ‖g‖² = 8/4 = 2 → T = 8 / (0.25·2) = 16.
    table = [Instance(0, (0,), 4)]
    decision = decide_round(table, [report(0, stats(8.0, 1.0))], outer_step=1, global_step=10, rules=rules())
    assert decision.instances[0].batch_size == 16
    line = decision.lines[0]
    assert (line.batch_size, line.next_batch_size) == (4, 16)
    assert line.grad_variance == pytest.approx(8.0)
    assert decision.merge is None and line.merged_from == []


def test_a_quiet_gradient_keeps_the_request_it_never_shrinks():
    table = [Instance(0, (0,), 6)]
    decision = decide_round(table, [report(0, stats(0.01, 10.0))], outer_step=1, global_step=10, rules=rules())
    assert decision.instances[0].batch_size == 6


def test_the_cap_bounds_growth_but_never_lowers_a_request():
    table = [Instance(0, (0,), 4)]
    capped = decide_round(
        table, [report(0, stats(8.0, 1.0))], outer_step=1, global_step=10, rules=rules(request_cap=10)
    )
    assert capped.instances[0].batch_size == 10
    above = decide_round(
        [Instance(0, (0,), 12)],
        [report(0, stats(8.0, 1.0))],
        outer_step=1,
        global_step=10,
        rules=rules(request_cap=10),
    )
    assert above.instances[0].batch_size == 12


def test_a_skipped_round_keeps_the_request_and_is_marked():
    table = [Instance(0, (0, 1), 4)]
    reports = [report(0, stats(8.0, 1.0)), report(0, stats(8.0, 1.0), skipped=True)]
    decision = decide_round(table, reports, outer_step=1, global_step=10, rules=rules())
    assert decision.instances[0].batch_size == 4
    assert decision.lines[0].skipped


def test_statistics_pool_over_an_instance_and_the_request_is_per_worker():
    # Two workers of 4 samples each: B = 8; variance 8, ‖∇F‖² clamped to 0 → ‖g‖² = 8/8 = 1 → T = 8/(0.25) = 32,
    # i.e. 16 per worker.
    table = [Instance(0, (0, 1), 4)]
    reports = [report(0, stats(8.0, 1.0)), report(0, stats(8.0, 1.0))]
    decision = decide_round(table, reports, outer_step=1, global_step=10, rules=rules())
    assert decision.lines[0].stats_dof == 2
    assert decision.instances[0].batch_size == 16
    assert decision.lines[0].comm_bytes == 2 * (2 - 1) * 1000  # the ring model for two workers
    assert decision.lines[0].samples == 40 and decision.lines[0].tokens == 200


def test_no_statistics_keeps_the_request():
    table = [Instance(0, (0,), 4)]
    decision = decide_round(table, [report(0)], outer_step=1, global_step=10, rules=rules())
    assert decision.instances[0].batch_size == 4
    assert decision.lines[0].grad_variance is not None and math.isnan(decision.lines[0].grad_variance)


def test_a_due_merge_takes_the_smallest_pair_and_the_larger_demand_survives():
    table = [Instance(0, (0,), 4), Instance(1, (1,), 2), Instance(2, (2,), 3)]
    reports = [report(0), report(1), report(2)]
    decision = decide_round(table, reports, outer_step=2, global_step=20, rules=rules(merge_every=2))
    merge = decision.merge
    assert (merge.survivor, merge.merged) == (2, 1)  # demands 2 and 3 are the smallest; 3 > 2 survives
    assert merge.weights == pytest.approx((0.6, 0.4))
    assert decision.lines[2].merged_from == [1] and decision.lines[1].merged_from == []
    assert sorted(i.id for i in decision.instances) == [0, 2]
    assert sorted(w for i in decision.instances for w in i.workers) == [0, 1, 2]
    assert set(decision.lines) == {0, 1, 2}  # the merged-away instance still has its line for this round


def test_merges_wait_for_their_round_and_ties_go_to_the_lower_id():
    table = [Instance(0, (0,), 2), Instance(1, (1,), 2), Instance(2, (2,), 2)]
    reports = [report(0), report(1), report(2)]
    assert decide_round(table, reports, outer_step=1, global_step=10, rules=rules(merge_every=2)).merge is None
    merge = decide_round(table, reports, outer_step=2, global_step=20, rules=rules(merge_every=2)).merge
    assert (merge.survivor, merge.merged) == (0, 1)


def test_a_merge_is_planned_on_the_new_requests():
    # Instance 0 grows from 2 to 16 this round, so the smallest pair is then {1, 2}, not {0, 1}.
    table = [Instance(0, (0,), 2), Instance(1, (1,), 3), Instance(2, (2,), 4)]
    reports = [report(0, stats(8.0, 1.0)), report(1), report(2)]
    decision = decide_round(table, reports, outer_step=1, global_step=10, rules=rules(merge_every=1))
    assert {decision.merge.survivor, decision.merge.merged} == {1, 2}


def test_the_line_follows_switch_mode_and_the_learning_rate_rule():
    table = [Instance(0, (0,), 20)]
    decision = decide_round(
        table,
        [report(0)],
        outer_step=1,
        global_step=10,
        rules=rules(lr_batch_scaling="sqrt", reference_batch_size=5),
    )
    line = decision.lines[0]
    assert (line.micro_batch_size, line.accumulation_steps) == (7, 3)  # 20 > 2 × 8: accumulate ⌈20/8⌉ chunks
    assert line.lr_factor == pytest.approx(2.0)  # √(20 / 5)
    assert line.outer_seconds == pytest.approx(0.02) and line.comm_seconds == pytest.approx(0.01)
    assert "merge_bytes" not in line.to_json()


def test_logs_message_summary_and_merge_record():
    table = [Instance(0, (0,), 4), Instance(1, (1,), 2)]
    decision = decide_round(
        table, [report(0, loss=3.0), report(1, loss=2.0)], outer_step=1, global_step=10, rules=rules(merge_every=1)
    )
    lines = [decision.lines[i] for i in sorted(decision.lines)]
    state = AdLoCoState(
        rounds=1,
        last_round_step=10,
        tokens=200,
        comm_bytes=5000,
        merges=1,
        skipped_rounds=0,
        elapsed_seconds=1.0,
        num_instances=1,
        batch_sizes={i.id: i.batch_size for i in decision.instances},
        workers={i.id: i.workers for i in decision.instances},
    )
    logs = round_logs(lines, state, decision.instances)
    assert logs["adloco/num_instances"] == 1 and logs["adloco/round"] == 1
    assert logs["adloco/instance_0/train_loss"] == pytest.approx(3.0)
    message = round_message(lines, 1, decision.merge)
    assert message.startswith("round 1 (step 10) | instances 1 | batch i0=4→4, i1=2→2 | loss 2.0000")
    assert "merged 1→0 (weights 0.67/0.33)" in message
    record = merge_record(decision.merge, 1)
    assert record["instances"] == [0, 1] and sum(record["weights"]) == pytest.approx(1.0)
    assert run_summary(state, 2)["final per-worker batch sizes"] == {0: 4}


def test_logs_tell_the_batch_used_in_the_round_from_the_next_request():
    # Requests 12 (capped to the micro-batch limit 8 by switch mode: 12 <= 2 × 8) and 20 (accumulated in 3 chunks).
    table = [Instance(0, (0,), 12), Instance(1, (1, 2), 20)]
    reports = [report(0, stats(64.0, 0.25)), report(1, stats(64.0, 0.25)), report(1, stats(64.0, 0.25))]
    decision = decide_round(table, reports, outer_step=1, global_step=10, rules=rules())
    lines = [decision.lines[i] for i in sorted(decision.lines)]
    assert lines[0].next_batch_size > 12  # the noise grew the request: used 8, asked 12, next more
    state = AdLoCoState(
        rounds=1, last_round_step=10, tokens=300, comm_bytes=0, merges=0, skipped_rounds=0, elapsed_seconds=1.0,
        num_instances=2, batch_sizes={i.id: i.batch_size for i in decision.instances},
        workers={i.id: i.workers for i in decision.instances},
    )  # fmt: skip
    logs = round_logs(lines, state, decision.instances)
    assert logs["adloco/instance_0/batch_size_used"] == 8  # what each worker really ran: capped at max_batch_size
    assert logs["adloco/instance_1/batch_size_used"] == 20
    assert logs["adloco/instance_0/next_batch_size"] == lines[0].next_batch_size
    assert logs["adloco/instance_1/next_batch_size"] == lines[1].next_batch_size
    assert "adloco/instance_0/batch_size" not in logs  # the old name, which held the next request
    # adloco/batch_size: the next requests, averaged over all workers.
    expected = (lines[0].next_batch_size + 2 * lines[1].next_batch_size) / 3
    assert logs["adloco/batch_size"] == pytest.approx(expected)
