"""`batch_size_target="goodput"` in a round's decision: the same choice as the pure rule from the all-gathered
timings and statistics, what the rounds file logs, merges, skipped rounds and processes per worker."""

import math

import pytest
from helpers import round_rules

from adloco_hf.batch.goodput import GoodputModel, choose_request
from adloco_hf.batch.size_tests import GradientStatistics
from adloco_hf.batch.startup_profile import LinkFit, StartupProfile
from adloco_hf.batch.switch_mode import SwitchMode
from adloco_hf.batch.throughput import RoundTiming, ThroughputProfile
from adloco_hf.instances.table import Instance
from adloco_hf.rounds.decision import decide_round
from adloco_hf.rounds.first_round import first_round
from adloco_hf.rounds.rows import WorkerReport


def rules(**overrides):
    base = dict(
        batch_size_target="goodput",
        batch_size_cap=64,
        per_device_train_batch_size=4,
        batch_size_smoothing=0.0,
        merge_every=0,
        max_batch_size=16,
    )
    return round_rules(**{**base, **overrides})


def report(instance=0, *, variance=40.0, grad_sq_norm=12.5, micro=4, pass_seconds=0.05, half_seconds=0.035,
           outer_seconds=2.0, steps=10, skipped=False):  # fmt: skip
    """A worker's round: H − 1 steps of one pass of `micro`, the statistics step as two halves, per-sample variance
    `variance` with ‖g‖² `grad_sq_norm` over `micro` samples."""
    return WorkerReport(
        instance=instance,
        stats=GradientStatistics(variance, math.nan, math.nan, 1.0, grad_sq_norm, float(micro)),
        loss_sum=2.0 * steps,
        loss_steps=steps,
        samples=micro * steps,
        tokens=100.0,
        pseudo_grad_norm=0.5,
        payload_bytes=1000,
        comm_seconds=outer_seconds - 0.01,
        outer_seconds=outer_seconds,
        skipped=skipped,
        timing=RoundTiming(
            pass_seconds=(steps - 1) * pass_seconds,
            passes=steps - 1,
            pass_samples=(steps - 1) * micro,
            split_seconds=2 * half_seconds,
            split_passes=2,
            split_samples=micro,
            step_seconds=0.01 * steps,
            steps=steps,
        ),
    )


def test_the_decision_is_the_pure_rule_on_the_gathered_timings_and_the_noise_scale():
    table = [Instance(0, (0, 1), 4)]
    # The second worker is slower and arrived last at the all-reduce (the shorter outer step).
    reports = [report(), report(pass_seconds=0.06, half_seconds=0.04, outer_seconds=1.5)]
    decision = decide_round(table, reports, outer_step=1, global_step=10, rules=rules(), inner_steps=10)
    line, after = decision.lines[0], decision.instances[0]
    # α, β from the slower worker's passes of 4 (0.06 s) and of 2 (0.04 s): α = 0.02, β = 0.01.
    times = after.throughput.model()
    assert times.as_list() == pytest.approx([0.01, 0.02, 0.01, 1.5])
    assert line.step_model == times.as_list()
    # The noise scale from the pooled statistics: tr Σ = 40 and ‖∇F‖² ≈ 12.5 − 40 / 4 on each worker's 4 samples.
    scale = after.noise.noise_scale
    assert scale == pytest.approx(16.0) and line.noise_scale == scale
    expected = choose_request(
        GoodputModel(times, scale, 10, 2, 1, SwitchMode(16, 2.0), 4), current=4, low=4, high=64, hysteresis=0.05
    )
    assert line.next_batch_size == after.batch_size == expected.request
    assert (line.goodput, line.goodput_kept) == (expected.goodput, expected.kept)
    assert expected.request != 4  # the slow outer step makes a larger batch pay here
    written = line.to_json()
    assert written["goodput"] == expected.goodput and written["step_model"] == line.step_model


def noisy(**kwargs) -> WorkerReport:
    """A round whose gradient is pure noise for its batch: ‖g‖² below tr Σ / b, no positive noise scale."""
    return report(variance=40.0, grad_sq_norm=9.0, **kwargs)


def test_without_a_noise_scale_the_request_stays_and_the_costs_are_still_measured():
    table = [Instance(0, (0,), 4)]
    decision = decide_round(table, [noisy()], outer_step=1, global_step=10, rules=rules(nonpositive_signal="keep"))
    line = decision.lines[0]
    assert line.noise_scale is None and line.next_batch_size == 4
    assert line.goodput is None and "goodput" not in line.to_json()
    assert line.step_model is not None and decision.instances[0].throughput.model() is not None


