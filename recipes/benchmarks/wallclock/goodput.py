"""The goodput rule replayed in the 1B/H100 scenario: one instance of the scenario's workers whose per-worker batch the
rule (`adloco_hf.batch.goodput`, the library's own code) chooses at every round's end.

What the rule sees here is the scenario's, not a measurement: the step costs of its device profile (forward/backward
linear in the sequences, the optimizer step, the outer step's local work) and the round's modelled communication
(the bf16 ring all-reduce over the link, the two control collectives), and a noise scale that grows during
training (an assumption: the critical batch starts small and grows, Merrill et al. 2025, arXiv 2505.23971; stated
with the results). The tokens the run needs follow the same efficiency model the rule uses (McCandlish et al.,
2018): a step of b sequences on each of M workers is worth (B_noise + M b₀) / (B_noise + M b) of a step at the
initial batch b₀ per sequence, so the run trains until those weighted tokens reach DiLoCo's tokens to target at b₀.
"""

import math
from dataclasses import dataclass

from adloco_hf import plan_batch
from adloco_hf.inspection import GoodputModel, StepTimeModel, SwitchMode, choose_request, fit_pass_seconds
from recipes.benchmarks.toolkit.link_model import (
    OUTER_BUCKET_NUMEL,
    DeviceProfile,
    Link,
    control_seconds,
    ring_all_reduce_seconds,
)


__all__ = ["GoodputAssumptions", "goodput_lines", "step_time_model"]


@dataclass(frozen=True)
class GoodputAssumptions:
    """The noise scale in tokens, linear in the run's progress from `noise_start` to `noise_end`; the largest
    per-worker request (`cap`, sequences) and the hysteresis of the rule."""

    noise_start_tokens: float = 0.25e6
    noise_end_tokens: float = 2.0e6
    cap: int = 128
    hysteresis: float = 0.05

    def noise_scale(self, progress: float, sequence_length: int) -> float:
        """B_noise in sequences at `progress` (0 to 1) of the run."""
        fraction = min(max(progress, 0.0), 1.0)
        tokens = self.noise_start_tokens + fraction * (self.noise_end_tokens - self.noise_start_tokens)
        return tokens / sequence_length


def step_time_model(profile: DeviceProfile, link: Link, *, numel: int, workers: int, grad_bytes: int) -> StepTimeModel:
    """The rule's model of the scenario's device and link: α and β fitted to the profile's forward/backward points
    (as the library fits its measured pass sizes), ω the optimizer step and per-step overhead, C the round's outer
    step: its local work, the pseudo-gradient's ring all-reduce and the round-end control collectives."""
    points = [(float(b), s) for b, s in profile.micro_batch_seconds.items()]
    per_pass, per_sample = fit_pass_seconds(points)
    all_reduce = ring_all_reduce_seconds(grad_bytes * numel, workers, link, OUTER_BUCKET_NUMEL * grad_bytes)
    return StepTimeModel(
        per_step=profile.optimizer_seconds + profile.step_overhead_seconds,
        per_pass=per_pass,
        per_sample=per_sample,
        per_round=profile.outer_seconds + all_reduce + control_seconds(workers, link, 2),
    )


def goodput_lines(
    times: StepTimeModel,
    assumptions: GoodputAssumptions,
    *,
    workers: int,
    batch: int,
    micro_batch: int,
    inner_steps: int,
    sequence_length: int,
    target_tokens: float,
) -> tuple[list[dict], dict]:
    """Rounds (the rounds-file lines `replay_adloco` reads) of one instance of `workers` workers starting at `batch`
    sequences per worker, the request chosen by the goodput rule at every round's end, until the efficiency-weighted
    tokens reach `target_tokens`. Returns the lines and a summary (tokens trained, mean batch, requests)."""
    lines, request, weighted, trained, requests = [], batch, 0.0, 0.0, []
    cap = max(assumptions.cap, batch)
    while weighted < target_tokens:
        index = len(lines)
        noise = assumptions.noise_scale(weighted / target_tokens, sequence_length)
        plan = plan_batch(request, micro_batch, 2.0)
        tokens = plan.batch_size * workers * inner_steps * sequence_length
        model = GoodputModel(times, noise, inner_steps, workers, 1, SwitchMode(micro_batch, 2.0), batch)
        choice = choose_request(model, current=request, low=batch, high=cap, hysteresis=assumptions.hysteresis)
        lines.append(
            {
                "outer_step": index + 1,
                "global_step": (index + 1) * inner_steps,
                "instance": 0,
                "workers": list(range(workers)),
                "batch_size": request,
                "next_batch_size": choice.request,
                "micro_batch_size": plan.micro_batch_size,
                "accumulation_steps": plan.accumulation_steps,
                "tokens": tokens,
                "merged_from": [],
                "comm_bytes": 0,
                "noise_scale": noise,
            }
        )
        weighted += tokens * model.efficiency(request)
        trained += tokens
        requests.append(request)
        request = choice.request
        if index > 10**6:
            raise RuntimeError("the goodput replay did not reach its target")
    summary = {
        "tokens": trained,
        "weighted_tokens": weighted,
        "rounds": len(lines),
        "mean_batch": sum(requests) / len(requests),
        "first_batches": requests[:3],
        "last_batch": requests[-1],
        "max_batch": max(requests),
        "tokens_vs_fixed": trained / target_tokens if target_tokens else math.nan,
    }
    return lines, summary
