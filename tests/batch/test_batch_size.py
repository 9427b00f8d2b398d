import math

import pytest
import torch
from torch import nn
from torch.func import functional_call, grad, vmap

from adloco_hf.batch.size_tests import (
    GradientStatistics,
    augmented_inner_product_test,
    estimate_inner_product_variance,
    estimate_orthogonal_variance,
    estimate_variance,
    group_statistics,
    inner_product_test,
    next_batch_size,
    norm_test,
    pool_statistics,
)


def per_sample_gradients(n: int = 24, seed: int = 0) -> torch.Tensor:
    """Per-sample gradients (n × d, float64) of a small MLP regression, from torch.func."""
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(5, 8), nn.Tanh(), nn.Linear(8, 1)).double()
    params = {k: v.detach() for k, v in model.named_parameters()}
    x, y = torch.randn(n, 5, dtype=torch.float64), torch.randn(n, 1, dtype=torch.float64)

    def loss(p, xi, yi):
        return ((functional_call(model, p, (xi[None],)) - yi) ** 2).mean()

    grads = vmap(grad(loss), in_dims=(None, 0, 0))(params, x, y)
    return torch.cat([g.reshape(n, -1) for g in grads.values()], dim=1)


def group_means(G: torch.Tensor, sizes: list[int], order: torch.Tensor | None = None) -> list[torch.Tensor]:
    rows = G if order is None else G[order]
    return [chunk.mean(0) for chunk in torch.split(rows, sizes)]


def sq(v: torch.Tensor) -> float:
    return float(v @ v)


def test_variance_with_one_sample_per_group_is_the_sample_variance():
    G = per_sample_gradients()
    mean = G.mean(0)
    expected = float(((G - mean) ** 2).sum() / (len(G) - 1))
    got = estimate_variance([sq(g) for g in G], [1] * len(G), sq(mean))
    assert got == pytest.approx(expected, rel=1e-10)


def test_variance_with_unequal_groups_equals_the_weighted_spread_of_group_means():
    G = per_sample_gradients()
    sizes = [3, 5, 7, 9]
    means = group_means(G, sizes)
    g = G.mean(0)
    expected = sum(n * sq(m - g) for n, m in zip(sizes, means)) / (len(sizes) - 1)
    assert estimate_variance([sq(m) for m in means], sizes, sq(g)) == pytest.approx(expected, rel=1e-10)


def test_variance_with_unequal_groups_is_unbiased_over_random_groupings():
    # For a fixed set of b per-sample gradients split at random into groups of sizes n_j, the expectation of the
    # estimator is exactly the sample variance S² (sampling without replacement).
    G = per_sample_gradients()
    sizes = [2, 4, 7, 11]
    g = G.mean(0)
    target = float(((G - g) ** 2).sum() / (len(G) - 1))
    generator = torch.Generator().manual_seed(0)
    draws = [
        estimate_variance(
            [sq(m) for m in group_means(G, sizes, torch.randperm(len(G), generator=generator))], sizes, sq(g)
        )
        for _ in range(4000)
    ]
    mean = sum(draws) / len(draws)
    stderr = (sum((d - mean) ** 2 for d in draws) / (len(draws) - 1) / len(draws)) ** 0.5
    assert abs(mean - target) < 4 * stderr
    assert abs(mean - target) / target < 0.05


def test_inner_product_and_orthogonal_variances_match_their_definitions_per_sample():
    G = per_sample_gradients()
    g = G.mean(0)
    dots = [float(x @ g) for x in G]
    n = len(G)
    expected_ip = sum((d - sq(g)) ** 2 for d in dots) / (n - 1)
    orthogonal = [x - (float(x @ g) / sq(g)) * g for x in G]
    expected_orth = sum(sq(v) for v in orthogonal) / (n - 1)
    assert estimate_inner_product_variance(dots, [1] * n, sq(g)) == pytest.approx(expected_ip, rel=1e-10)
    got_orth = estimate_orthogonal_variance([sq(x) for x in G], dots, [1] * n, sq(g))
    assert got_orth == pytest.approx(expected_orth, rel=1e-10)


