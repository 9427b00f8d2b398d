"""The inner learning rate that goes with a batch size: what lets a batch that grew make more progress per step.

The batch-size test grows a worker's batch when the gradient noise allows it. With the learning rate unchanged, a
step of a batch κ times larger moves the weights about as far as before with less noise, so the same tokens buy
fewer and no longer steps. The scaling rules keep the progress per token, as long as the batch stays below the
noise scale (which is what the tests estimate):

- `"sqrt"`: lr × √κ, the rule for Adam-type optimizers (Malladi et al., 2022, [arXiv 2205.10287](
  https://arxiv.org/abs/2205.10287): the square-root rule keeps Adam's SDE; AdaptDL uses it for Adam as well);
- `"sqrt_adam"`: the whole square-root rule of Malladi et al. for Adam/AdamW (their rule changes more than the
  learning rate): lr × √κ, 1 − β₁ × κ, 1 − β₂ × κ, ε / √κ, and AdamW's decay per step, lr × weight decay, kept as
  it was at the initial batch (weight decay / √κ; see `scaled_adam_hyperparameters`);
- `"linear"`: lr × κ, the rule for SGD (Goyal et al., 2017, [arXiv 1706.02677](https://arxiv.org/abs/1706.02677));
- `"none"`: the learning rate ignores the batch (the AdLoCo paper and its code).

κ is the batch a worker's inner step really uses (switch mode's plan: a capped request counts as what it is capped
to) over the initial request, `per_device_train_batch_size`. The factor multiplies the scheduler's base learning
rates, so warm-up and decay keep their shape. `"sqrt_adam"` also rewrites every param group's `betas`, `eps` and
`weight_decay`, always from the values the optimizer was built with (kept by the worker, and in its checkpoints),
never from what the group holds: so nothing compounds over rounds, merges or resumes.
"""

import math
from numbers import Real

import torch

from ..common.logs import get_logger
from ..common.upstream import set_scheduler_last_lr
from ..config.choices import ADAM_RULES, LR_SCALING_RULES


__all__ = [
    "ADAM_RULES",
    "LR_SCALING_RULES",
    "adam_hyperparameters",
    "apply_adam_scaling",
    "apply_lr_factor",
    "batch_ratio",
    "check_adam_optimizer",
    "check_scheduler",
    "lr_factor",
    "scaled_adam_hyperparameters",
]


logger = get_logger(__name__)
_clipped: set[str] = set()  # the betas whose clipping was already reported by this process


def batch_ratio(batch_size: int, initial_batch_size: int) -> float:
    """κ: a step's batch of `batch_size` samples over the initial request `initial_batch_size` (both >= 1).

    Example:
    ```python
    >>> batch_ratio(16, 4)
    4.0
    ```
    """
    if batch_size < 1 or initial_batch_size < 1:
        raise ValueError(f"batch sizes must be >= 1, got {batch_size} and {initial_batch_size}")
    return batch_size / initial_batch_size


def lr_factor(rule: str, ratio: float) -> float:
    """The learning-rate multiplier of a step whose batch is `ratio` (κ, `batch_ratio`) times the initial request.

    Example:
    ```python
    >>> lr_factor("sqrt", 4.0)
    2.0
    >>> lr_factor("linear", 0.5)
    0.5
    ```
    """
    if rule not in LR_SCALING_RULES:
        raise ValueError(f"unknown lr_batch_scaling {rule!r}; choose one of {list(LR_SCALING_RULES)}")
    if not ratio > 0:
        raise ValueError(f"the batch ratio must be > 0, got {ratio}")
    if rule in ("sqrt", "sqrt_adam"):
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
    set_scheduler_last_lr(scheduler, [group["lr"] for group in optimizer.param_groups])


def _is_number(value) -> bool:
    return isinstance(value, Real) or (torch.is_tensor(value) and value.numel() == 1)


def check_adam_optimizer(optimizer) -> None:
    """`"sqrt_adam"` rewrites every param group's `betas` (two of them), `eps` (one number) and `weight_decay`: an
    optimizer without them (SGD, Adagrad, Adafactor, Lion, ...) is refused before training."""
    for index, group in enumerate(optimizer.param_groups):
        betas, eps = group.get("betas"), group.get("eps")
        adam_like = (
            isinstance(betas, (tuple, list))
            and len(betas) == 2
            and all(_is_number(beta) for beta in betas)
            and _is_number(eps)
            and _is_number(group.get("weight_decay", 0.0))
        )
        if not adam_like:
            name = type(getattr(optimizer, "optimizer", optimizer)).__name__  # accelerate wraps the Trainer's
            raise ValueError(
                f"lr_batch_scaling='sqrt_adam' scales Adam's betas and eps, but param group {index} of the "
                f"{name} optimizer has none (betas={betas!r}, eps={eps!r}); use an Adam-type optimizer (e.g. "
                "optim='adamw_torch'), or lr_batch_scaling='sqrt' (learning rate only) or 'linear' (for SGD)"
            )


