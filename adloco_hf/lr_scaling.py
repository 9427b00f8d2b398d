"""The inner learning rate that goes with a batch size: what lets a batch that grew make more progress per step.

The batch-size test grows a worker's batch when the gradient noise allows it. With the learning rate unchanged, a
step of a batch κ times larger moves the weights about as far as before with less noise, so the same tokens buy
fewer and no longer steps. The scaling rules keep the progress per token, as long as the batch stays below the
noise scale (which is what the tests estimate):

- `"sqrt"`: lr × √κ, the rule for Adam-type optimizers (Malladi et al., 2022, [arXiv 2205.10287](
  https://arxiv.org/abs/2205.10287): the square-root rule keeps Adam's SDE; AdaptDL uses it for Adam as well);
- `"linear"`: lr × κ, the rule for SGD (Goyal et al., 2017, [arXiv 1706.02677](https://arxiv.org/abs/1706.02677));
- `"none"`: the learning rate ignores the batch (the AdLoCo paper and its code).

κ is the batch a worker's inner step really uses (switch mode's plan: a capped request counts as what it is capped
to) over the initial request, `per_device_train_batch_size`. The factor multiplies the scheduler's base learning
rates, so warm-up and decay keep their shape.
"""

import math

import torch


__all__ = ["LR_SCALING_RULES", "apply_lr_factor", "check_scheduler", "lr_factor"]

LR_SCALING_RULES = ("none", "sqrt", "linear")


def lr_factor(rule: str, batch_size: int, initial_batch_size: int) -> float:
    """The learning-rate multiplier of a step of `batch_size` samples for a run that started at `initial_batch_size`.

    Example:
    ```python
    >>> lr_factor("sqrt", 16, 4)
    2.0
    >>> lr_factor("linear", 2, 4)
    0.5
    ```
    """
    if rule not in LR_SCALING_RULES:
        raise ValueError(f"unknown lr_batch_scaling {rule!r}; choose one of {list(LR_SCALING_RULES)}")
    if batch_size < 1 or initial_batch_size < 1:
        raise ValueError(f"batch sizes must be >= 1, got {batch_size} and {initial_batch_size}")
    ratio = batch_size / initial_batch_size
    if rule == "sqrt":
        return math.sqrt(ratio)
    if rule == "linear":
        return ratio
    return 1.0


def check_scheduler(scheduler) -> None:
    """Scaling rewrites a `LambdaLR`'s base learning rates; any other scheduler is refused before training."""
    if not isinstance(scheduler, torch.optim.lr_scheduler.LambdaLR):
        raise ValueError(
            f"lr_batch_scaling needs a LambdaLR scheduler (every lr_scheduler_type of transformers but "
            f"'reduce_lr_on_plateau' and 'greedy'), got {type(scheduler).__name__}; change lr_scheduler_type or "
            "set lr_batch_scaling='none'"
        )


def apply_lr_factor(optimizer: torch.optim.Optimizer, scheduler, base_lrs: list[float], factor: float) -> None:
    """Set the scheduler's base learning rates to `base_lrs` × `factor` and the optimizer's current ones to match.

    The current learning rates are recomputed from the schedule (not multiplied by a ratio), so the result does not
    depend on what the optimizer's state held before: e.g. the state a worker received from another one in a merge.
    """
    scheduler.base_lrs = [base * factor for base in base_lrs]
    for group, base, schedule in zip(optimizer.param_groups, scheduler.base_lrs, scheduler.lr_lambdas):
        group["lr"] = base * schedule(scheduler.last_epoch)
    scheduler._last_lr = [group["lr"] for group in optimizer.param_groups]
