"""`rounds.decide_round` and its records as pure cases: no process group, no model, no Trainer."""

import math
from dataclasses import replace

import pytest
from helpers import PAPER_ROUNDS, round_rules

from adloco_hf.batch.size_tests import GradientStatistics
from adloco_hf.instances.health import final_merge_warnings
from adloco_hf.instances.table import Instance, final_merge_weights
from adloco_hf.rounds.decision import decide_round, next_round_inner_steps, outer_noise
from adloco_hf.rounds.log_lines import merge_record, round_logs, round_message, run_summary
from adloco_hf.rounds.rows import WorkerReport
from adloco_hf.rounds.rules import RoundRules
from adloco_hf.rounds.state import AdLoCoState


def rules(**overrides) -> RoundRules:
    """The paper's round end with η = 0.5 and max_batch_size 8: no merges, no stop for skipped rounds, the learning
    rate compared with a batch of 1; `overrides` are `AdLoCoConfig` fields."""
    base = dict(
        PAPER_ROUNDS, eta=0.5, merge_every=0, max_skipped_rounds=None, per_device_train_batch_size=1, max_batch_size=8
    )
    return round_rules(**{**base, **overrides})


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
    measured_norm = replace(original, local_sq_norm=2.5)
    assert WorkerReport.from_row(measured_norm.to_row()) == measured_norm
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
        table, [report(0, stats(8.0, 1.0))], outer_step=1, global_step=10, rules=rules(batch_size_cap=10)
    )
    assert capped.instances[0].batch_size == 10
    above = decide_round(
        [Instance(0, (0,), 12)],
        [report(0, stats(8.0, 1.0))],
        outer_step=1,
        global_step=10,
        rules=rules(batch_size_cap=10),
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
    assert decision.warnings == [] and decision.failure is None  # both trained: nothing to warn about


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
        rules=rules(lr_batch_scaling="sqrt", per_device_train_batch_size=5),
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
    # Instance 1 merged away at the round's end: no next request is shown for it.
    assert message.startswith("round 1 (step 10) | instances 1 | batch i0=4→4, i1=2→merged | loss 2.0000")
    assert lines[1].merged_into == 0 and lines[0].merged_from == [1]
    assert "merged 1→0 (weights 0.67/0.33)" in message
    record = merge_record(decision.merge, 1)
    assert record["instances"] == [0, 1] and sum(record["weights"]) == pytest.approx(1.0)
    assert not any("batch" in key for key in run_summary(state, 2))  # the next requests never ran (cards: the used)
    # The cards' "inner steps | 200" was the run's step count, read as H (issue 41): the row says what it counts.
    summary = run_summary(state, 2)
    assert summary["steps per worker"] == 10 and summary["rounds"] == 1 and "inner steps" not in summary


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


# ---- degraded instances: rounds skipped in a row, no progress, the stop (health.py) ----
def play(table, skipped_by_round, *, nan_ranks=(), **rule_overrides):
    """Decide rounds 1, 2, ... where `skipped_by_round[n]` lists the instances skipped in round n + 1; the workers in
    `nan_ranks` report a NaN loss. Returns every decision."""
    decisions = []
    for index, skipped in enumerate(skipped_by_round):
        reports = [None] * sum(len(inst.workers) for inst in table)
        for inst in table:
            for rank in inst.workers:
                loss = math.nan if rank in nan_ranks else 2.0
                reports[rank] = report(inst.id, skipped=inst.id in skipped, loss=loss)
        decision = decide_round(
            table, reports, outer_step=index + 1, global_step=10 * (index + 1), rules=rules(**rule_overrides)
        )
        decisions.append(decision)
        table = decision.instances
    return decisions


def test_skipped_rounds_are_counted_in_a_row_and_a_round_that_trains_resets_the_count():
    decisions = play([Instance(0, (0, 1), 4)], [{0}, {0}, set(), {0}])
    assert [d.lines[0].skipped_in_a_row for d in decisions] == [1, 2, 0, 1]
    assert [d.instances[0].skipped_in_a_row for d in decisions] == [1, 2, 0, 1]
    assert [d.failure for d in decisions] == [None] * 4  # never more than 3 in a row
    message = round_message([decisions[1].lines[0]], 1, None)
    assert message.endswith("| SKIPPED (non-finite) [0] (i0: 2 in a row)")


def test_more_rounds_skipped_in_a_row_than_allowed_stop_the_run_naming_the_instance_and_its_workers():
    table = [Instance(0, (0,), 4), Instance(1, (1, 2), 4)]
    decisions = play(table, [{1}] * 4, nan_ranks=(2,), max_skipped_rounds=3)
    assert [d.failure is None for d in decisions] == [True, True, True, False]
    failure = decisions[3].failure
    assert failure.startswith("AdLoCo, round 4 (step 40): instance 1 (worker rank(s) [1, 2]) skipped rounds 1-4 (4 in")
    assert "more than max_skipped_rounds=3" in failure and "have not moved since the start" in failure
    assert "the training loss was not finite on worker rank(s) [2]" in failure
    assert "resume from a checkpoint" in failure and "raise max_skipped_rounds" in failure
    assert "instance 0" not in failure
    # 0 stops at the first skipped round; None never stops.
    assert play(table, [{1}], max_skipped_rounds=0)[0].failure is not None
    assert all(d.failure is None for d in play(table, [{1}] * 6, max_skipped_rounds=None))
    # A round that trains in between starts the count again.
    assert all(d.failure is None for d in play(table, [{1}, {1}, {1}, set(), {1}, {1}], max_skipped_rounds=3))


def test_an_instance_that_never_trained_is_merged_with_weight_0_and_named_in_a_warning():
    # Instance 1 skipped both rounds since the start: it still holds its starting weights.
    table = [Instance(0, (0,), 4), Instance(1, (1,), 4)]
    decision = play(table, [{1}, {1}], merge_every=2)[1]
    assert (decision.merge.survivor, decision.merge.merged) == (0, 1)  # equal demands: the lower id survives
    assert decision.merge.weights == (1.0, 0.0)
    assert len(decision.warnings) == 1
    warning = decision.warnings[0]
    assert warning.startswith("round 2: instance 1 (worker rank(s) [1]) made no progress: all its 2 round(s) since")
    assert "with weight 0, not its demand's" in warning and "pull instance 0 back" in warning
    assert decision.instances[0].trained and decision.failure is None
    assert "merged 1→0 (weights 1.00/0.00)" in round_message(list(decision.lines.values()), 1, decision.merge)
    # When the untrained instance is the survivor (larger demand), the other one's weights are all it keeps.
    table = [Instance(0, (0,), 4), Instance(1, (1, 2), 4)]
    decision = play(table, [{1}, {1}], merge_every=2)[1]
    assert (decision.merge.survivor, decision.merge.merged) == (1, 0) and decision.merge.weights == (0.0, 1.0)
    assert "instance 1 (worker rank(s) [1, 2]) made no progress" in decision.warnings[0]


def test_an_instance_without_progress_since_its_last_merge_keeps_its_demand_weight_with_a_warning():
    # Instance 0 trained before its last merge, then skipped both rounds since: its weights are that merge's.
    table = [Instance(0, (0,), 4, trained=True), Instance(1, (1,), 4, trained=True)]
    decision = play(table, [{0}, {0}], merge_every=2)[1]
    assert decision.merge.weights == pytest.approx((0.5, 0.5))
    assert len(decision.warnings) == 1
    assert decision.warnings[0].startswith("round 2: instance 0 (worker rank(s) [0]) made no progress: all its 2")
    assert "since its last merge" in decision.warnings[0] and "with its demand's weight 0.50" in decision.warnings[0]
    survivor = decision.instances[0]
    assert survivor.rounds_since_merge == 0 and survivor.skipped_in_a_row == 2  # a merge keeps the count
    assert not survivor.made_no_progress  # no round since the merge yet


def test_the_final_merge_leaves_out_instances_that_never_trained_and_names_them():
    table = play([Instance(0, (0,), 4), Instance(1, (1,), 2)], [{1}, {1}])[-1].instances
    assert final_merge_weights(table) == {0: 1.0, 1: 0.0}
    warnings = final_merge_warnings(table)
    assert len(warnings) == 1 and warnings[0].startswith("final merge: instance 1 (worker rank(s) [1]) made no")
    assert "with weight 0" in warnings[0]
    trained = play([Instance(0, (0,), 4), Instance(1, (1,), 2)], [set()])[-1].instances
    assert final_merge_weights(trained) == pytest.approx({0: 4 / 6, 1: 2 / 6}) and final_merge_warnings(trained) == []
    # Nothing trained: the demands decide, as before, and every instance is named.
    untrained = play([Instance(0, (0,), 4), Instance(1, (1,), 2)], [{0, 1}])[-1].instances
    assert final_merge_weights(untrained) == pytest.approx({0: 4 / 6, 1: 2 / 6})
    assert len(final_merge_warnings(untrained)) == 2


def test_an_instance_row_survives_a_checkpoint_and_old_rows_read_as_trained():
    inst = Instance(2, (1, 3), 6, 30.0, skipped_in_a_row=2, rounds_since_merge=5, trained=True)
    assert Instance.from_row(inst.to_row()) == inst
    old = Instance.from_row([2, 6, 30.0, [1, 3]])  # written before the counts existed
    assert (old.skipped_in_a_row, old.rounds_since_merge, old.trained) == (0, 0, True)


# ---- inner_steps_rule="outer_noise": H doubles while the workers' pseudo-gradients agree ----
def test_outer_noise_is_the_workers_variance_over_m_times_the_mean_s_square():
    import torch

    deltas = torch.randn(3, 50, generator=torch.Generator().manual_seed(0), dtype=torch.float64) + 0.7
    mean = deltas.mean(0)
    brute = deltas.var(0, unbiased=True).sum() / (3 * mean.square().sum())  # Σ_w ‖Δ_w − Δ̄‖² / (M − 1), over M ‖Δ̄‖²
    local = [float(d.square().sum()) for d in deltas]
    assert outer_noise(local, float(mean.norm())) == pytest.approx(float(brute), rel=1e-9)
    assert outer_noise(local[:1], float(mean.norm())) is None  # one worker: no spread to measure
    assert outer_noise([math.nan, 1.0], 1.0) is None  # overlapped outer steps report no local norm
    assert outer_noise([1.0, 1.0], 0.0) is None


def measured(instance, local_sq, norm=1.0):
    return replace(report(instance), local_sq_norm=local_sq, pseudo_grad_norm=norm)


@pytest.mark.parametrize(
    "local, skipped, rule, expected",
    [
        ([1.1, 1.1], False, "outer_noise", 10),  # (1.1 - 1) / 1 = 0.1 <= 0.5²: double
        ([1.5, 1.5], False, "outer_noise", 5),  # 0.5 > 0.25: keep
        ([1.1, 1.1], True, "outer_noise", 5),  # a skipped round measures nothing
        ([math.nan, math.nan], False, "outer_noise", 5),  # no local norms
        ([1.1, 1.1], False, "fixed", 5),
    ],
)
def test_h_doubles_only_while_the_outer_noise_is_below_theta_squared(local, skipped, rule, expected):
    table = [Instance(0, (0, 1), 4)]
    reports = [replace(measured(0, x), skipped=skipped) for x in local]
    cap = 40 if rule == "outer_noise" else None
    decision = decide_round(
        table,
        reports,
        outer_step=1,
        global_step=5,
        rules=rules(inner_steps_rule=rule, max_inner_steps=cap),
        inner_steps=5,
    )
    assert decision.next_inner_steps == expected
    line = decision.lines[0]
    assert line.outer_noise == (None if math.isnan(local[0]) else pytest.approx(local[0] - 1.0))
    assert "outer_noise" in line.to_json()


def test_h_stops_at_max_inner_steps_and_instances_weigh_by_workers():
    table = [Instance(0, (0, 1, 2), 4), Instance(1, (3,), 4), Instance(2, (4, 5), 4)]
    # Instance 0: noise 0.1 (3 workers); instance 2: 0.4 (2 workers); the single worker measures nothing.
    reports = [measured(0, 1.2)] * 3 + [measured(1, 5.0)] + [measured(2, 1.4)] * 2
    r = rules(inner_steps_rule="outer_noise", max_inner_steps=40)
    assert decide_round(table, reports, outer_step=1, global_step=20, rules=r, inner_steps=20).next_inner_steps == 40
    assert decide_round(table, reports, outer_step=1, global_step=40, rules=r, inner_steps=40).next_inner_steps == 40
    # The instances' noises pool weighted by their workers: (3 × 0.1 + 2 × 0.4) / 5 = 0.22, where the unweighted mean
    # is (0.1 + 0.4) / 2 = 0.25. θ² = 0.2304 (θ = 0.48) lies between them: only the weighted mean doubles H.
    between = rules(inner_steps_rule="outer_noise", max_inner_steps=40, outer_noise_theta=0.48)
    assert (
        decide_round(table, reports, outer_step=1, global_step=20, rules=between, inner_steps=20).next_inner_steps
        == 40
    )
    strict = rules(inner_steps_rule="outer_noise", max_inner_steps=40, outer_noise_theta=0.46)  # 0.2116 < 0.22
    assert (
        decide_round(table, reports, outer_step=1, global_step=20, rules=strict, inner_steps=20).next_inner_steps == 20
    )
    assert next_round_inner_steps([], 20, r) == 20


def test_after_a_merge_the_lines_and_the_plans_say_the_requests_the_next_round_runs():
    """`merge_batch_rule="preserve_total"` re-spreads each instance's total batch over the workers it has after the
    merge: the round's lines name the request the next round runs (`next_batch_size`) apart from the one the
    batch-size test asked for (`asked_batch_size`), and every worker's plan is that request, as switch mode runs it."""
    table = [Instance(0, (0, 1), 4), Instance(1, (2,), 2), Instance(2, (3,), 2)]  # demands 8, 2, 2
    reports = [report(i, loss=2.0) for i in (0, 0, 1, 2)]
    decision = decide_round(
        table,
        reports,
        outer_step=1,
        global_step=10,
        rules=rules(merge_every=1, merge_batch_rule="preserve_total", batch_size_test="none", max_batch_size=4),
    )
    after = {inst.id: inst for inst in decision.instances}
    assert decision.merge is not None and decision.merge.merged in (1, 2)
    for line in decision.lines.values():
        if line.merged_into is not None:
            assert line.instance == decision.merge.merged and "asked_batch_size" not in line.to_json()
            continue
        assert line.next_batch_size == after[line.instance].batch_size
        if line.next_batch_size != line.batch_size:  # the merge moved it: what was asked is kept, named apart
            assert line.asked_batch_size == line.batch_size
    moved = [line for line in decision.lines.values() if line.asked_batch_size is not None]
    assert moved, "the merge re-spread some instance's total over another number of workers"
    assert sorted(decision.plans) == [0, 1, 2, 3]
    for worker, plan in decision.plans.items():
        inst = next(i for i in decision.instances if worker in i.workers)
        assert plan.instance == inst.id and plan.request == inst.batch_size
        assert plan.process.batch_size == min(inst.batch_size, 4) or plan.process.accumulates
    message = round_message([decision.lines[i] for i in sorted(decision.lines)], 2, decision.merge)
    for line in moved:
        assert f"i{line.instance}={line.batch_size}→{line.next_batch_size}" in message
