"""Gradient-noise statistics and the batch-size tests of AdLoCo (pure functions, no torch).

The tests come from adaptive sampling (Byrd et al. 2012, Bollapragada et al. 2017) as used by AdAdaGrad
(Lau et al. 2024, arXiv 2402.11215) and AdLoCo (arXiv 2508.18182, eqs. 10, 12, 13). One inner step's batch of
b samples is split into m ≥ 2 disjoint groups with n_j samples and mean gradients g_j; g = Σ_j (n_j/b) g_j.
The estimators below are unbiased for any group sizes; per-sample gradients are the case n_j = 1:

- tr Σ̂  = (Σ_j n_j ‖g_j‖² − b ‖g‖²) / (m − 1)                  per-sample gradient variance
- V̂_ip  = Σ_j n_j (⟨g_j, g⟩ − ‖g‖²)² / (m − 1)
- V̂_orth = Σ_j n_j (‖g_j‖² − ⟨g_j, g⟩² / ‖g‖²) / (m − 1)

Each test gives the total batch T an instance needs; the per-worker request for M workers is ⌈T / M⌉.

Over an instance's M workers the numerators and degrees of freedom add up. The tests' ‖g‖² is that of the
instance's whole batch B = Σ_w b_w, estimated without sending any gradient: a worker's ‖g_w‖² overestimates
‖∇F‖² by tr Σ / b_w, so ‖∇F‖² ≈ mean_w (‖g_w‖² − tr Σ̂ / b_w) (clamped at 0) and ‖g‖² ≈ that + tr Σ̂ / B, which is
E‖g_B‖² for the instance's batch. The plain mean of the workers' ‖g_w‖² would carry the bias of one worker's
batch, tr Σ / b, instead of tr Σ / B: the norm test's T would stay below b / η², and with η = 0.8 an instance of two
or more workers could never grow its per-worker request.
"""

import math
from collections.abc import Sequence
from dataclasses import dataclass

from ..config.choices import BATCH_SIZE_TESTS


__all__ = [
    "BATCH_SIZE_TESTS",
    "GradientStatistics",
    "PooledStatistics",
    "augmented_inner_product_test",
    "estimate_inner_product_variance",
    "estimate_orthogonal_variance",
    "estimate_variance",
    "group_statistics",
    "inner_product_test",
    "next_batch_size",
    "norm_test",
    "pool_statistics",
]


def _check_groups(group_sizes: Sequence[float], *others: Sequence[float]) -> None:
    if len(group_sizes) < 2:
        raise ValueError(f"the estimators need at least 2 groups, got {len(group_sizes)}")
    for other in others:
        if len(other) != len(group_sizes):
            raise ValueError(f"every per-group sequence needs {len(group_sizes)} entries, got {len(other)}")


def estimate_variance(group_sq_norms: Sequence[float], group_sizes: Sequence[float], grad_sq_norm: float) -> float:
    """Unbiased estimate of tr Σ, the per-sample gradient variance, from m ≥ 2 group means.

    Args:
        group_sq_norms: ‖g_j‖², the squared norm of group j's mean gradient.
        group_sizes: n_j, the samples in group j (may be fractional when groups are weighted by tokens).
        grad_sq_norm: ‖g‖², the squared norm of the whole batch's mean gradient.

    Returns:
        tr Σ̂ as a Python float (can be slightly negative from round-off when the noise is tiny).
    """
    _check_groups(group_sizes, group_sq_norms)
    batch = sum(group_sizes)
    weighted = sum(n * q for n, q in zip(group_sizes, group_sq_norms))
    return float((weighted - batch * grad_sq_norm) / (len(group_sizes) - 1))


def estimate_inner_product_variance(
    group_dots: Sequence[float], group_sizes: Sequence[float], grad_sq_norm: float
) -> float:
    """V̂_ip = Σ_j n_j (⟨g_j, g⟩ − ‖g‖²)² / (m − 1), with `group_dots[j]` = ⟨g_j, g⟩."""
    _check_groups(group_sizes, group_dots)
    total = sum(n * (d - grad_sq_norm) ** 2 for n, d in zip(group_sizes, group_dots))
    return float(total / (len(group_sizes) - 1))


def estimate_orthogonal_variance(
    group_sq_norms: Sequence[float], group_dots: Sequence[float], group_sizes: Sequence[float], grad_sq_norm: float
) -> float:
    """V̂_orth = Σ_j n_j (‖g_j‖² − ⟨g_j, g⟩² / ‖g‖²) / (m − 1); NaN when ‖g‖² is zero."""
    _check_groups(group_sizes, group_sq_norms, group_dots)
    if grad_sq_norm == 0:
        return math.nan
    total = sum(n * (q - d * d / grad_sq_norm) for n, q, d in zip(group_sizes, group_sq_norms, group_dots))
    return float(total / (len(group_sizes) - 1))


