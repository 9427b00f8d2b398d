"""The hook-based collector against gradients computed chunk by chunk, the brute-force way."""

import pytest
import torch
from torch import nn

from adloco_hf.batch.grad_stats import GradientStatisticsCollector
from adloco_hf.batch.size_tests import group_statistics


def make_problem(seed=0, n=12):
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 3))
    return model, torch.randn(n, 6), torch.randint(0, 3, (n,))


def chunk_loss(model, x, y):
    return nn.functional.cross_entropy(model(x), y)


def flat_grad(model):
    return torch.cat([p.grad.reshape(-1) for p in model.parameters()]).double()


def brute_force(model, x, y, sizes):
    """Mean gradient of each chunk and of the whole batch, as float64 vectors."""
    means = []
    for xs, ys in zip(torch.split(x, sizes), torch.split(y, sizes)):
        model.zero_grad()
        chunk_loss(model, xs, ys).backward()
        means.append(flat_grad(model))
    weights = [s / sum(sizes) for s in sizes]
    return means, sum(w * m for w, m in zip(weights, means))


def run_collector(model, x, y, sizes, *, inner_products, scale=1.0):
    collector = GradientStatisticsCollector(model.parameters(), inner_products=inner_products)
    weights = [s / sum(sizes) for s in sizes]
    model.zero_grad()
    collector.start(weights)
    for j, (xs, ys) in enumerate(zip(torch.split(x, sizes), torch.split(y, sizes))):
        collector.begin_chunk(j)
        (scale * weights[j] * chunk_loss(model, xs, ys)).backward()
    stats = collector.finish(samples=sum(sizes), loss_scale=scale)
    return stats, flat_grad(model) / scale


def sq(v):
    return float(v @ v)


@pytest.mark.parametrize("sizes", [[6, 6], [5, 7], [4, 3, 5], [2, 2, 3, 5]])
def test_norm_statistics_match_brute_force(sizes):
    model, x, y = make_problem()
    means, g = brute_force(model, x, y, sizes)
    expected = group_statistics([sq(m) for m in means], sizes, sq(g))
    stats, grad_after = run_collector(model, x, y, sizes, inner_products=False)
    assert stats.variance_sum == pytest.approx(expected.variance_sum, rel=1e-4)
    assert stats.grad_sq_norm == pytest.approx(expected.grad_sq_norm, rel=1e-5)
    assert stats.dof == len(sizes) - 1
    assert torch.allclose(grad_after, g, atol=1e-6)  # the hooks leave the gradient untouched


@pytest.mark.parametrize("sizes", [[5, 7], [3, 3, 3, 3], [2, 4, 3, 1, 2]])
def test_inner_product_statistics_match_brute_force_on_two_groups(sizes):
    model, x, y = make_problem(seed=1)
    # With more than two chunks the collector pools them into two halves: the first ⌈m/2⌉ chunks and the rest.
    half = (len(sizes) + 1) // 2
    groups = [sum(sizes[:half]), sum(sizes[half:])] if len(sizes) > 2 else sizes
    means, g = brute_force(model, x, y, groups)
    dots = [float(m @ g) for m in means]
    expected = group_statistics([sq(m) for m in means], groups, sq(g), dots)
    stats, grad_after = run_collector(model, x, y, sizes, inner_products=True)
    for name in ("variance_sum", "inner_product_sum", "orthogonal_sum", "grad_sq_norm", "dof", "samples"):
        assert getattr(stats, name) == pytest.approx(getattr(expected, name), rel=1e-4, abs=1e-9), name
    assert torch.allclose(grad_after, g, atol=1e-6)  # the set-aside half was added back


def test_loss_scale_is_removed():
    model, x, y = make_problem(seed=2)
    plain, _ = run_collector(model, x, y, [6, 6], inner_products=True)
    scaled, _ = run_collector(model, x, y, [6, 6], inner_products=True, scale=1024.0)
    for a, b in zip(plain.as_list(), scaled.as_list()):
        assert b == pytest.approx(a, rel=1e-4)


def test_non_finite_gradients_give_no_statistics():
    model, x, y = make_problem()
    collector = GradientStatisticsCollector(model.parameters())
    collector.start([0.5, 0.5])
    for j in range(2):
        collector.begin_chunk(j)
        (chunk_loss(model, x[:6], y[:6]) * (float("inf") if j else 1.0)).backward()
    assert collector.finish(samples=12) is None
    assert not collector._handles  # hooks removed either way


def test_previous_step_as_second_group_for_one_sample_batches():
    model, x, y = make_problem(seed=3, n=2)
    collector = GradientStatisticsCollector(model.parameters(), inner_products=True)
    model.zero_grad()
    chunk_loss(model, x[:1], y[:1]).backward()
    g1 = flat_grad(model)
    assert collector.remember()
    model.zero_grad()
    chunk_loss(model, x[1:], y[1:]).backward()
    g2 = flat_grad(model)
    stats = collector.finish_with_previous()
    g = (g1 + g2) / 2
    expected = group_statistics([sq(g1), sq(g2)], [1, 1], sq(g), [float(g1 @ g), float(g2 @ g)])
    for a, b in zip(stats.as_list(), expected.as_list()):
        assert a == pytest.approx(b, rel=1e-4)
    assert not collector.has_previous  # the copy is released after use


