"""`TrainingObjects`: what the Trainer hands a worker when training begins: the model and its inner optimizer,
scheduler, sampler and gradient scaler. The worker's parts read them; none of them is the Trainer."""

from dataclasses import dataclass
from typing import Any

import torch


__all__ = ["TrainingObjects"]


@dataclass(frozen=True)
class TrainingObjects:
    """The objects one worker process trains with (the Trainer's, built before `Worker.start`).

    Attributes:
        model: the model being trained (unwrapped: its parameters are θ).
        optimizer: the inner optimizer (accelerate's wrapper around it).
        scheduler: the inner learning-rate scheduler.
        sampler: the adaptive batch sampler (map-style or stream) whose `batch_size` the plan sets.
        scaler: fp16's gradient scaler, or None.
    """

    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: Any
    sampler: Any
    scaler: Any = None

    def trainable(self) -> list[torch.nn.Parameter]:
        """The parameters the inner optimizer trains."""
        return [p for p in self.model.parameters() if p.requires_grad]

    def loss_scale(self) -> float:
        """fp16's loss scale now (1.0 without a scaler): the gradient statistics divide it out."""
        scaler = self.scaler
        return float(scaler.get_scale()) if scaler is not None and scaler.is_enabled() else 1.0

    @torch.no_grad()
    def clean_optimizer(self) -> None:
        """After a skipped round, non-finite inner-optimizer moments would poison every later step: zero them."""
        for values in self.optimizer.state.values():
            for value in values.values():
                if torch.is_tensor(value) and value.is_floating_point():
                    torch.nan_to_num_(value, nan=0.0, posinf=0.0, neginf=0.0)
