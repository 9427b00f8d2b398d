"""The goodput rule's pure parts: the step-time fit, the instance's cost averages, goodput and its maximisation
(checked against trying every request), the hysteresis."""

import dataclasses
import math
import random

import pytest

from adloco_hf.batch.goodput import GoodputModel, choose_request
from adloco_hf.batch.switch_mode import SwitchMode, plan_batch, split_sizes
from adloco_hf.batch.throughput import MAX_PASS_SIZES, RoundTiming, StepTimeModel, ThroughputProfile, fit_pass_seconds


def model(times=(0.01, 0.02, 0.005, 1.0), *, noise=32.0, h=10, workers=2, g=1, m=8, gamma=2.0, ref=4):
    return GoodputModel(StepTimeModel(*times), noise, h, workers, g, SwitchMode(m, gamma), ref)


def brute_force(gm: GoodputModel, low: int, high: int) -> int:
    """Every request that is a multiple of G in [low, high]; the smallest of the highest goodput."""
    requests = [r for r in range(low, high + 1) if r % gm.processes == 0]
    return max(requests, key=lambda r: (gm.goodput(r), -r))


def test_goodput_is_throughput_times_efficiency_of_what_switch_mode_runs():
    gm = model()
    # Request 6: one pass of 6; a round is 10 × (0.01 + 0.02 + 0.005 × 6) + 1 = 1.6 s for 2 × 6 × 10 samples.
    assert gm.throughput(6) == pytest.approx(120 / 1.6)
    # Efficiency: the instance's step batch (2 workers × 6) against B_noise 32, the reference 2 × 4.
    assert gm.efficiency(6) == pytest.approx((32 + 8) / (32 + 12))
    assert gm.goodput(6) == pytest.approx(120 / 1.6 * 40 / 44)
    # Request 12 lies in switch mode's capped band (8 < 12 <= 16): it runs as 8, and is worth what 8 is.
    assert gm.goodput(12) == gm.goodput(8)
    # Request 20 accumulates 3 passes of 7, 7, 6.
    assert gm.throughput(20) == pytest.approx(2 * 20 * 10 / (10 * (0.01 + 3 * 0.02 + 0.005 * 20) + 1))
    # The reference batch is worth 1 per sample.
    assert gm.efficiency(4) == 1.0


def test_each_process_of_a_worker_runs_its_share():
    gm = model(g=2, m=4)
    # Request 12 per worker: each process plans 6 > 4 (capped band to 8): runs 4, a worker uses 8.
    assert gm.plan(12) == plan_batch(6, 4, 2.0)
    assert gm.efficiency(12) == pytest.approx((32 + 2 * 4) / (32 + 2 * 8))
    assert gm.throughput(12) == pytest.approx(2 * 2 * 4 * 10 / (10 * (0.01 + 0.02 + 0.005 * 4) + 1))


def test_the_best_request_of_one_pass_is_the_square_root_rule():
    # No fixed cost but the round's: b* = √(K B_noise / (H β)), K = H (ω + α) + C = 1.
    gm = model(times=(0.0, 0.0, 0.001, 1.0), noise=100.0, h=10, workers=1, m=1000, ref=1)
    best = math.sqrt(1.0 * 100.0 / (10 * 0.001))
    assert best == pytest.approx(100.0)
    assert gm.best_request(1, 1000) == 100
    assert brute_force(gm, 1, 1000) == 100
    # M workers: the noise scale is shared by the instance's step of M b, so b* = √(K B_noise / (M H β)).
    four = model(times=(0.0, 0.0, 0.001, 1.0), noise=100.0, h=10, workers=4, m=1000, ref=1)
    assert four.best_request(1, 1000) == 50 == brute_force(four, 1, 1000)