# ---- noise_preconditioner="adam": the statistics in Adam's metric P = 1 / (√v̂ + ε) ----
def test_adam_root_preconditioner_reads_the_bias_corrected_second_moments():
    from adloco_hf.batch.grad_stats import adam_root_preconditioner

    model, x, y = make_problem(seed=4)
    params = list(model.parameters())
    optimizer = torch.optim.AdamW(params, lr=1e-3, betas=(0.9, 0.95), eps=1e-6)
    assert adam_root_preconditioner(optimizer, params) is None  # no step yet: no metric
    for _ in range(3):
        optimizer.zero_grad()
        chunk_loss(model, x, y).backward()
        optimizer.step()
    roots = adam_root_preconditioner(optimizer, params)
    for p, root in zip(params, roots):
        v_hat = optimizer.state[p]["exp_avg_sq"] / (1 - 0.95**3)
        assert torch.allclose(root, 1 / (v_hat.sqrt() + 1e-6).sqrt(), rtol=1e-6)


@pytest.mark.parametrize("sizes", [[6, 6], [4, 3, 5]])
def test_preconditioned_statistics_are_the_norms_in_p_metric(sizes):
    model, x, y = make_problem(seed=5)
    generator = torch.Generator().manual_seed(0)
    roots = [torch.rand(p.shape, generator=generator) + 0.1 for p in model.parameters()]
    root = torch.cat([r.reshape(-1) for r in roots]).double()
    means, g = brute_force(model, x, y, sizes)
    expected = group_statistics([sq(m * root) for m in means], sizes, sq(g * root))
    collector = GradientStatisticsCollector(model.parameters())
    weights = [s / sum(sizes) for s in sizes]
    model.zero_grad()
    collector.start(weights, roots)
    for j, (xs, ys) in enumerate(zip(torch.split(x, sizes), torch.split(y, sizes))):
        collector.begin_chunk(j)
        (weights[j] * chunk_loss(model, xs, ys)).backward()
    stats = collector.finish(samples=sum(sizes))
    assert stats.variance_sum == pytest.approx(expected.variance_sum, rel=1e-4)
    assert stats.grad_sq_norm == pytest.approx(expected.grad_sq_norm, rel=1e-5)
    euclidean, _ = run_collector(model, x, y, sizes, inner_products=False)
    assert stats.grad_sq_norm != pytest.approx(euclidean.grad_sq_norm, rel=1e-2)  # the metric changed them
    assert torch.allclose(flat_grad(model), g, atol=1e-6)  # the gradient itself is untouched


def test_preconditioned_inner_products_and_previous_step():
    model, x, y = make_problem(seed=6)
    roots = [torch.full(p.shape, 3.0) for p in model.parameters()]  # P = 9: every quantity × 9
    plain, _ = run_collector(model, x, y, [3, 3, 3, 3], inner_products=True)
    collector = GradientStatisticsCollector(model.parameters(), inner_products=True)
    model.zero_grad()
    collector.start([0.25] * 4, roots)
    for j, (xs, ys) in enumerate(zip(torch.split(x, 3), torch.split(y, 3))):
        collector.begin_chunk(j)
        (0.25 * chunk_loss(model, xs, ys)).backward()
    scaled = collector.finish(samples=12)
    # Squared norms scale with P (× 9); the inner-product variance is a sum of squared inner products (× 81).
    factors = {"variance_sum": 9, "inner_product_sum": 81, "orthogonal_sum": 9, "grad_sq_norm": 9}
    for name, factor in factors.items():
        assert getattr(scaled, name) == pytest.approx(factor * getattr(plain, name), rel=1e-4), name
    # One-sample batches: the remembered and the current gradient are both measured in P's metric.
    previous = {}
    for name, root in (("plain", None), ("scaled", roots)):
        model.zero_grad()
        chunk_loss(model, x[:1], y[:1]).backward()
        assert collector.remember()
        model.zero_grad()
        chunk_loss(model, x[1:2], y[1:2]).backward()
        previous[name] = collector.finish_with_previous(root_preconditioner=root)
    for name, factor in factors.items():
        assert getattr(previous["scaled"], name) == pytest.approx(factor * getattr(previous["plain"], name), rel=1e-4)


def _rounds(tmp):
    import json
    import os

    return [json.loads(line) for line in open(os.path.join(tmp, "adloco_rounds.jsonl"))]


def test_a_trainer_measures_in_adams_metric_and_refuses_an_optimizer_without_one(tmp_path):
    from helpers import sequence_dataset, tiny_model

    from adloco_hf import AdLoCoConfig, AdLoCoTrainer

    def config(name, **kwargs):
        return AdLoCoConfig(
            output_dir=str(tmp_path / name), max_steps=30, inner_steps=10, per_device_train_batch_size=4,
            max_batch_size=8, learning_rate=3e-3, use_cpu=True, report_to=[], save_strategy="no", **kwargs,
        )  # fmt: skip

    seen = {}
    for name in ("none", "adam"):
        trainer = AdLoCoTrainer(
            model=tiny_model(), args=config(name, noise_preconditioner=name), train_dataset=sequence_dataset(512)
        )
        trainer.train()
        seen[name] = _rounds(str(tmp_path / name))
    assert len(seen["adam"]) == len(seen["none"]) == 3
    # Every round measured (its statistics step comes after Adam's first step), in another metric than Euclid's.
    assert all(r["grad_variance"] is not None and r["stats_dof"] > 0 for r in seen["adam"])
    for euclid, adam in zip(seen["none"], seen["adam"]):
        assert adam["grad_variance"] != pytest.approx(euclid["grad_variance"], rel=0.05)
    trainer = AdLoCoTrainer(
        model=tiny_model(), args=config("sgd", noise_preconditioner="adam", optim="sgd"),
        train_dataset=sequence_dataset(64),
    )  # fmt: skip
    with pytest.raises(ValueError, match="noise_preconditioner='adam'.*SGD.*noise_preconditioner='none'"):
        trainer.train()
    assert trainer.state.global_step == 0
