"""Gradient statistics gathered during an ordinary inner step, with no extra forward or backward pass.

The statistics step of a round is split into groups (the micro-batches of switch mode, or two halves of the batch
when it fits at once). A hook on each parameter (`Tensor.register_hook`) sees a group's contribution c_j to the
gradient *before* autograd adds it to `.grad`, so ‖c_j‖² costs one norm per parameter and no memory. The whole
step's gradient is then read from `.grad` before clipping. Group contributions are c_j = S · w_j · g_j, where S is
the fp16 loss scale (1 otherwise) and w_j the group's share of the loss normaliser (its share of tokens when the
model normalises by `num_items_in_batch`, of samples otherwise); the statistics are expressed in samples with
n_j = w_j · b, which keeps the estimators of `adloco_hf.batch.size_tests` unbiased for unequal groups.

The inner-product tests also need ⟨g_j, g⟩. With two groups it follows from the norms alone
(⟨c_1, c_2⟩ = (‖c_1 + c_2‖² − ‖c_1‖² − ‖c_2‖²) / 2). With more micro-batches the chunks are pooled into two
halves and the first half's gradient is set aside while the second half accumulates, which holds one extra
gradient-sized buffer for the rest of that single step.

**Adam-preconditioned statistics** (`noise_preconditioner="adam"`). Adam does not step along the gradient but along
P g with P = diag(1 / (√v̂ + ε)) from its second moments, so the noise that matters to it is measured in P's metric:
every squared norm and inner product above becomes ‖x‖²_P = Σ P x² (tr P Σ and gᵀ P g, whose ratio is the
preconditioned noise scale of McCandlish et al., appendix A). The hooks multiply each contribution by √P, read from
the inner optimizer's `exp_avg_sq` (bias-corrected) at the start of the statistics step; before Adam's first step
there is no P, and the step gives no statistics (the request stays).

A batch of one sample cannot be split. Then the previous inner step's gradient is kept as a second group
(as AdaptDL does): it costs one fp32 copy of the gradients held for one step, and it is biased upwards because the
two gradients are taken at weights one optimizer step apart, E‖g_{t-1} − g_t‖² = 2 tr Σ + ‖∇F(θ_{t-1}) − ∇F(θ_t)‖²,
so the variance is overestimated by at most L²‖θ_t − θ_{t-1}‖² / 2 — small for the small inner learning rates used
with adaptive batches, and erring towards a larger batch.
"""

import functools
import math
from collections.abc import Iterable, Sequence

import torch
import torch.distributed as dist

from ..common.upstream import foreach_norms
from ..config.choices import NOISE_PRECONDITIONERS
from .size_tests import GradientStatistics, group_statistics


__all__ = ["NOISE_PRECONDITIONERS", "GradientStatisticsCollector", "adam_root_preconditioner", "check_adam_moments"]


def check_adam_moments(optimizer: torch.optim.Optimizer) -> None:
    """`noise_preconditioner="adam"` reads `exp_avg_sq` with each group's `betas` and `eps`: refuse other optimizers."""
    inner = getattr(optimizer, "optimizer", optimizer)
    for index, group in enumerate(inner.param_groups):
        if not (isinstance(group.get("betas"), (tuple, list)) and len(group["betas"]) == 2 and "eps" in group):
            raise ValueError(
                f"noise_preconditioner='adam' measures the gradient noise in Adam's metric (its second moments), but "
                f"param group {index} of {type(inner).__name__} has no betas/eps: use AdamW (the Trainer's default "
                "optimizer) or set noise_preconditioner='none'."
            )


def adam_root_preconditioner(
    optimizer: torch.optim.Optimizer, params: Sequence[torch.nn.Parameter]
) -> list[torch.Tensor] | None:
    """√P = (√v̂ + ε)^(-1/2) for each of `params`, from an Adam-like optimizer's `exp_avg_sq` (bias-corrected with
    its group's β₂ and the parameter's step); None while some parameter has no second moment yet (no step taken)."""
    optimizer = getattr(optimizer, "optimizer", optimizer)  # accelerate's AcceleratedOptimizer wraps it
    settings = {id(p): group for group in optimizer.param_groups for p in group["params"]}
    roots = []
    for p in params:
        state = optimizer.state.get(p, {})
        group = settings.get(id(p))
        if group is None or "exp_avg_sq" not in state or "step" not in state:
            return None
        step = float(state["step"])
        if step < 1:
            return None
        beta2, eps = group["betas"][1], group["eps"]
        v_hat = state["exp_avg_sq"].detach().float() / (1 - beta2**step)
        roots.append(v_hat.sqrt().add_(eps).rsqrt_())
    return roots


def _local(tensors: Sequence[torch.Tensor | None]) -> list[torch.Tensor | None]:
    """This process's shard of each DTensor (FSDP), plain tensors and Nones as they are."""
    return [t.to_local() if hasattr(t, "to_local") else t for t in tensors]