def test_group_statistics_carry_the_numerators_and_degrees_of_freedom():
    G = per_sample_gradients()
    sizes = [10, 14]
    means = group_means(G, sizes)
    g = G.mean(0)
    stats = group_statistics([sq(m) for m in means], sizes, sq(g), [float(m @ g) for m in means])
    assert stats.dof == 1 and stats.samples == 24
    assert stats.variance_sum / stats.dof == pytest.approx(estimate_variance([sq(m) for m in means], sizes, sq(g)))
    assert stats.inner_product_sum == pytest.approx(sum(n * (float(m @ g) - sq(g)) ** 2 for n, m in zip(sizes, means)))
    assert GradientStatistics.from_list(stats.as_list()) == stats


def test_norm_test_is_the_ceiling_of_the_paper_formula_per_worker():
    # T = tr Σ / (η² ‖g‖²) = 9 / (0.25 · 2) = 18 samples for the instance.
    assert norm_test(9.0, 2.0, 0.5) == 18
    assert norm_test(9.0, 2.0, 0.5, num_workers=4) == 5  # ⌈18 / 4⌉
    assert norm_test(9.0, 2.0, 0.5, num_workers=36) == 1
    assert norm_test(1e-6, 2.0, 0.5) == 1


@pytest.mark.parametrize("bad", [0.0, math.nan, math.inf, -1.0])
def test_degenerate_statistics_give_no_growth(bad):
    assert norm_test(1.0, bad, 0.8) == 1
    assert norm_test(bad, 1.0, 0.8) == 1
    assert inner_product_test(1.0, bad, 0.3) == 1
    assert augmented_inner_product_test(bad, bad, 1.0, 0.3, 0.3) == 1


def test_inner_product_tests():
    # T = V_ip / (ϑ² ‖g‖⁴) = 8 / (0.25 · 4) = 8 ; orthogonal part V / (ν² ‖g‖²) = 5 / (0.25 · 2) = 10
    assert inner_product_test(8.0, 2.0, 0.5) == 8
    assert augmented_inner_product_test(8.0, 5.0, 2.0, 0.5, 0.5) == 10
    assert augmented_inner_product_test(8.0, 1.0, 2.0, 0.5, 0.5, num_workers=3) == 3
    assert augmented_inner_product_test(8.0, math.nan, 2.0, 0.5, 0.5) == 8


def test_pooling_adds_numerators_and_dofs_and_estimates_the_instance_batch_gradient():
    a = GradientStatistics(6.0, 1.0, 2.0, 1.0, 2.0, 8)
    b = GradientStatistics(9.0, 3.0, 4.0, 2.0, 4.0, 4)
    pooled = pool_statistics([a, b, GradientStatistics.missing()])
    assert pooled.variance == pytest.approx(15 / 3)
    assert pooled.ip_variance == pytest.approx(4 / 3)
    assert pooled.orth_variance == pytest.approx(6 / 3)
    # ‖∇F‖² ≈ mean of (‖g_w‖² − tr Σ̂ / b_w); the instance's batch of 12 adds tr Σ̂ / 12 back.
    true = ((2.0 - 5 / 8) + (4.0 - 5 / 4)) / 2
    assert pooled.true_grad_sq_norm == pytest.approx(true)
    assert pooled.grad_sq_norm == pytest.approx(true + 5 / 12)
    assert (pooled.dof, pooled.workers, pooled.samples) == (3.0, 2, 12.0)
    assert pool_statistics([GradientStatistics.missing()]).workers == 0


def test_one_worker_keeps_its_own_gradient_norm_unless_noise_dominates():
    alone = pool_statistics([GradientStatistics(6.0, 0.0, 0.0, 1.0, 2.0, 8)])  # tr Σ̂ 6, ‖g‖² 2 > 6 / 8
    assert alone.grad_sq_norm == pytest.approx(2.0)
    noisy = pool_statistics([GradientStatistics(40.0, 0.0, 0.0, 1.0, 1.0, 8)])  # ‖g‖² 1 < tr Σ̂ / b = 5
    assert noisy.true_grad_sq_norm == 0.0 and noisy.grad_sq_norm == pytest.approx(5.0)
    # The request then grows by 1 / η² at most: b / η² = 8 / 0.8² = 12.5.
    assert norm_test(noisy.variance, noisy.grad_sq_norm, 0.8) == 13


