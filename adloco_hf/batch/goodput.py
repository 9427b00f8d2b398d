"""The goodput rule (`batch_size_target="goodput"`): the per-worker request that trains fastest per second (pure).

Goodput is throughput × statistical efficiency (Pollux, Qiao et al., OSDI 2021; AdaptDL). For an instance of M
workers, each running H inner steps of b samples a round:

- throughput: the samples the instance trains per second, X(b) = M b H / (H step(b) + C), with the step and round
  costs measured on the run ([`StepTimeModel`], `batch/throughput.py`): a slow link (large C) or a large fixed cost
  per pass (a GPU below saturation) makes a larger b cheaper per sample;
- statistical efficiency: what a sample is worth at batch b, relative to one at the reference batch b₀ (the initial
  request). A step of B samples makes the progress of 1 / (1 + B_noise / B) noise-free steps (McCandlish et al.,
  2018, arXiv 1812.06162: S = S_min (1 + B_noise / B), E = E_min (1 + B / B_noise)), so a sample is worth
  E(b) = (B_noise + M b₀) / (B_noise + M b): nearly 1 while M b ≪ B_noise, falling once M b passes it. B_noise is
  the instance's smoothed noise scale tr Σ / ‖∇F‖² (`NoiseEstimate`), in Adam's metric with
  `noise_preconditioner="adam"` (the noise scale that governs an Adam step). The batch it is compared with is the
  instance's, M b, as Pollux compares the whole data-parallel batch: the round averages the M workers'
  pseudo-gradients, so past the critical batch a worker's samples add little to the others' however they are split.
  (The first version compared B_noise with a worker's b alone, counting the M workers' samples as fully additive:
  over a 10 Mbit/s link it grew the request to 34 per worker, 136 per instance step, and lost to a fixed 16 at equal
  seconds; docs/results.md, issue 25.)

Goodput G(b) = X(b) E(b) counts samples per second as if every one had been trained at b₀. The request is what
switch mode turns it into (`plan_batch`: a request between max_batch_size and γ × it runs as max_batch_size, above
it as A passes), per process with `processes_per_worker` = G (requests are multiples of G).

The maximisation is exact and cheap: for a fixed number of passes A, G(b) ∝ b / ((K + Hβb)(B_noise / M + b)) with
K = H(ω + Aα) + C, whose only maximum over b > 0 is at b* = √(K B_noise / (M Hβ)); so the best request of each A lies
at b* rounded either way, or at an end of A's range of requests ([`best_request`]; tested against trying every
request).
"""

import math
from dataclasses import dataclass

from .switch_mode import BatchPlan, SwitchMode
from .throughput import StepTimeModel


__all__ = ["GoodputChoice", "GoodputModel", "choose_request"]