def test_other_targets_keep_no_costs_and_log_no_goodput():
    table = [Instance(0, (0,), 4)]
    decision = decide_round(table, [report()], outer_step=1, global_step=10, rules=rules(batch_size_target="test"))
    assert decision.instances[0].throughput == ThroughputProfile()
    assert not {"goodput", "goodput_kept", "step_model"} & set(decision.lines[0].to_json())


def test_a_skipped_round_keeps_the_request_but_counts_its_costs():
    table = [Instance(0, (0,), 4)]
    decision = decide_round(table, [report(skipped=True)], outer_step=1, global_step=10, rules=rules())
    assert decision.instances[0].batch_size == 4 and decision.lines[0].goodput is None
    assert decision.instances[0].throughput.model().per_round == 2.0


def test_a_tiny_gain_is_not_worth_a_change():
    table = [Instance(0, (0,), 4)]
    kept = decide_round(table, [report()], outer_step=1, global_step=10, rules=rules(goodput_hysteresis=0.999))
    assert kept.lines[0].next_batch_size == 4 and kept.lines[0].goodput == kept.lines[0].goodput_kept


def test_requests_only_grow_unless_batch_size_shrink_lets_them_fall():
    # A request of 16, a fast outer step and a noise scale of 4 (tr Σ = 40, ‖∇F‖² ≈ 12.5 − 40 / 16): a batch of
    # 16 is far past what pays, and the rule's best lies at the floor.
    table = [Instance(0, (0,), 16)]
    round_of_16 = report(micro=16, pass_seconds=0.18, half_seconds=0.10, outer_seconds=0.01)
    kept = decide_round(table, [round_of_16], outer_step=1, global_step=10, rules=rules(), inner_steps=10)
    assert kept.lines[0].next_batch_size == kept.instances[0].batch_size == 16
    assert kept.lines[0].noise_scale == pytest.approx(4.0)
    falls = decide_round(
        table, [round_of_16], outer_step=1, global_step=10, rules=rules(batch_size_shrink=True), inner_steps=10
    )
    after = falls.instances[0]
    expected = choose_request(
        GoodputModel(after.throughput.model(), after.noise.noise_scale, 10, 1, 1, SwitchMode(16, 2.0), 4),
        current=16,
        low=4,
        high=64,
        hysteresis=0.05,
    )
    assert after.batch_size == expected.request < 16
    # Never below the floor, falls or not.
    floored = decide_round(
        table,
        [round_of_16],
        outer_step=1,
        global_step=10,
        rules=rules(batch_size_shrink=True, batch_size_floor=12),
        inner_steps=10,
    )
    assert floored.instances[0].batch_size == 12


def test_with_processes_per_worker_the_request_is_a_multiple_of_g_and_each_process_is_timed():
    table = [Instance(0, (0,), 4)]
    g2 = rules(processes_per_worker=2, per_device_train_batch_size=2, max_batch_size=8)
    # Each process ran passes of 2 (its half of the worker's 4) and halves of 1; the second process is slower.
    common = dict(micro=2, grad_sq_norm=25.0, half_seconds=0.05)
    reports = [report(**common), report(**common, pass_seconds=0.08)]
    decision = decide_round(table, reports, outer_step=1, global_step=10, rules=g2, inner_steps=10)
    line, after = decision.lines[0], decision.instances[0]
    times = after.throughput.model()
    assert times.per_pass == pytest.approx(0.02) and times.per_sample == pytest.approx(0.03)
    scale = after.noise.noise_scale
    assert scale == pytest.approx(8.0)
    expected = choose_request(
        GoodputModel(times, scale, 10, 1, 2, SwitchMode(8, 2.0), 4), current=4, low=4, high=64, hysteresis=0.05
    )
    assert line.next_batch_size == expected.request and expected.request % 2 == 0 and expected.request != 4


def test_a_merge_weighs_the_survivors_costs_with_the_merged_ones():
    table = [Instance(0, (0,), 4), Instance(1, (1,), 4)]
    reports = [report(0, outer_seconds=1.0), report(1, outer_seconds=3.0)]
    decision = decide_round(table, reports, outer_step=2, global_step=20, rules=rules(merge_every=2))
    assert decision.merge is not None and len(decision.instances) == 1
    survivor = decision.instances[0]
    assert survivor.throughput.model().per_round == pytest.approx(2.0)  # equal demands: equal weights
    assert Instance.from_row(survivor.to_row()) == survivor


def test_a_report_carries_its_timings_through_the_all_gather_row():
    original = report(3, pass_seconds=0.123, half_seconds=0.05)
    assert WorkerReport.from_row(original.to_row()) == original
    assert WorkerReport.from_row(original.to_row()).timing.pass_points() == original.timing.pass_points()


