"""How an instance's per-worker request moves from round to round (pure; the same on every rank).

The paper's controller takes one round's statistics, clamps a non-positive estimate of ‖∇F‖² at 0 and keeps the
running maximum of the test. With two half-batches the estimate of ‖∇F‖² is often ≤ 0; the clamp then asks for
B / η² (a fixed ×1.56 jump at η = 0.8), and "never shrink" keeps the maximum of a noisy statistic: the batch
follows the estimator's noise rather than the gradient noise. This module adds, each an option:

- **smoothing** (`batch_size_smoothing` = β): exponential moving averages across rounds of tr Σ̂ and of the
  unbiased, unclamped ‖∇F‖² estimate, *separately*, with bias correction (v̄ = Σ β^k x_k (1 − β) / (1 − β^n));
  the tests then use their ratio. β = 0 is the paper's one-round estimate.
- **a non-positive signal keeps the request** (`nonpositive_signal="keep"`): when the (smoothed) ‖∇F‖² estimate
  is ≤ 0 there is no information about the ratio, so nothing changes; `"clamp"` is the paper's.
- **shrinking** (`batch_size_shrink`): a request may fall, but only when the test asks for less than
  `shrink_hysteresis` × the current one, and never below `batch_size_floor`.
- **a target in units of the noise scale** (`batch_size_target="noise_scale"`): T = `noise_scale_multiple` ×
  B_noise, B_noise = tr Σ / ‖∇F‖² (McCandlish et al., 2018, the "simple" noise scale). The norm test's own fixed
  point is T = B_noise (1 − η²) / η², 0.56 B_noise at η = 0.8.
- **goodput** (`batch_size_target="goodput"`): the request that trains fastest per second, from the same smoothed
  noise scale and the step costs measured on the run (`batch/goodput.py`; `rounds/decision.py` asks it instead of
  `next_request`).

Smoothing and the target apply to the norm test; the inner-product tests keep their one-round form.
"""

import math
from dataclasses import dataclass

from ..config.choices import BATCH_SIZE_TARGETS, NONPOSITIVE_SIGNAL
from .size_tests import PooledStatistics, next_batch_size


__all__ = ["BATCH_SIZE_TARGETS", "NONPOSITIVE_SIGNAL", "ControllerRules", "NoiseEstimate", "next_request"]


@dataclass(frozen=True)
class NoiseEstimate:
    """Moving averages of tr Σ̂ and ‖∇F‖² for one instance, as bias-corrected sums (`weight` = Σ of the weights)."""

    variance: float = 0.0
    signal: float = 0.0
    weight: float = 0.0

    def update(self, pooled: PooledStatistics, smoothing: float) -> "NoiseEstimate":
        """With this round's pooled statistics (unchanged when they are missing or not finite)."""
        if pooled.workers == 0 or not (math.isfinite(pooled.variance) and math.isfinite(pooled.signal)):
            return self
        keep = smoothing
        return NoiseEstimate(
            variance=keep * self.variance + (1 - keep) * pooled.variance,
            signal=keep * self.signal + (1 - keep) * pooled.signal,
            weight=keep * self.weight + (1 - keep),
        )

    @property
    def mean_variance(self) -> float:
        return self.variance / self.weight if self.weight > 0 else math.nan

    @property
    def mean_signal(self) -> float:
        return self.signal / self.weight if self.weight > 0 else math.nan

    @property
    def noise_scale(self) -> float:
        """B_noise = tr Σ / ‖∇F‖² from the averages; NaN while the signal is not positive."""
        signal = self.mean_signal
        return self.mean_variance / signal if signal > 0 else math.nan

    @staticmethod
    def combine(a: "NoiseEstimate", b: "NoiseEstimate", weights: tuple[float, float]) -> "NoiseEstimate":
        """A merged instance's: the two averages weighted like the merge (one that has none counts for nothing)."""
        parts = [(e, w) for e, w in zip((a, b), weights) if e.weight > 0 and w > 0]
        if not parts:
            return a if a.weight > 0 else b
        total = sum(w for _, w in parts)
        return NoiseEstimate(
            variance=sum(w * e.mean_variance for e, w in parts) / total,
            signal=sum(w * e.mean_signal for e, w in parts) / total,
            weight=1.0,
        )

    def to_list(self) -> list[float]:
        return [self.variance, self.signal, self.weight]

    @classmethod
    def from_list(cls, values) -> "NoiseEstimate":
        return cls(*(float(v) for v in values)) if values else cls()


