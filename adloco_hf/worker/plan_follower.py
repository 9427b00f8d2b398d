"""`PlanFollower`: a worker's sampler and inner optimizer follow its plan for the round, applied as a whole.

The plan (`rounds/plan.py`) says how many samples the worker's sampler draws per inner step and the learning-rate
factor (and, with `lr_batch_scaling="sqrt_adam"`, the batch Adam's β, ε and weight decay follow). The factors always
apply to the rates and hyperparameters the optimizer was built with, kept here and in the checkpoints, never to what
the optimizer holds now: nothing compounds over rounds, merges or resumes.
"""

from typing import Any

from ..batch.grad_stats import check_adam_moments
from ..batch.lr_scaling import (
    ADAM_RULES,
    adam_hyperparameters,
    apply_adam_scaling,
    apply_lr_factor,
    check_adam_optimizer,
    check_scheduler,
)
from ..rounds.plan import WorkerPlan
from .settings import StepSettings
from .training import TrainingObjects


__all__ = ["PlanFollower"]


class PlanFollower:
    """Applies a [`WorkerPlan`] to a worker's sampler and inner optimizer.

    Args:
        settings: the inner steps' settings (`lr_batch_scaling`, `noise_preconditioner`).
        training: the worker's model, optimizer, scheduler and sampler.

    Refuses, when made, an optimizer or scheduler the settings cannot scale or read.
    """

    def __init__(self, settings: StepSettings, training: TrainingObjects):
        self.settings = settings
        self.training = training
        if settings.lr_batch_scaling != "none":
            check_scheduler(training.scheduler)
        if settings.noise_preconditioner == "adam":
            check_adam_moments(training.optimizer)
        self.base_adam: list[dict] = []  # the groups' betas, eps, weight_decay before 'sqrt_adam'
        if settings.lr_batch_scaling in ADAM_RULES:
            check_adam_optimizer(training.optimizer)
            self.base_adam = adam_hyperparameters(training.optimizer)
        self.base_lrs: list[float] = list(getattr(training.scheduler, "base_lrs", []))  # before lr_batch_scaling

    def apply(self, plan: WorkerPlan) -> None:
        """The round's batch to the sampler, and its learning rate (and Adam's hyperparameters) to the optimizer."""
        training, rule = self.training, self.settings.lr_batch_scaling
        training.sampler.batch_size = plan.process.batch_size
        if rule != "none":
            apply_lr_factor(training.optimizer, training.scheduler, self.base_lrs, plan.lr_factor)
        if rule in ADAM_RULES:
            apply_adam_scaling(training.optimizer, self.base_adam, plan.batch_ratio)

    def state_dict(self) -> dict[str, Any]:
        return {"base_lrs": self.base_lrs, "base_adam": self.base_adam}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """The rates and hyperparameters before any scaling, as the checkpoint saved them (the scheduler was loaded
        from rank 0's files, scaled for rank 0's batch: every worker starts again from the unscaled rates)."""
        self.base_lrs = list(state.get("base_lrs") or self.base_lrs)
        self.base_adam = [dict(group) for group in state.get("base_adam") or self.base_adam]
