"""The request's controller (`batch_controller`) and the merge's batch rule, as pure cases (issue 14)."""

import math
import random
from dataclasses import replace

import pytest
from helpers import round_rules

from adloco_hf.batch.controller import ControllerRules, NoiseEstimate, next_request
from adloco_hf.batch.size_tests import GradientStatistics, next_batch_size, pool_statistics
from adloco_hf.instances.table import Instance, plan_merge
from adloco_hf.rounds.decision import decide_round
from adloco_hf.rounds.rows import WorkerReport


def pooled_of(variance: float, grad_sq_norm: float, samples: float = 4.0, workers: int = 1):
    """Pooled statistics of `workers` workers that each measured `variance` and `grad_sq_norm` on `samples`."""
    one = GradientStatistics(variance, math.nan, math.nan, 1.0, grad_sq_norm, samples)
    return pool_statistics([one] * workers)


def test_the_paper_rules_are_next_batch_size_exactly():
    generator = random.Random(0)
    for _ in range(200):
        pooled = pooled_of(generator.uniform(0, 50), generator.uniform(0, 5), samples=generator.choice([2, 4, 8]))
        current, workers = generator.choice([1, 4, 9]), generator.choice([1, 2, 3])
        rules = ControllerRules(eta=0.8, cap=generator.choice([None, 12]))
        estimate = NoiseEstimate().update(pooled, 0.0)
        expected = next_batch_size(
            "norm", pooled, current=current, num_workers=workers, eta=0.8, theta=0.3, nu=0.3, cap=rules.cap
        )
        assert next_request(rules, pooled, estimate, current=current, num_workers=workers) == expected


def test_smoothing_averages_noise_and_signal_separately_with_bias_correction():
    first, second = pooled_of(10.0, 2.0), pooled_of(30.0, -1.0)
    estimate = NoiseEstimate().update(first, 0.5)
    assert (estimate.mean_variance, estimate.mean_signal) == pytest.approx((10.0, 2.0 - 10.0 / 4))
    estimate = estimate.update(second, 0.5)
    # (0.5 × 10 × 0.5 + 0.5 × 30) / (0.5 × 0.5 + 0.5) over the weights 0.25 and 0.5
    assert estimate.mean_variance == pytest.approx((0.25 * 10 + 0.5 * 30) / 0.75)
    assert estimate.mean_signal == pytest.approx((0.25 * (2.0 - 2.5) + 0.5 * (-1.0 - 7.5)) / 0.75)
    missing = pool_statistics([GradientStatistics.missing()])
    assert estimate.update(missing, 0.5) == estimate  # a round without statistics changes nothing


def test_a_round_without_statistics_keeps_the_request():
    # Round 1 measured and set the request from its estimate; round 2's statistics step overflowed (fp16): the
    # estimate is unchanged, and reading it again with round 2's batch must not move the request (seen on a GPU).
    estimate = NoiseEstimate().update(pooled_of(30.0, 20.0, samples=4), 0.5)
    rules = ControllerRules(eta=0.5, smoothing=0.5, nonpositive_signal="keep")
    request = next_request(rules, pooled_of(30.0, 20.0, samples=4), estimate, current=4, num_workers=1)
    assert request > 4
    missing = pool_statistics([GradientStatistics.missing()])
    assert estimate.update(missing, 0.5) == estimate
    assert next_request(rules, missing, estimate, current=request, num_workers=1) == request


def test_a_nonpositive_signal_keeps_the_request_where_the_paper_jumps_by_one_over_eta_squared():
    noisy = pooled_of(40.0, 5.0, samples=4)  # ‖∇F‖² ≈ 5 − 40 / 4 < 0
    assert noisy.signal < 0
    estimate = NoiseEstimate().update(noisy, 0.0)
    keep = ControllerRules(eta=0.8, nonpositive_signal="keep", smoothing=0.5)
    clamp = ControllerRules(eta=0.8, nonpositive_signal="clamp", smoothing=0.5)
    assert next_request(keep, noisy, estimate, current=4, num_workers=1) == 4
    assert next_request(clamp, noisy, estimate, current=4, num_workers=1) == math.ceil(4 / 0.64)  # B / η², 4 → 7