def _per_worker(total: float, num_workers: int) -> int:
    """⌈T / M⌉, at least 1; 1 (no growth) when T is not a finite non-negative number."""
    if num_workers < 1:
        raise ValueError(f"num_workers must be >= 1, got {num_workers}")
    if not math.isfinite(total) or total <= 0:
        return 1
    return max(1, math.ceil(total / num_workers))


def _ratio(numerator: float, denominator: float) -> float:
    if not (math.isfinite(numerator) and math.isfinite(denominator)) or denominator <= 0:
        return math.nan
    return numerator / denominator


def norm_test(variance: float, grad_sq_norm: float, eta: float, num_workers: int = 1) -> int:
    """Norm test (AdLoCo eq. 10): T = tr Σ̂ / (η² ‖g‖²), returned per worker as ⌈T / M⌉ ≥ 1.

    A zero or non-finite denominator returns 1, which leaves a non-shrinking request unchanged.
    """
    return _per_worker(_ratio(variance, eta**2 * grad_sq_norm), num_workers)


def inner_product_test(ip_variance: float, grad_sq_norm: float, theta: float, num_workers: int = 1) -> int:
    """Inner-product test (AdLoCo eq. 12): T = V̂_ip / (ϑ² ‖g‖⁴), per worker ⌈T / M⌉ ≥ 1."""
    if not grad_sq_norm > 0:
        return 1
    return _per_worker(_ratio(ip_variance, theta**2 * grad_sq_norm**2), num_workers)


def augmented_inner_product_test(
    ip_variance: float, orth_variance: float, grad_sq_norm: float, theta: float, nu: float, num_workers: int = 1
) -> int:
    """Augmented inner-product test (AdLoCo eq. 13): T = max(V̂_ip / (ϑ² ‖g‖⁴), V̂_orth / (ν² ‖g‖²))."""
    if not grad_sq_norm > 0:
        return 1
    ip = _ratio(ip_variance, theta**2 * grad_sq_norm**2)
    orth = _ratio(orth_variance, nu**2 * grad_sq_norm)
    finite = [t for t in (ip, orth) if math.isfinite(t)]
    return _per_worker(max(finite) if finite else math.nan, num_workers)


@dataclass(frozen=True)
class GradientStatistics:
    """One worker's statistics for one step, kept as numerators and degrees of freedom so workers can pool them.

    Attributes:
        variance_sum: Σ_j n_j ‖g_j‖² − b ‖g‖² (numerator of tr Σ̂).
        inner_product_sum: Σ_j n_j (⟨g_j, g⟩ − ‖g‖²)² (numerator of V̂_ip), NaN when not measured.
        orthogonal_sum: Σ_j n_j (‖g_j‖² − ⟨g_j, g⟩² / ‖g‖²) (numerator of V̂_orth), NaN when not measured.
        dof: m − 1, the degrees of freedom.
        grad_sq_norm: ‖g‖² of this worker's step gradient.
        samples: b, the samples the groups cover.
    """

    variance_sum: float
    inner_product_sum: float
    orthogonal_sum: float
    dof: float
    grad_sq_norm: float
    samples: float

    FIELDS = ("variance_sum", "inner_product_sum", "orthogonal_sum", "dof", "grad_sq_norm", "samples")

    def as_list(self) -> list[float]:
        return [float(getattr(self, name)) for name in self.FIELDS]

    @classmethod
    def from_list(cls, values: Sequence[float]) -> "GradientStatistics":
        return cls(*(float(v) for v in values))

    @classmethod
    def missing(cls) -> "GradientStatistics":
        """Placeholder for a worker that measured nothing this round (it adds no degrees of freedom)."""
        return cls(0.0, 0.0, 0.0, 0.0, math.nan, 0.0)

    @property
    def is_valid(self) -> bool:
        finite = math.isfinite(self.variance_sum) and math.isfinite(self.grad_sq_norm)
        return self.dof > 0 and self.samples > 0 and finite