# ---- the startup profile (`batch/startup_profile.py`, `rounds/first_round.py`) ----
PROFILE = StartupProfile(passes=((2, 0.03), (8, 0.06), (16, 0.1)), link=LinkFit(1e-3, 8e-8), payload_bytes=10_000_000)


def test_with_the_startup_profile_no_measured_timing_enters_a_decision():
    """`goodput_timing="startup"`: the step and round costs are the profile's for the instance's workers, whatever the
    round measured: two rounds of very different timings take the same decision (a run is repeatable)."""
    table = [Instance(0, (0, 1), 4)]
    fast = [report(), report()]
    slow = [report(pass_seconds=0.5, half_seconds=0.4, outer_seconds=9.0) for _ in range(2)]
    decisions = [
        decide_round(table, reports, outer_step=1, global_step=10, rules=rules(), inner_steps=10, startup=PROFILE)
        for reports in (fast, slow)
    ]
    first, second = (d.lines[0] for d in decisions)
    assert first.next_batch_size == second.next_batch_size
    assert (first.goodput, first.goodput_kept, first.step_model) == (
        second.goodput,
        second.goodput_kept,
        second.step_model,
    )
    times = PROFILE.step_model(2)
    assert first.step_model == times.as_list()
    expected = choose_request(
        GoodputModel(times, first.noise_scale, 10, 2, 1, SwitchMode(16, 2.0), 4),
        current=4, low=4, high=64, hysteresis=0.05,
    )  # fmt: skip
    assert first.next_batch_size == expected.request and first.goodput == expected.goodput
    assert decisions[0].instances[0].throughput == ThroughputProfile()  # nothing measured is kept either


def test_startup_live_and_live_read_the_rounds_timings():
    table = [Instance(0, (0, 1), 4)]
    reports = [report(), report(pass_seconds=0.06, half_seconds=0.04, outer_seconds=1.5)]
    for timing in ("startup_live", "live"):
        decision = decide_round(
            table, reports, outer_step=1, global_step=10, rules=rules(goodput_timing=timing), inner_steps=10,
            startup=PROFILE,
        )  # fmt: skip
        assert decision.lines[0].step_model == pytest.approx([0.01, 0.02, 0.01, 1.5])  # the measured ones


def startup_statistics(variance: float, signal: float, half: int) -> GradientStatistics:
    """A rank's startup estimate: two halves of `half` samples, per-sample variance `variance`, ‖∇F‖² `signal`."""
    return GradientStatistics(variance, math.nan, math.nan, 1.0, signal + variance / (2 * half), float(2 * half))


def test_the_first_request_is_the_rules_choice_under_the_profile_and_the_startup_noise():
    table = [Instance(0, (0, 1), 4), Instance(1, (2, 3), 4)]
    # Instance 0's gradient is noisy (B_noise 200), instance 1's is not (B_noise 2): only the first grows.
    stats = [startup_statistics(200.0, 1.0, 16)] * 2 + [startup_statistics(2.0, 1.0, 16)] * 2
    first = first_round(table, stats, PROFILE, rules(), inner_steps=10)
    assert first.noise_scales == pytest.approx({0: 200.0, 1: 2.0})
    for inst, start in zip(first.instances, table):
        expected = choose_request(
            GoodputModel(PROFILE.step_model(2), first.noise_scales[inst.id], 10, 2, 1, SwitchMode(16, 2.0), 4),
            current=4, low=4, high=64, hysteresis=0.05,
        )  # fmt: skip
        assert first.choices[inst.id] == expected and inst.batch_size == expected.request
        assert inst.noise == start.noise and inst.throughput == ThroughputProfile()  # averages start at round 1
    assert first.instances[0].batch_size > 4 and first.instances[1].batch_size == 4


def test_without_a_noise_scale_the_first_request_stays_and_startup_live_seeds_the_averages():
    table = [Instance(0, (0, 1), 4)]
    missing = [GradientStatistics.missing()] * 2
    kept = first_round(table, missing, PROFILE, rules(), inner_steps=10)
    assert kept.instances == table and kept.choices == {0: None} and math.isnan(kept.noise_scales[0])
    negative = [startup_statistics(10.0, -5.0, 4)] * 2  # an estimate of ‖∇F‖² below 0 says nothing
    assert first_round(table, negative, PROFILE, rules(), inner_steps=10).choices == {0: None}
    live = first_round(table, missing, PROFILE, rules(goodput_timing="startup_live"), inner_steps=10)
    assert live.instances[0].throughput == PROFILE.throughput_profile(2)