def adam_hyperparameters(optimizer) -> list[dict]:
    """Every param group's `betas`, `eps` and `weight_decay` as plain floats: the base that `"sqrt_adam"` scales.

    A group whose weight decay is an L2 term added to the gradient (torch's `Adam`, `decoupled_weight_decay=False`)
    is marked `"decoupled": False`: its weight decay is left alone (see `scaled_adam_hyperparameters`).
    """
    return [
        {
            "betas": (float(group["betas"][0]), float(group["betas"][1])),
            "eps": float(group["eps"]),
            "weight_decay": float(group.get("weight_decay", 0.0)),
            "decoupled": bool(group.get("decoupled_weight_decay", True)),
        }
        for group in optimizer.param_groups
    ]


def _scaled_beta(beta: float, ratio: float, name: str) -> float:
    """1 − κ(1 − β), clipped at 0 once κ(1 − β) ≥ 1 (reported once per process and beta)."""
    if ratio * (1.0 - beta) < 1.0:
        return 1.0 - ratio * (1.0 - beta)
    if name not in _clipped:
        _clipped.add(name)
        field = {"beta1": "adam_beta1", "beta2": "adam_beta2"}[name]
        logger.warning(
            f"lr_batch_scaling='sqrt_adam': a batch {ratio:g} times the initial one would make 1 - {name} = "
            f"{ratio:g} × (1 - {beta:g}) >= 1, so {name} ({field}) is clipped to 0 (no averaging) from batch ratio "
            f"{1.0 / (1.0 - beta):g} on. Raise {field}, or cap the batch (batch_size_cap), to stay inside the rule."
        )
    return 0.0


def scaled_adam_hyperparameters(base: dict, ratio: float) -> dict:
    """The `betas`, `eps` and `weight_decay` of a param group whose batch is `ratio` = κ = b / b₀ times the initial
    one, from its unscaled values `base` (an item of `adam_hyperparameters`): Malladi et al.'s square-root rule.

    - 1 − β ← κ (1 − β₀) for β₁ and β₂, clipped so that β ≥ 0 (β = 0 once κ (1 − β₀) ≥ 1, with a warning);
    - ε ← ε₀ / √κ;
    - weight decay: torch's `AdamW` multiplies each parameter by 1 − lr · wd every step (decoupled decay, with the
      group's current, scaled and scheduled lr). lr grows by √κ, so wd ← wd₀ / √κ keeps the decay of one step,
      lr · wd, what it was at the initial batch (`"sqrt"` lets it grow by √κ with the learning rate). A group with an
      L2 term in the gradient instead (torch's `Adam`, `decoupled_weight_decay=False`) keeps wd₀: the term is part of
      the loss, whose gradient the rule already accounts for.

    Example:
    ```python
    >>> scaled_adam_hyperparameters({"betas": (0.875, 0.96875), "eps": 1e-8, "weight_decay": 0.1}, 4.0)
    {'betas': (0.5, 0.875), 'eps': 5e-09, 'weight_decay': 0.05}
    ```
    """
    root = math.sqrt(ratio)
    beta1, beta2 = base["betas"]
    decoupled = base.get("decoupled", True)
    return {
        "betas": (_scaled_beta(beta1, ratio, "beta1"), _scaled_beta(beta2, ratio, "beta2")),
        "eps": base["eps"] / root,
        "weight_decay": base["weight_decay"] / root if decoupled else base["weight_decay"],
    }


def apply_adam_scaling(optimizer, base: list[dict], ratio: float) -> None:
    """Set every param group's `betas`, `eps` and `weight_decay` to those of a batch `ratio` (κ, `batch_ratio`) times
    the initial request, scaled from `base` (never from what the groups hold now, e.g. another worker's values
    received in a merge). The learning rate is `apply_lr_factor`'s, with `lr_factor("sqrt_adam", ratio)`."""
    if not ratio > 0:
        raise ValueError(f"the batch ratio must be > 0, got {ratio}")
    for group, values in zip(optimizer.param_groups, base, strict=True):
        group.update(scaled_adam_hyperparameters(values, ratio))
