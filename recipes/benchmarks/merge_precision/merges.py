"""Merging two instances' flat weights as the float32 all-reduce does and as the compact payload does (bf16 terms
summed in bf16 member by member); flattening a model's weights and loading them back."""

import torch


__all__ = ["CRITERION", "MERGES", "compact_merge", "flat", "float32_merge", "load_flat"]

CRITERION = 0.005
# (first, second, their demands); -1 and -2 are the first two merges' results.
MERGES = (("0+1", 0, 1, (1.0, 1.0)), ("2+3", 2, 3, (3.0, 1.0)), ("(0+1)+(2+3)", -1, -2, (3.0, 2.0)))


def flat(model) -> torch.Tensor:
    return torch.cat([p.detach().float().reshape(-1) for p in model.parameters()])


def load_flat(model, values: torch.Tensor) -> None:
    offset = 0
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(values[offset : offset + p.numel()].view_as(p))
            offset += p.numel()


def float32_merge(a: torch.Tensor, b: torch.Tensor, weights: tuple[float, float]) -> torch.Tensor:
    return a * weights[0] + b * weights[1]


def compact_merge(a: torch.Tensor, b: torch.Tensor, weights: tuple[float, float], members: int) -> torch.Tensor:
    """The compact payload's φ: `members` // 2 members of each instance add w_i / n_i × φ_i in bfloat16, the
    partial sum rounded after every addition (a ring's hops), taken back as float32."""
    per_side = members // 2
    terms = [(a * (weights[0] / per_side)).bfloat16()] * per_side + [
        (b * (weights[1] / per_side)).bfloat16()
    ] * per_side
    total = terms[0]
    for term in terms[1:]:
        total = (total.float() + term.float()).bfloat16()
    return total.float()