@dataclass(frozen=True)
class GoodputModel:
    """Goodput of an instance's per-worker request (module docstring).

    Attributes:
        times: the measured step and round costs (one process's: a worker's G processes run side by side).
        noise_scale: B_noise, in samples (> 0).
        inner_steps: H of the next round.
        workers: M, the instance's workers.
        processes: G, processes per worker (a request is G × a process's).
        switch: switch mode on a process's device (its largest micro-batch and γ).
        reference: b₀, the per-worker batch whose samples count 1 (the initial request).
    """

    times: StepTimeModel
    noise_scale: float
    inner_steps: int
    workers: int
    processes: int
    switch: SwitchMode
    reference: int

    def plan(self, request: int) -> BatchPlan:
        """What one process of a worker runs for a per-worker `request`."""
        return self.switch.plan(max(1, request // self.processes))

    def throughput(self, request: int) -> float:
        """Samples per second the instance trains with `request`."""
        plan = self.plan(request)
        seconds = self.times.round_seconds(plan.batch_size, plan.accumulation_steps, self.inner_steps)
        samples = self.workers * self.processes * plan.batch_size * self.inner_steps
        return samples / seconds if seconds > 0 else math.inf

    def efficiency(self, request: int) -> float:
        """What a sample of a step of `request` is worth against one of the reference batch: the instance's step
        batch (its M workers' samples) against B_noise (module docstring)."""
        used = self.workers * self.processes * self.plan(request).batch_size
        return (self.noise_scale + self.workers * self.reference) / (self.noise_scale + used)

    def goodput(self, request: int) -> float:
        """Samples per second, each counted at its worth at the reference batch."""
        return self.throughput(request) * self.efficiency(request)

    def _candidates(self, low: int, high: int) -> set[int]:
        """Per-process requests in [low, high] among which the best one lies (module docstring)."""
        t, h = self.times, self.inner_steps
        d = self.noise_scale / (self.processes * self.workers)  # B_noise in a process's samples of every worker
        found = {low, high}
        # Requests in (m, γ m] run as m: none beats m itself, or `low` when it lies in that band (kept above).
        for lo, hi, passes in self.switch.pass_ranges(low, high):
            found.update((lo, hi))
            if t.per_sample <= 0:
                continue  # goodput grows with the batch inside the range: its end is a candidate already
            k = h * (t.per_step + passes * t.per_pass) + t.per_round
            best = math.sqrt(k * d / (h * t.per_sample))
            for r in (math.floor(best), math.ceil(best)):
                found.add(min(max(r, lo), hi))
        return found

    def request_bound(self, low: int, current: int) -> int:
        """A per-worker request above which none can beat the best of [low, ...], without a configured cap.

        No request trains more than X_max = M G / β samples a second (β: a sample's seconds in a pass; every other
        cost only lowers it), and a request r that accumulates is worth E(r) = (B_noise + M b₀) / (B_noise + M r).
        So once X_max E(r) <= g₀, the goodput of a request at hand (`low`, `current`, the largest that runs
        without accumulating), no r beyond can win: the bound is that r, rounded up to a multiple of G, and at
        least `current` (a request is never moved for lying above a bound it did not set) and `low`. Without a
        positive β (no per-sample cost measured yet), the largest request that runs as one pass: γ m, as G × it.
        """
        g, m = self.processes, self.switch.max_batch_size
        no_accumulation = g * math.floor(self.switch.switch_threshold * m)
        floor = max(low, current)
        if not self.times.per_sample > 0:
            return max(floor, no_accumulation)
        at_hand = [r for r in (low, current, max(low, g * m)) if r >= low]
        best = max(self.goodput(r) for r in at_hand)
        if not (math.isfinite(best) and best > 0):
            return max(floor, no_accumulation)
        return max(g * -(-max(floor, no_accumulation + g) // g), self.break_even(best))

    def break_even(self, goodput: float) -> int:
        """The smallest per-worker request (a multiple of G) that even the largest throughput X_max = M G / β could
        not carry to `goodput`: X_max E(r) <= `goodput` (`request_bound`'s proof). It is exact where the proof is
        tight: without fixed costs (ω = α = C = 0) every request trains X_max samples a second, so a request whose
        goodput is `goodput` has this break-even point itself (a multiple of G)."""
        x_max = self.workers * self.processes / self.times.per_sample
        worth = self.noise_scale + self.workers * self.reference
        beyond = (worth * x_max / goodput - self.noise_scale) / self.workers
        # A relative margin for the float round-off of the quotients above, so that an exact request is not rounded
        # up to the next one.
        g = self.processes
        return g * math.ceil(beyond * (1 - 1e-12) / g)

    def best_request(self, low: int, high: int) -> int:
        """The per-worker request in [low, high] (multiples of G) of the highest goodput; the smallest on a tie."""
        g = self.processes
        lo, hi = -(-low // g), high // g
        if lo > hi:
            raise ValueError(f"no request that is a multiple of {g} lies in [{low}, {high}]")
        candidates = sorted(self._candidates(lo, hi))
        return g * max(candidates, key=lambda r: (self.goodput(g * r), -r))


@dataclass(frozen=True)
class GoodputChoice:
    """The goodput rule's decision: the next request, its predicted goodput and that of keeping the current one."""

    request: int
    goodput: float
    kept: float


def choose_request(model: GoodputModel, *, current: int, low: int, high: int, hysteresis: float) -> GoodputChoice:
    """The request of the highest goodput in [low, high], taken only when it beats keeping `current` by at least
    `hysteresis` (0.05: 5 %, what AdaptDL's users asked for: a change costs a new step speed, a new learning rate, a
    restarted estimate; it should pay for them). A current request outside [low, high] always moves."""
    best = model.best_request(low, high)
    gain, kept = model.goodput(best), model.goodput(current)
    inside = low <= current <= high
    if inside and not gain >= (1 + hysteresis) * kept:
        return GoodputChoice(current, kept, kept)
    return GoodputChoice(best, gain, kept)
