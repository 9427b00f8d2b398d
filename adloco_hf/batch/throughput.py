"""What a step and a round cost on this run's hardware and link, measured on the run itself (pure; no torch).

The goodput rule (`batch/goodput.py`) needs the seconds of an inner step for requests the run has not tried. A step of
switch mode's plan (A chunks whose sizes n_j add up to the batch b) costs

    step(plan) = ω + Σ_j (α + β n_j) = ω + A α + β b

with ω the seconds a step spends outside forward and backward (clipping, the optimizer, the scheduler, zeroing the
gradients), α the fixed cost of one forward/backward pass (on a GPU the weights are read once per pass whatever its
size: large below saturation) and β the seconds per sample of a pass; a round of H steps costs H × step(plan) + C, C
the seconds of its outer step (the all-reduce on the link, the outer SGD). This is the throughput model of Pollux
(Qiao et al., OSDI 2021) with the round's communication spread over its H steps instead of a gradient all-reduce in
every step.

Every worker measures, per round, its passes: the ordinary steps' (each of the plan's micro-batch size) and the
statistics step's, whose batch is split into two halves when the plan does not accumulate (`switch_mode.plan_step`):
two pass sizes each round, which is what separates α from β. The worker sends these sums ([`RoundTiming`]) in its
round report, so every rank fits the same model from the same all-gathered numbers; an instance keeps bias-corrected
moving averages of them per pass size ([`ThroughputProfile`], checkpointed with the instance) and fits α and β by
least squares over its sizes ([`StepTimeModel`]).
"""

import math
from collections.abc import Sequence
from dataclasses import dataclass


__all__ = ["RoundTiming", "StepTimeModel", "ThroughputProfile", "fit_pass_seconds"]

# Pass sizes an instance remembers (the most recently measured ones): enough for a line, few enough to follow a
# machine whose speed changes.
MAX_PASS_SIZES = 6


@dataclass(frozen=True)
class RoundTiming:
    """One process's step timings over one round, as sums (a row of the round-end all-gather).

    Attributes:
        pass_seconds, passes, pass_samples: the forward/backward passes of the ordinary steps (the plan's chunks):
            their seconds, their number and their samples.
        split_seconds, split_passes, split_samples: the same for the statistics step when its batch was split into
            halves (a plan that accumulates measures on its own chunks, counted as ordinary passes).
        step_seconds, steps: the seconds the steps spent outside forward/backward, and the steps timed.
    """

    pass_seconds: float = 0.0
    passes: float = 0.0
    pass_samples: float = 0.0
    split_seconds: float = 0.0
    split_passes: float = 0.0
    split_samples: float = 0.0
    step_seconds: float = 0.0
    steps: float = 0.0

    FIELDS = (
        "pass_seconds",
        "passes",
        "pass_samples",
        "split_seconds",
        "split_passes",
        "split_samples",
        "step_seconds",
        "steps",
    )

    def as_list(self) -> list[float]:
        return [float(getattr(self, name)) for name in self.FIELDS]

    @classmethod
    def from_list(cls, values: Sequence[float]) -> "RoundTiming":
        return cls(*(float(v) for v in values))

    def pass_points(self) -> list[tuple[float, float]]:
        """(mean samples of a pass, seconds per pass) of each kind of pass this round measured."""
        points = []
        for seconds, count, samples in (
            (self.pass_seconds, self.passes, self.pass_samples),
            (self.split_seconds, self.split_passes, self.split_samples),
        ):
            if count > 0 and samples > 0 and math.isfinite(seconds) and seconds >= 0:
                points.append((samples / count, seconds / count))
        return points


def fit_pass_seconds(points: Sequence[tuple[float, float]]) -> tuple[float, float] | None:
    """(α, β) of seconds per pass = α + β × samples, least squares over `points` (samples, seconds), both ≥ 0.

    One size cannot separate α from β: the pass is then taken as proportional to its samples (α = 0), the cautious
    reading, under which a larger micro-batch is never cheaper per sample. A fit whose slope comes out negative (noise
    between close sizes) is flat (β = 0, α the mean); one whose intercept is negative goes through 0. None without a
    point.
    """
    points = [(m, s) for m, s in points if m > 0 and math.isfinite(s) and s >= 0]
    if not points:
        return None
    sizes = [m for m, _ in points]
    if len(points) == 1 or max(sizes) - min(sizes) <= 1e-9 * max(sizes):
        return 0.0, sum(s for _, s in points) / sum(sizes)
    n = len(points)
    mean_m = sum(sizes) / n
    mean_s = sum(s for _, s in points) / n
    var = sum((m - mean_m) ** 2 for m in sizes)
    slope = sum((m - mean_m) * (s - mean_s) for m, s in points) / var
    intercept = mean_s - slope * mean_m
    if slope < 0:
        return mean_s, 0.0
    if intercept < 0:
        return 0.0, sum(m * s for m, s in points) / sum(m * m for m in sizes)
    return intercept, slope