@dataclass(frozen=True)
class ControllerRules:
    """The settings of the request's update (from `AdLoCoConfig`); the defaults are the paper's controller."""

    test: str = "norm"
    eta: float = 0.8
    theta: float = 0.3
    nu: float = 0.3
    cap: int | None = None
    smoothing: float = 0.0
    nonpositive_signal: str = "clamp"
    shrink: bool = False
    shrink_hysteresis: float = 0.5
    floor: int = 1
    target: str = "test"
    noise_scale_multiple: float = 1.0
    goodput_hysteresis: float = 0.05  # batch_size_target="goodput" (`batch/goodput.py`)
    # Where the goodput rule's step and round costs come from: the startup profile alone ("startup"), the profile and
    # then every round's timings ("startup_live"), or the rounds' timings alone ("live"; `batch/startup_profile.py`).
    goodput_timing: str = "startup"
    # batch_size_target="goodput" without batch_size_cap: the rule bounds its own search (`request_bound`).
    derived_cap: bool = False

    @property
    def is_paper(self) -> bool:
        return self.smoothing == 0 and self.nonpositive_signal == "clamp" and not self.shrink and self.target == "test"


def _wanted_total(rules: ControllerRules, estimate: NoiseEstimate, batch: float) -> float | None:
    """The total batch the norm test (or the noise-scale target) asks for; None when it says nothing."""
    variance, signal = estimate.mean_variance, estimate.mean_signal
    if not (math.isfinite(variance) and math.isfinite(signal)):
        return None
    variance = max(variance, 0.0)
    if signal <= 0 and rules.nonpositive_signal == "keep":
        return None
    signal = max(signal, 0.0)
    if rules.target == "noise_scale":
        return rules.noise_scale_multiple * variance / signal if signal > 0 else None
    denominator = rules.eta**2 * (signal + variance / batch)
    return variance / denominator if denominator > 0 else None


def next_request(
    rules: ControllerRules, pooled: PooledStatistics, estimate: NoiseEstimate, *, current: int, num_workers: int
) -> int:
    """The instance's next per-worker request from this round's `pooled` statistics and its updated `estimate`.

    With the paper's rules this is `batch_size.next_batch_size` exactly. Otherwise the norm test (or the target)
    reads the smoothed estimate, a request only falls when shrinking is on and the test asks for less than
    `shrink_hysteresis` × it, and `cap` bounds growth.
    """
    if rules.is_paper or rules.test in ("inner_product", "augmented_inner_product") or rules.test == "none":
        return next_batch_size(
            rules.test,
            pooled,
            current=current,
            num_workers=num_workers,
            eta=rules.eta,
            theta=rules.theta,
            nu=rules.nu,
            cap=rules.cap,
        )
    if pooled.workers == 0:
        # No statistics this round (an fp16 overflow, say): the estimate is the one the current request was
        # already computed from, so reading it again would move the request on old information.
        return current
    batch = pooled.samples if pooled.samples > 0 else current * num_workers
    total = _wanted_total(rules, estimate, batch)
    if total is None or not math.isfinite(total):
        return current
    wanted = max(1, math.ceil(total / num_workers))
    if wanted >= current:
        new = wanted
        if rules.cap is not None:
            new = min(new, max(rules.cap, current))
        return int(new)
    if rules.shrink and wanted < rules.shrink_hysteresis * current:
        return int(max(wanted, min(rules.floor, current)))
    return current