def test_the_efficiency_is_that_of_the_instances_step_batch():
    # 4 workers of b are worth what one worker of 4 b is (same noise scale, the reference scaled alike).
    four, one = model(workers=4, m=64, ref=2), model(workers=1, m=256, ref=8)
    for b in (2, 3, 8, 40):
        assert four.efficiency(b) == pytest.approx(one.efficiency(4 * b))
    assert four.efficiency(2) == 1.0 and four.efficiency(8) < model(workers=1, m=64, ref=2).efficiency(8)


def random_model(rng: random.Random, per_sample) -> GoodputModel:
    """A goodput model of random costs, noise scale, H, M, G and switch mode; β is one of `per_sample(rng)`."""
    times = (
        rng.choice([0.0, rng.uniform(0, 0.05)]),
        rng.choice([0.0, rng.uniform(0, 0.1)]),
        rng.choice(per_sample(rng)),
        rng.choice([0.0, rng.uniform(0, 5.0), rng.uniform(0, 50.0)]),
    )
    g = rng.choice([1, 1, 2, 4])
    return GoodputModel(
        StepTimeModel(*times),
        noise_scale=rng.choice([0.5, rng.uniform(1, 50), rng.uniform(50, 2000)]),
        inner_steps=rng.choice([1, 5, 25, 200]),
        workers=rng.randint(1, 8),
        processes=g,
        switch=SwitchMode(rng.randint(1, 24), rng.choice([1.0, 1.5, 2.0, 3.7])),
        reference=g * rng.randint(1, 8),
    )


@pytest.mark.parametrize("seed", range(300))
def test_the_maximisation_equals_trying_every_request(seed):
    rng = random.Random(seed)
    gm = random_model(rng, lambda rng: [0.0, rng.uniform(1e-4, 0.02)])
    g, times = gm.processes, gm.times.as_list()
    low = g * rng.randint(1, 6)
    high = low + g * rng.randint(0, 60)
    if sum(times[1:3]) + times[0] + times[3] == 0:
        return  # nothing costs time: every request is infinitely fast
    assert gm.best_request(low, high) == brute_force(gm, low, high)


@pytest.mark.parametrize("seed", range(200))
def test_the_rules_own_bound_never_cuts_off_the_best_request(seed):
    """Without `batch_size_cap` the rule searches [low, `request_bound`]: the best request there is the best of
    every request up to far beyond it (brute force to 4 × the bound), whatever the costs, noise scale and
    switch mode; the bound holds the current request and is a multiple of G."""
    rng = random.Random(1000 + seed)
    gm = random_model(rng, lambda rng: [rng.uniform(1e-4, 0.02), rng.uniform(1e-3, 0.05)])
    g = gm.processes
    low = g * rng.randint(1, 6)
    current = low + g * rng.randint(0, 40)
    bound = gm.request_bound(low, current)
    assert bound % g == 0 and bound >= current >= low
    assert gm.best_request(low, bound) == brute_force(gm, low, 4 * bound)


@pytest.mark.parametrize("seed", range(100))
def test_without_fixed_costs_the_bounds_proof_is_tight(seed):
    """With no cost per step, per pass or per round every request trains exactly X_max = M G / β samples a second, the
    throughput the bound's proof assumes: its break-even point for a request's own goodput is that request (up to
    G), not a sample more or less. A bound that claimed less (a proof assuming a lower X_max) would cut off a request
    that reaches that goodput; one that claimed more would search requests that cannot. The bound itself is then
    the best request at hand, above the band of one pass, and no request beyond it reaches its goodput."""
    rng = random.Random(5000 + seed)
    free = random_model(rng, lambda rng: [rng.uniform(1e-4, 0.02)])
    gm = dataclasses.replace(free, times=StepTimeModel(0.0, 0.0, free.times.per_sample, 0.0))
    g = gm.processes
    x_max = gm.workers * g / gm.times.per_sample
    top = g * int(gm.switch.switch_threshold * gm.switch.max_batch_size)  # the largest request of one pass
    for request in sorted({top + g * rng.randint(1, 50) for _ in range(10)}):
        assert gm.throughput(request) == pytest.approx(x_max, rel=1e-12)
        assert gm.goodput(request) == pytest.approx(x_max * gm.efficiency(request), rel=1e-12)
        assert gm.break_even(gm.goodput(request)) == request
        assert gm.goodput(request + g) < gm.goodput(request)  # without fixed costs a larger batch only loses
        # Started above the band of one pass, the bound is the best request at hand itself.
        assert gm.request_bound(request, current=request) == request
        assert gm.best_request(request, gm.request_bound(request, request)) == request


