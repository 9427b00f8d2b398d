"""`RoundTally`: one worker's running numbers inside the current round (loss, samples, tokens, statistics).

Kept apart from the worker so a checkpoint written inside a round (preemption) can carry it, with the worker's own
weights, and the resumed run can finish the round as if it had never stopped.
"""

from dataclasses import dataclass, field, replace
from typing import Any

import torch

from ..batch.grad_stats import GradientStatisticsCollector
from ..batch.size_tests import GradientStatistics
from ..batch.throughput import RoundTiming


__all__ = ["RoundTally"]


@dataclass
class RoundTally:
    """Sums over the inner steps of the current round; `stats` is the round's statistics step, once measured."""

    loss_sum: torch.Tensor | float = 0.0
    loss_steps: int = 0
    samples: int = 0
    tokens: torch.Tensor | int = 0
    stats: GradientStatistics | None = None
    seconds: float = 0.0  # the inner steps' time (`Worker.step_trained`): the worker's speed for the next split
    timing: RoundTiming = field(default_factory=RoundTiming)  # batch_size_target="goodput" only

    def add_step(self, loss: torch.Tensor, samples: int, tokens: torch.Tensor | int) -> None:
        """Add one inner step (tensors stay on the device: no synchronisation per step)."""
        self.loss_sum = self.loss_sum + loss.detach().float()
        self.loss_steps += 1
        self.samples += samples
        self.tokens = self.tokens + tokens

    def add_passes(self, seconds: float, chunk_sizes: tuple[int, ...], *, split: bool) -> None:
        """A step's forward/backward passes took `seconds` (`split`: the statistics step's halves)."""
        t = self.timing
        if split:
            self.timing = replace(
                t,
                split_seconds=t.split_seconds + seconds,
                split_passes=t.split_passes + len(chunk_sizes),
                split_samples=t.split_samples + sum(chunk_sizes),
            )
        else:
            self.timing = replace(
                t,
                pass_seconds=t.pass_seconds + seconds,
                passes=t.passes + len(chunk_sizes),
                pass_samples=t.pass_samples + sum(chunk_sizes),
            )

    def add_step_rest(self, seconds: float) -> None:
        """A step spent `seconds` outside forward/backward (clipping, optimizer, scheduler, zeroing)."""
        self.timing = replace(
            self.timing, step_seconds=self.timing.step_seconds + seconds, steps=self.timing.steps + 1
        )

    def state_dict(self, params: list[torch.Tensor], collector: GradientStatisticsCollector) -> dict[str, Any] | None:
        """The round so far with this worker's weights `params`, or None at a round's end (nothing to carry)."""
        if self.loss_steps == 0:
            return None
        return {
            "params": [p.detach().cpu().clone() for p in params],
            "loss_sum": float(self.loss_sum),
            "loss_steps": self.loss_steps,
            "samples": self.samples,
            "tokens": float(self.tokens),
            "stats": None if self.stats is None else self.stats.as_list(),
            "seconds": self.seconds,
            "collector": collector.state_dict(),
            "timing": self.timing.as_list(),
        }

    @classmethod
    @torch.no_grad()
    def restore(
        cls, saved: dict[str, Any], params: list[torch.Tensor], collector: GradientStatisticsCollector
    ) -> "RoundTally":
        """Put back this worker's weights and the collector's kept gradient; return the tally to continue from."""
        for param, value in zip(params, saved["params"]):
            param.copy_(value.to(param.device, param.dtype))
        collector.load_state_dict(saved["collector"])
        stats = None if saved["stats"] is None else GradientStatistics.from_list(saved["stats"])
        seconds = float(saved.get("seconds", 0.0))
        timing = RoundTiming.from_list(saved["timing"]) if saved.get("timing") else RoundTiming()
        return cls(saved["loss_sum"], saved["loss_steps"], saved["samples"], saved["tokens"], stats, seconds, timing)