def _sq_norm(tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    if not tensors:
        return torch.zeros((), dtype=torch.float64)
    norms = foreach_norms(list(tensors))
    return torch.stack([n.double() for n in norms]).pow(2).sum()


def _dot(a: Sequence[torch.Tensor], b: Sequence[torch.Tensor]) -> torch.Tensor:
    return torch.stack([(x.double() * y.double()).sum() for x, y in zip(a, b)]).sum()


class GradientStatisticsCollector:
    """Measures the group gradient norms of one inner step (see the module docstring).

    Use per statistics step: `start(weights, ...)`, then `begin_chunk(j)` before each chunk's backward, then
    `finish()` after the last backward and before gradient clipping. For a one-sample batch, call `remember()` at the
    end of the previous step and `finish_with_previous()` at the end of the statistics step.

    Args:
        parameters: the model's parameters; those that do not require gradients are ignored.
        inner_products: also measure ⟨g_j, g⟩ (needed by the inner-product and augmented tests).
    """

    def __init__(self, parameters: Iterable[torch.nn.Parameter], *, inner_products: bool = False):
        self.params = [p for p in parameters if p.requires_grad]
        self.inner_products = inner_products
        # √P per parameter during a preconditioned statistics step (None: the Euclidean metric).
        self._root: list[torch.Tensor] | None = None
        self._handles: list = []
        self._parts: list[list[torch.Tensor]] = []
        self._weights: list[float] = []
        self._current = 0
        self._boundary: int | None = None
        self._set_aside: list[torch.Tensor | None] | None = None
        self._previous: list[torch.Tensor] | None = None
        self._previous_grads: list[torch.Tensor] = []
        self.active = False
        # Sharded parameters (worker_parallelism="fsdp"): hooks never fire and `.grad` is this process's shard of
        # the worker's synced gradient. Every statistics step then runs as two halves read from `.grad`, and the
        # sums over the shards are all-reduced over this group (the worker's processes).
        self.sum_group = None

    # ---- one step split into chunks ----
    def start(self, chunk_weights: Sequence[float], root_preconditioner: list[torch.Tensor] | None = None) -> None:
        """Begin a statistics step whose chunks carry these shares of the loss normaliser (they sum to 1).

        `root_preconditioner`: √P for each parameter (see [`adam_root_preconditioner`]) to measure in P's metric.
        """
        if len(chunk_weights) < 2:
            raise ValueError("a statistics step needs at least two chunks")
        self._root = root_preconditioner
        self._weights = [float(w) for w in chunk_weights]
        self._parts = [[] for _ in chunk_weights]
        self._current = 0
        self._set_aside = None
        # Two halves of chunks when inner products are needed and there are more than two chunks.
        self._boundary = (len(chunk_weights) + 1) // 2 if self.inner_products and len(chunk_weights) > 2 else None
        if self.sum_group is not None:
            self._boundary = (len(chunk_weights) + 1) // 2
            self._root = None if root_preconditioner is None else _local(root_preconditioner)
        if self._boundary is None:
            self._handles = [p.register_hook(functools.partial(self._hook, i)) for i, p in enumerate(self.params)]
        self.active = True

    def begin_chunk(self, index: int) -> None:
        """Call before the backward of chunk `index`."""
        self._current = index
        if self._boundary is not None and index == self._boundary:
            # Set the first half's gradient aside so the second half accumulates on its own.
            self._set_aside = [p.grad for p in self.params]
            for p in self.params:
                p.grad = None

    def _hook(self, index: int, grad: torch.Tensor) -> None:
        grad = grad.detach()
        if self._root is not None:
            grad = grad.float() * self._root[index]
        self._parts[self._current].append(torch.linalg.vector_norm(grad, dtype=torch.float32))

    def _metric(self, grads: Sequence[torch.Tensor | None]) -> list[torch.Tensor]:
        """`grads` (one per parameter, None allowed) in P's metric (×√P), the Nones left out."""
        if self._root is None:
            return [g for g in grads if g is not None]
        return [g.float() * r for g, r in zip(grads, self._root) if g is not None]

    def _remove_hooks(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []

    def finish(self, *, samples: int, loss_scale: float = 1.0) -> GradientStatistics | None:
        """End the statistics step: returns this worker's statistics, or None when a gradient is not finite.

        Args:
            samples: b, the samples of the whole step.
            loss_scale: S, the GradScaler's scale in force during the backward (1.0 without fp16).
        """
        self._remove_hooks()
        self.active = False
        scale_sq = float(loss_scale) ** 2
        if self._set_aside is not None:
            return self._finish_halves(samples, scale_sq)
        grads = self._metric([p.grad for p in self.params])
        total_sq = float(_sq_norm(grads))
        chunk_sq = [float(torch.stack(parts).double().pow(2).sum()) if parts else 0.0 for parts in self._parts]
        if not all(math.isfinite(v) for v in [total_sq, *chunk_sq]):
            return None
        grad_sq_norm = total_sq / scale_sq
        sizes = [w * samples for w in self._weights]
        group_sq = [q / (scale_sq * w * w) for q, w in zip(chunk_sq, self._weights)]
        dots = None
        if self.inner_products:  # exactly two chunks here
            cross = (total_sq - chunk_sq[0] - chunk_sq[1]) / 2
            dots = [(q + cross) / (scale_sq * w) for q, w in zip(chunk_sq, self._weights)]
        return group_statistics(group_sq, sizes, grad_sq_norm, dots)

    def _finish_halves(self, samples: int, scale_sq: float) -> GradientStatistics | None:
        first = self._set_aside
        self._set_aside = None
        second = [p.grad for p in self.params]
        local_first, local_second = (_local(first), _local(second)) if self.sum_group is not None else (first, second)
        both = [(a, b) if a is not None and b is not None else (None, None) for a, b in zip(local_first, local_second)]
        pairs = list(zip(self._metric([a for a, _ in both]), self._metric([b for _, b in both])))
        sq_first = float(_sq_norm(self._metric(local_first)))
        sq_second = float(_sq_norm(self._metric(local_second)))
        cross = float(_dot([a for a, _ in pairs], [b for _, b in pairs])) if pairs else 0.0
        if self.sum_group is not None:  # every process of the worker holds a shard: the sums over all of them
            sums = torch.tensor([sq_first, sq_second, cross], dtype=torch.float64)
            if pairs:
                sums = sums.to(pairs[0][0].device)
            dist.all_reduce(sums, group=self.sum_group)
            sq_first, sq_second, cross = (float(v) for v in sums)
        # Put the whole step's gradient back in `.grad` before anything else reads it.
        for p, a in zip(self.params, first):
            if a is None:
                continue
            if p.grad is None:
                p.grad = a
            else:
                p.grad.add_(a)
        if not all(math.isfinite(v) for v in (sq_first, sq_second, cross)):
            return None
        w1 = sum(self._weights[: self._boundary])
        w2 = 1.0 - w1
        total_sq = sq_first + sq_second + 2 * cross
        group_sq = [sq_first / (scale_sq * w1 * w1), sq_second / (scale_sq * w2 * w2)]
        dots = [(sq_first + cross) / (scale_sq * w1), (sq_second + cross) / (scale_sq * w2)]
        return group_statistics(group_sq, [w1 * samples, w2 * samples], total_sq / scale_sq, dots)

    # ---- one-sample batches: the previous step is the second group ----
    def remember(self, *, loss_scale: float = 1.0) -> bool:
        """Keep an fp32 copy of the current (pre-clipping) gradient; False when it is not finite."""
        grads = [p.grad for p in self.params if p.grad is not None]
        if not grads or not math.isfinite(float(_sq_norm(grads))):
            self._previous = None
            return False
        self._previous = [g.detach().to(torch.float32, copy=True).div_(float(loss_scale)) for g in grads]
        self._previous_grads = [p for p in self.params if p.grad is not None]
        return True

    @property
    def has_previous(self) -> bool:
        return self._previous is not None

    def state_dict(self) -> dict:
        """The remembered gradient (one-sample batches), for a checkpoint written inside a round."""
        if self._previous is None:
            return {"previous": None, "owners": []}
        index = {id(p): i for i, p in enumerate(self.params)}
        return {"previous": [g.cpu() for g in self._previous], "owners": [index[id(p)] for p in self._previous_grads]}

    def load_state_dict(self, state: dict) -> None:
        if state["previous"] is None:
            self.forget()
            return
        self._previous_grads = [self.params[i] for i in state["owners"]]
        self._previous = [g.to(p.device) for g, p in zip(state["previous"], self._previous_grads)]

    def forget(self) -> None:
        self._previous = None
        self._previous_grads = []

    def finish_with_previous(
        self, *, loss_scale: float = 1.0, root_preconditioner: list[torch.Tensor] | None = None
    ) -> GradientStatistics | None:
        """Statistics from two one-sample groups: the remembered step and the current one (both measured in the
        metric of `root_preconditioner`, √P per parameter, when given)."""
        previous, owners = self._previous, self._previous_grads
        self.forget()
        if previous is None or any(p.grad is None for p in owners):
            return None
        current = [p.grad.detach().float() / float(loss_scale) for p in owners]
        if root_preconditioner is not None:
            root = {id(p): r for p, r in zip(self.params, root_preconditioner)}
            previous = [g * root[id(p)] for g, p in zip(previous, owners)]
            current = [g * root[id(p)] for g, p in zip(current, owners)]
        q1, q2 = float(_sq_norm(previous)), float(_sq_norm(current))
        cross = float(_dot(previous, current))
        if not all(math.isfinite(v) for v in (q1, q2, cross)):
            return None
        grad_sq_norm = (q1 + q2 + 2 * cross) / 4
        dots = [(q1 + cross) / 2, (q2 + cross) / 2] if self.inner_products else None
        return group_statistics([q1, q2], [1.0, 1.0], grad_sq_norm, dots)