@pytest.mark.parametrize("cost", ["per_step", "per_pass", "per_round"])
def test_any_fixed_cost_leaves_the_bound_above_the_request_that_reaches_its_goodput(cost):
    """A fixed cost keeps the throughput below X_max: a request's goodput is then reached by nothing at or above
    its break-even point, which lies strictly beyond the request (the proof's slack)."""
    times = {"per_step": (0.01, 0.0, 0.001, 0.0), "per_pass": (0.0, 0.01, 0.001, 0.0), "per_round": (0, 0, 0.001, 1.0)}
    gm = model(times=times[cost], noise=200.0, h=10, workers=2, m=8, gamma=2.0, ref=4)
    for request in (20, 40, 80):
        bound = gm.break_even(gm.goodput(request))
        assert bound > request
        assert all(gm.goodput(r) < gm.goodput(request) for r in range(bound, 4 * bound))


def test_without_a_measured_per_sample_cost_the_bound_is_the_largest_request_of_one_pass():
    gm = model((0.01, 0.02, 0.0, 1.0), m=8, gamma=2.0, g=2)
    assert gm.request_bound(2, current=4) == 2 * 16  # γ m = 16 per process, G = 2
    assert gm.request_bound(2, current=40) == 40  # never below the current request


def test_a_request_outside_the_multiples_of_g_is_refused():
    with pytest.raises(ValueError, match="multiple of 4"):
        model(g=4).best_request(5, 7)


def test_the_hysteresis_keeps_a_request_that_gains_too_little():
    gm = model(times=(0.0, 0.0, 0.001, 1.0), noise=100.0, h=10, workers=1, m=1000, ref=1)
    # 95 is within a fraction of a percent of the best (100): kept at 5 %, moved at 0.
    near = choose_request(gm, current=95, low=1, high=1000, hysteresis=0.05)
    assert near.request == 95 and near.goodput == near.kept == gm.goodput(95)
    moved = choose_request(gm, current=95, low=1, high=1000, hysteresis=0.0)
    assert moved.request == 100 and moved.goodput == gm.goodput(100) and moved.kept == gm.goodput(95)
    # 10 is far below: it moves, and the line reports both predictions.
    far = choose_request(gm, current=10, low=1, high=1000, hysteresis=0.05)
    assert far.request == 100 and far.goodput >= 1.05 * far.kept
    # A current request above the cap moves whatever the gain.
    above = choose_request(gm, current=1200, low=1, high=1000, hysteresis=0.99)
    assert above.request == 100


def test_a_slow_link_asks_for_larger_batches_and_a_noisy_gradient_allows_them():
    fast = model(times=(0.0, 0.0, 0.01, 0.1), noise=64.0, m=64)
    slow = model(times=(0.0, 0.0, 0.01, 10.0), noise=64.0, m=64)
    assert slow.best_request(1, 64) > fast.best_request(1, 64)
    quiet = model(times=(0.0, 0.0, 0.01, 10.0), noise=4.0, m=64)
    assert quiet.best_request(1, 64) < slow.best_request(1, 64)