def test_the_norm_test_on_the_averages_and_the_noise_scale_target():
    pooled = pooled_of(30.0, 4.0, samples=4)  # signal 4 − 7.5 / ... per worker: 4 − 30 / 4 = −3.5 at first
    estimate = NoiseEstimate(variance=30.0, signal=1.5, weight=1.0)  # tr Σ 30, ‖∇F‖² 1.5: noise scale 20
    rules = ControllerRules(eta=0.8, smoothing=0.5, nonpositive_signal="keep")
    expected = math.ceil(30.0 / (0.64 * (1.5 + 30.0 / 4)) / 2)
    assert next_request(rules, pooled, estimate, current=1, num_workers=2) == expected
    target = ControllerRules(eta=0.8, smoothing=0.5, nonpositive_signal="keep", target="noise_scale")
    assert estimate.noise_scale == pytest.approx(20.0)
    assert next_request(target, pooled, estimate, current=1, num_workers=2) == 10  # 1 × 20 over 2 workers
    double = ControllerRules(eta=0.8, smoothing=0.5, target="noise_scale", noise_scale_multiple=2.0)
    assert next_request(double, pooled, estimate, current=1, num_workers=2) == 20


def test_shrinking_needs_the_hysteresis_and_stops_at_the_floor_and_the_cap_bounds_growth():
    pooled = pooled_of(1.0, 1.0)
    rules = dict(eta=0.8, smoothing=0.5, target="noise_scale", nonpositive_signal="keep")

    def request(scale, current, **more):
        estimate = NoiseEstimate(variance=scale, signal=1.0, weight=1.0)  # noise scale = `scale`
        return next_request(ControllerRules(**rules, **more), pooled, estimate, current=current, num_workers=1)

    assert request(6, 10) == 10  # no shrinking by default
    assert request(6, 10, shrink=True) == 10  # 6 is above 0.5 × 10: inside the band
    assert request(3, 10, shrink=True) == 3  # below it: falls to the target
    assert request(1, 10, shrink=True, floor=4) == 4  # never below the floor
    assert request(30, 10, cap=16) == 16 and request(30, 20, cap=16) == 20  # growth capped, nothing lowered


def test_merging_estimates_weighs_them_like_the_merge():
    a, b = NoiseEstimate(10.0, 1.0, 0.5), NoiseEstimate(40.0, 4.0, 1.0)
    merged = NoiseEstimate.combine(a, b, (0.75, 0.25))
    assert merged.mean_variance == pytest.approx(0.75 * 20 + 0.25 * 40)
    assert merged.mean_signal == pytest.approx(0.75 * 2 + 0.25 * 4)
    assert NoiseEstimate.combine(NoiseEstimate(), b, (0.9, 0.1)).mean_variance == pytest.approx(40)


def test_an_instance_row_keeps_its_averages_and_old_rows_read_without():
    inst = Instance(2, (1, 3), 6, noise=NoiseEstimate(3.0, 0.5, 0.75))
    assert Instance.from_row(inst.to_row()) == inst
    old = [2, 6, 12.0, [1, 3], 0, 4, True]
    assert Instance.from_row(old).noise == NoiseEstimate()


def test_preserve_total_keeps_each_instance_total_batch_across_a_merge():
    instances = [Instance(0, (0,), 8), Instance(1, (1,), 4), Instance(2, (2,), 2), Instance(3, (3,), 2)]
    paper = plan_merge(instances, policy="smallest_pair", num_workers=4, batch_rule="paper")
    kept = plan_merge(instances, policy="smallest_pair", num_workers=4, batch_rule="preserve_total")
    assert (paper.survivor, paper.merged) == (kept.survivor, kept.merged) == (2, 3)
    by_id = {inst.id: inst for inst in paper.after}
    kept_by_id = {inst.id: inst for inst in kept.after}
    for inst_id, inst in by_id.items():
        assert kept_by_id[inst_id].workers == inst.workers
    totals = {inst.id: inst.batch_size * len(inst.workers) for inst in instances}
    for inst_id, inst in kept_by_id.items():
        assert inst.batch_size == max(1, math.ceil(totals[inst_id] / len(inst.workers)))
    # the survivor of the paper rule keeps 2 per worker whatever its workers; the rule that keeps totals divides
    survivor_workers = len(by_id[2].workers)
    assert by_id[2].batch_size == 2
    assert kept_by_id[2].batch_size == math.ceil(2 / survivor_workers)
    with pytest.raises(ValueError, match="merge_batch_rule"):
        plan_merge(instances, policy="smallest_pair", num_workers=4, batch_rule="bogus")