def test_pooled_gradient_norm_is_unbiased_for_the_instance_batch():
    """Monte Carlo over per-sample gradients g_i = μ + noise: the pooled ‖g‖² averages to E‖g_B‖² = ‖μ‖² + tr Σ / B."""
    generator = torch.Generator().manual_seed(0)
    dim, workers, per_worker, trials = 6, 4, 8, 4000
    mu = torch.full((dim,), 0.5, dtype=torch.float64)
    scale = 1.5  # per-coordinate noise: tr Σ = dim × scale²
    values = []
    for _ in range(trials):
        stats = []
        for _ in range(workers):
            g = mu + scale * torch.randn(per_worker, dim, generator=generator, dtype=torch.float64)
            halves = group_means(g, [per_worker // 2, per_worker // 2])
            stats.append(group_statistics([sq(h) for h in halves], [4, 4], sq(g.mean(0))))
        values.append(pool_statistics(stats).grad_sq_norm)
    expected = sq(mu) + dim * scale**2 / (workers * per_worker)
    assert sum(values) / trials == pytest.approx(expected, rel=0.03)
    # The plain mean of the workers' ‖g_w‖² would have carried one worker's noise, tr Σ / b_w, four times more.
    assert dim * scale**2 / per_worker > 2 * (expected - sq(mu))


def test_an_instance_of_several_workers_can_grow_with_the_papers_eta():
    # Four workers, 8 samples each, noise-dominated gradients: the instance needs more than 4 × 8 samples.
    stats = [GradientStatistics(variance_sum=64.0, inner_product_sum=0.0, orthogonal_sum=0.0, dof=1.0,
                                grad_sq_norm=8.1, samples=8.0) for _ in range(4)]  # fmt: skip
    pooled = pool_statistics(stats)
    wanted = next_batch_size("norm", pooled, current=8, num_workers=4, eta=0.8, theta=0.3, nu=0.3)
    assert wanted > 8
    # With ‖g‖² taken as the mean of the workers' ‖g_w‖² (8.1), T = 64 / (0.64 × 8.1) ≈ 12 < 32: no growth.
    assert norm_test(64.0, 8.1, 0.8, num_workers=4) < 8


def test_next_batch_size_never_shrinks_respects_the_cap_and_the_test_choice():
    pooled = pool_statistics([GradientStatistics(40.0, 80.0, 10.0, 2.0, 1.0, 8)])  # var 20, ‖g‖² 1 → 20 / 8
    assert pooled.grad_sq_norm == pytest.approx(2.5)
    kwargs = dict(num_workers=2, eta=1.0, theta=1.0, nu=1.0)
    assert next_batch_size("norm", pooled, current=2, **kwargs) == 4  # ⌈20 / 2.5 / 2⌉
    assert next_batch_size("norm", pooled, current=16, **kwargs) == 16  # never shrinks
    assert next_batch_size("norm", pooled, current=2, cap=3, **kwargs) == 3
    assert next_batch_size("none", pooled, current=2, **kwargs) == 2
    assert next_batch_size("inner_product", pooled, current=2, **kwargs) == 4  # ⌈40 / 2.5² / 2⌉
    assert next_batch_size("augmented_inner_product", pooled, current=2, **kwargs) == 4  # ⌈max(6.4, 5 / 2.5) / 2⌉
    missing = pool_statistics([GradientStatistics.missing()])
    assert next_batch_size("norm", missing, current=4, **kwargs) == 4
    with pytest.raises(ValueError, match="batch_size_test"):
        next_batch_size("bogus", pooled, current=4, **kwargs)


def test_estimators_need_two_groups():
    with pytest.raises(ValueError, match="at least 2 groups"):
        estimate_variance([1.0], [4], 1.0)