def test_one_pass_size_fits_a_proportional_pass_two_fit_a_line():
    assert fit_pass_seconds([]) is None
    assert fit_pass_seconds([(4.0, 0.2)]) == (0.0, pytest.approx(0.05))
    alpha, beta = fit_pass_seconds([(2.0, 0.3), (4.0, 0.4), (8.0, 0.6)])
    assert (alpha, beta) == (pytest.approx(0.2), pytest.approx(0.05))
    # A negative slope (noise between close sizes) is flat; a negative intercept goes through 0.
    assert fit_pass_seconds([(4.0, 0.5), (5.0, 0.4)]) == (pytest.approx(0.45), 0.0)
    assert fit_pass_seconds([(2.0, 0.1), (4.0, 0.5)]) == (0.0, pytest.approx((0.2 + 2.0) / 20))


def timing(micro: int, steps: int, seconds_per_pass: float, *, split_of: int = 0, split_seconds: float = 0.0):
    """A round of `steps` steps of one pass of `micro`, and a statistics step of `split_of` as two halves."""
    halves = split_sizes(split_of, 2) if split_of else []
    return RoundTiming(
        pass_seconds=steps * seconds_per_pass,
        passes=steps,
        pass_samples=steps * micro,
        split_seconds=2 * split_seconds if halves else 0.0,
        split_passes=len(halves),
        split_samples=sum(halves),
        step_seconds=0.01 * (steps + (1 if halves else 0)),
        steps=steps + (1 if halves else 0),
    )


def test_the_profile_fits_alpha_and_beta_from_the_split_statistics_step_and_takes_the_slowest_process():
    # α = 0.02, β = 0.005: a pass of 8 takes 0.06 s, of 4 (the halves) 0.04 s; the second process is slower.
    fast = timing(8, 9, 0.06, split_of=8, split_seconds=0.04)
    slow = timing(8, 9, 0.07, split_of=8, split_seconds=0.045)
    profile = ThroughputProfile().update([fast, slow], round_seconds=1.5, smoothing=0.5)
    times = profile.model()
    assert times.per_pass == pytest.approx(0.045 - (0.07 - 0.045))
    assert times.per_sample == pytest.approx((0.07 - 0.045) / 4)
    assert times.per_step == pytest.approx(0.01)
    assert times.per_round == 1.5  # bias-corrected: one round's value
    # The next round's figures average in (β = 0.5, bias-corrected: (0.5 × 1.5 + 2.5) / 1.5).
    later = profile.update([timing(8, 10, 0.07)], round_seconds=2.5, smoothing=0.5)
    assert later.model().per_round == pytest.approx((0.25 * 1.5 + 0.5 * 2.5) / 0.75)


def test_the_profile_remembers_a_few_sizes_and_ignores_what_was_not_measured():
    profile = ThroughputProfile()
    for micro in range(1, MAX_PASS_SIZES + 3):
        profile = profile.update([timing(micro, 5, 0.01 * micro)], round_seconds=math.nan, smoothing=0.0)
    assert [size for size, _, _ in profile.passes] == [float(m) for m in range(3, MAX_PASS_SIZES + 3)]
    assert profile.round == (0.0, 0.0) and profile.model().per_round == 0.0
    assert profile.update([RoundTiming()], round_seconds=math.nan, smoothing=0.5) == profile
    assert ThroughputProfile().model() is None


def test_the_profile_survives_a_checkpoint_row_and_a_merge_weighs_it():
    a = ThroughputProfile().update([timing(4, 5, 0.04, split_of=4, split_seconds=0.03)], 2.0, 0.5)
    b = ThroughputProfile().update([timing(8, 5, 0.08)], 4.0, 0.5)
    assert ThroughputProfile.from_list(a.to_list()) == a
    assert ThroughputProfile.from_list(None) == ThroughputProfile()
    merged = ThroughputProfile.combine(a, b, (0.75, 0.25))
    assert merged.model().per_round == pytest.approx(0.75 * 2.0 + 0.25 * 4.0)
    sizes = {size: total / weight for size, total, weight in merged.passes}
    assert sizes == {2.0: pytest.approx(0.03), 4.0: pytest.approx(0.04), 8.0: pytest.approx(0.08)}
    assert ThroughputProfile.combine(ThroughputProfile(), b, (0.5, 0.5)).model() == b.model()