def _report(instance, variance=1.0, grad_sq_norm=100.0):
    stats = GradientStatistics(variance, math.nan, math.nan, 1.0, grad_sq_norm, 4.0)
    return WorkerReport(instance, stats, 10.0, 5, 20, 100.0, 0.5, 1000, 0.01, 0.02, False)


def test_with_preserve_total_the_merge_weighs_what_ran_not_what_was_requested():
    """Instance 0 requested 12 but switch mode ran max_batch_size = 8 (12 ≤ γ × 8, so no accumulation); instance 1
    ran its 6. The paper weighs the requests, preserve_total the samples that ran."""
    base = dict(batch_size_test="none", max_batch_size=8, merge_every=1)
    instances = [Instance(0, (0,), 12), Instance(1, (1,), 6)]
    reports = [_report(0), _report(1)]
    paper = decide_round(
        instances, reports, outer_step=1, global_step=5, rules=round_rules(**base, merge_batch_rule="paper")
    )
    kept = decide_round(
        instances, reports, outer_step=1, global_step=5, rules=round_rules(**base, merge_batch_rule="preserve_total")
    )
    assert paper.merge.weights == pytest.approx((12 / 18, 6 / 18))  # the requests
    assert kept.merge.weights == pytest.approx((8 / 14, 6 / 14))  # what ran: 8 (capped) and 6
    assert {i.id: i.batch_size for i in paper.instances} == {0: 12}
    assert {i.id: i.batch_size for i in kept.instances} == {0: 6}  # the survivor's total 12 over 2 workers


def test_decide_round_carries_the_averages_and_reports_the_noise_scale():
    rules = round_rules(eta=0.8, max_batch_size=64, merge_every=0, batch_size_smoothing=0.5, nonpositive_signal="keep")
    instances = [Instance(0, (0,), 4)]
    first = decide_round(instances, [_report(0, 40.0, 12.0)], outer_step=1, global_step=5, rules=rules)
    estimate = first.instances[0].noise
    assert estimate.mean_variance == pytest.approx(40.0) and estimate.mean_signal == pytest.approx(2.0)
    assert first.lines[0].noise_scale == pytest.approx(20.0)
    second = decide_round(first.instances, [_report(0, 40.0, 5.0)], outer_step=2, global_step=10, rules=rules)
    assert second.instances[0].noise.mean_signal == pytest.approx((0.5 * 2.0 + 1.0 * -5.0) / 1.5)  # ≤ 0 now
    assert second.instances[0].batch_size == first.instances[0].batch_size  # kept
    assert second.lines[0].noise_scale is None


def test_preserve_total_never_lifts_a_request_above_the_cap_when_an_instance_loses_workers():
    """9 workers, merge_policy="largest_smallest": merging 0 into 1 gives the survivor 8 seats by demand, so instance 2
    goes from 2 workers to 1; its total 2 × 19 = 38 would make its request 38 per worker, above the cap of 32 (a
    request already above the cap is kept, as the tests keep it)."""
    instances = [Instance(0, (0,), 19), Instance(1, (1, 2, 3, 5, 6, 8), 31), Instance(2, (4, 7), 19)]
    instances = [replace(i, demand=float(i.batch_size * len(i.workers))) for i in instances]
    plan = dict(policy="largest_smallest", num_workers=9, batch_rule="preserve_total")
    uncapped = {i.id: (len(i.workers), i.batch_size) for i in plan_merge(instances, **plan).after}
    assert uncapped[2] == (1, 38)
    capped = {i.id: (len(i.workers), i.batch_size) for i in plan_merge(instances, **plan, cap=32).after}
    assert capped == {**uncapped, 2: (1, 32)}
    above = [replace(instances[2], batch_size=36) if i.id == 2 else i for i in instances]
    assert {i.id: i.batch_size for i in plan_merge(above, **plan, cap=32).after}[2] == 36
    # The round's decision passes the config's cap on (no statistics: every request stays, then the merge).
    rules = round_rules(
        batch_size_test="none", max_batch_size=64, merge_every=1, merge_policy="largest_smallest", batch_size_cap=32
    )
    reports = [_report(next(i.id for i in instances if w in i.workers)) for w in range(9)]
    decision = decide_round(instances, reports, outer_step=1, global_step=5, rules=rules)
    assert {i.id: (len(i.workers), i.batch_size) for i in decision.instances}[2] == (1, 32)