def group_statistics(
    group_sq_norms: Sequence[float],
    group_sizes: Sequence[float],
    grad_sq_norm: float,
    group_dots: Sequence[float] | None = None,
) -> GradientStatistics:
    """Numerators of the three estimators for one worker's groups (`group_dots` = ⟨g_j, g⟩, when measured)."""
    _check_groups(group_sizes, group_sq_norms)
    dof = len(group_sizes) - 1
    variance_sum = estimate_variance(group_sq_norms, group_sizes, grad_sq_norm) * dof
    if group_dots is None:
        ip_sum = orth_sum = math.nan
    else:
        ip_sum = estimate_inner_product_variance(group_dots, group_sizes, grad_sq_norm) * dof
        orth_sum = estimate_orthogonal_variance(group_sq_norms, group_dots, group_sizes, grad_sq_norm) * dof
    return GradientStatistics(variance_sum, ip_sum, orth_sum, float(dof), float(grad_sq_norm), float(sum(group_sizes)))


@dataclass(frozen=True)
class PooledStatistics:
    """Statistics pooled over the workers of one instance.

    Attributes:
        variance, ip_variance, orth_variance: tr Σ̂, V̂_ip and V̂_orth, per sample.
        grad_sq_norm: ‖g‖² of the instance's whole batch (estimated, see `pool_statistics`): what the tests divide by.
        true_grad_sq_norm: the estimate of ‖∇F‖² it is built from (≥ 0).
        samples: B, the samples of the instance's statistics step (all its workers).
        dof: degrees of freedom of the estimators.
        workers: workers that contributed.
        signal: the unbiased estimate of ‖∇F‖² before the clamp (may be ≤ 0; `batch_controller` smooths it).
    """

    variance: float
    ip_variance: float
    orth_variance: float
    grad_sq_norm: float
    true_grad_sq_norm: float
    samples: float
    dof: float
    workers: int
    signal: float = math.nan


def pool_statistics(stats: Sequence[GradientStatistics]) -> PooledStatistics:
    """Pool workers' statistics into the instance's (see the module docstring), with no gradient exchanged.

    Numerators and degrees of freedom add up. ‖∇F‖² is estimated as mean_w (‖g_w‖² − tr Σ̂ / b_w), unbiased and
    clamped at 0 (a noise-dominated step can make it negative), and the instance's ‖g‖² as that plus tr Σ̂ / B.
    With one worker this is its own ‖g_w‖² unless the estimate of ‖∇F‖² is negative; the clamp then bounds the
    norm test's request to b / η², a growth of at most 1 / η² per round. Workers that measured nothing (dof 0, e.g.
    fp16 overflow on the statistics step) are left out.
    """
    valid = [s for s in stats if s.is_valid]
    if not valid:
        return PooledStatistics(math.nan, math.nan, math.nan, math.nan, math.nan, 0.0, 0.0, 0)
    dof = sum(s.dof for s in valid)
    variance = sum(s.variance_sum for s in valid) / dof
    noise = max(variance, 0.0)  # round-off can make tr Σ̂ slightly negative when the noise is tiny
    samples = sum(s.samples for s in valid)
    signal = sum(s.grad_sq_norm - noise / s.samples for s in valid) / len(valid)
    true_sq = max(signal, 0.0)
    return PooledStatistics(
        variance=variance,
        ip_variance=sum(s.inner_product_sum for s in valid) / dof,
        orth_variance=sum(s.orthogonal_sum for s in valid) / dof,
        grad_sq_norm=true_sq + noise / samples,
        true_grad_sq_norm=true_sq,
        samples=samples,
        dof=dof,
        workers=len(valid),
        signal=signal,
    )


def next_batch_size(
    test: str,
    pooled: PooledStatistics,
    *,
    current: int,
    num_workers: int,
    eta: float,
    theta: float,
    nu: float,
    cap: int | None = None,
) -> int:
    """The instance's next per-worker request: b ← min(max(b, test), cap); it never shrinks.

    Missing or degenerate statistics (no valid worker, zero or non-finite denominators) keep the current request.
    """
    if test not in BATCH_SIZE_TESTS:
        raise ValueError(f"unknown batch_size_test {test!r}; choose one of {BATCH_SIZE_TESTS}")
    if test == "none" or pooled.workers == 0:
        wanted = current
    elif test == "norm":
        wanted = norm_test(pooled.variance, pooled.grad_sq_norm, eta, num_workers)
    elif test == "inner_product":
        wanted = inner_product_test(pooled.ip_variance, pooled.grad_sq_norm, theta, num_workers)
    else:
        wanted = augmented_inner_product_test(
            pooled.ip_variance, pooled.orth_variance, pooled.grad_sq_norm, theta, nu, num_workers
        )
    new = max(current, wanted)
    if cap is not None:
        new = min(new, max(cap, current))
    return int(new)