@dataclass(frozen=True)
class StepTimeModel:
    """Seconds of a step and of a round: step = ω + A α + β b, round = H × step + C (module docstring)."""

    per_step: float  # ω
    per_pass: float  # α
    per_sample: float  # β
    per_round: float  # C

    def step_seconds(self, batch: int, passes: int) -> float:
        """An inner step of `batch` samples in `passes` forward/backward passes."""
        return self.per_step + passes * self.per_pass + self.per_sample * batch

    def round_seconds(self, batch: int, passes: int, inner_steps: int) -> float:
        return inner_steps * self.step_seconds(batch, passes) + self.per_round

    def as_list(self) -> list[float]:
        return [self.per_step, self.per_pass, self.per_sample, self.per_round]


def _ema(old: tuple[float, float], value: float, smoothing: float) -> tuple[float, float]:
    """A bias-corrected moving average kept as (Σ weights × values, Σ weights)."""
    total, weight = old
    return smoothing * total + (1 - smoothing) * value, smoothing * weight + (1 - smoothing)


def _mean(average: tuple[float, float]) -> float:
    total, weight = average
    return total / weight if weight > 0 else math.nan


@dataclass(frozen=True)
class ThroughputProfile:
    """An instance's moving averages of its measured step costs (state: checkpointed with the instance).

    Attributes:
        passes: per pass size (mean samples of a pass), (size, Σ weights × seconds per pass, Σ weights), the most
            recently measured last.
        step: ω's average, (Σ weights × seconds, Σ weights).
        round: C's average, (Σ weights × seconds, Σ weights).
    """

    passes: tuple[tuple[float, float, float], ...] = ()
    step: tuple[float, float] = (0.0, 0.0)
    round: tuple[float, float] = (0.0, 0.0)

    def update(self, timings: Sequence[RoundTiming], round_seconds: float, smoothing: float) -> "ThroughputProfile":
        """With one round's timings of the instance's processes and the seconds of its outer step.

        A round waits for its slowest process, so each pass size takes the slowest process's seconds per pass, and ω
        the slowest one's seconds per step. `round_seconds` (C) is the outer step's time as the instance saw it (the
        caller passes the fastest process's: the others' include waiting for the last one to arrive). What was not
        measured (no pass of a size, no step timed, a non-finite number) leaves its average as it was.
        """
        per_size: dict[float, float] = {}
        for timing in timings:
            for size, seconds in timing.pass_points():
                key = round(size, 3)
                per_size[key] = max(per_size.get(key, 0.0), seconds)
        passes = {size: (total, weight) for size, total, weight in self.passes}
        order = [size for size, _, _ in self.passes if size not in per_size]
        for size, seconds in sorted(per_size.items()):
            passes[size] = _ema(passes.get(size, (0.0, 0.0)), seconds, smoothing)
            order.append(size)
        order = order[-MAX_PASS_SIZES:]
        steps = [t.step_seconds / t.steps for t in timings if t.steps > 0 and math.isfinite(t.step_seconds)]
        step = _ema(self.step, max(steps), smoothing) if steps else self.step
        measured_round = math.isfinite(round_seconds) and round_seconds >= 0
        round_average = _ema(self.round, round_seconds, smoothing) if measured_round else self.round
        return ThroughputProfile(
            passes=tuple((size, *passes[size]) for size in order),
            step=step,
            round=round_average,
        )

    def model(self) -> StepTimeModel | None:
        """The fitted [`StepTimeModel`], or None before the first measured pass."""
        fit = fit_pass_seconds([(size, total / weight) for size, total, weight in self.passes if weight > 0])
        if fit is None:
            return None
        step, per_round = _mean(self.step), _mean(self.round)
        return StepTimeModel(
            per_step=step if math.isfinite(step) else 0.0,
            per_pass=fit[0],
            per_sample=fit[1],
            per_round=per_round if math.isfinite(per_round) else 0.0,
        )

    @staticmethod
    def combine(a: "ThroughputProfile", b: "ThroughputProfile", weights: tuple[float, float]) -> "ThroughputProfile":
        """A merged instance's: the two averages weighted like the merge (same hardware, one set of sizes). A size
        only one of them measured keeps that one's average."""
        wa, wb = weights
        if wa + wb <= 0:
            wa = wb = 1.0

        def mix(x: tuple[float, float] | None, y: tuple[float, float] | None) -> tuple[float, float]:
            parts = [(p, w) for p, w in ((x, wa), (y, wb)) if p is not None and p[1] > 0 and w > 0]
            if not parts:
                return x if x is not None and x[1] > 0 else (y or (0.0, 0.0))
            total = sum(w for _, w in parts)
            return sum(w * _mean(p) for p, w in parts) / total, 1.0

        sizes_a = {size: (t, w) for size, t, w in a.passes}
        sizes_b = {size: (t, w) for size, t, w in b.passes}
        order = [size for size in sizes_a if size not in sizes_b] + list(sizes_b)
        passes = tuple((size, *mix(sizes_a.get(size), sizes_b.get(size))) for size in order[-MAX_PASS_SIZES:])
        return ThroughputProfile(passes=passes, step=mix(a.step, b.step), round=mix(a.round, b.round))

    def to_list(self) -> list:
        return [[list(p) for p in self.passes], list(self.step), list(self.round)]

    @classmethod
    def from_list(cls, values) -> "ThroughputProfile":
        if not values:
            return cls()
        passes, step, round_ = values
        return cls(
            passes=tuple(tuple(float(v) for v in p) for p in passes),
            step=tuple(float(v) for v in step),
            round=tuple(float(v) for v in round_),
        )
