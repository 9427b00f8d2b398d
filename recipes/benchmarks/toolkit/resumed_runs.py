"""What a resumed run must reproduce of an uninterrupted one (`faults process`, `faults soak` and the test
suite's resume checks): the final merged model, and the rounds file on the keys that do not depend on timing."""

import json
import os

import torch
from transformers import AutoModelForCausalLM


__all__ = ["RESUMED_ROUND_KEYS", "compared_rounds", "merged_weights"]

# The rounds-file keys that a resumed run must reproduce exactly (timings and bytes of the wire may differ): what the
# fault benchmarks and the test suite's resume checks (`tests/helpers.py::COMPARED_ROUND_KEYS`) compare.
RESUMED_ROUND_KEYS = (
    "outer_step", "instance", "workers", "batch_size", "next_batch_size", "samples", "train_loss", "grad_variance",
    "pseudo_grad_norm", "merged_from", "num_instances", "worker_batch_sizes",
)  # fmt: skip


def merged_weights(out: str) -> torch.Tensor:
    """The run's final merged model (`out/merged`), every parameter flattened into one float32 vector."""
    model = AutoModelForCausalLM.from_pretrained(os.path.join(out, "merged"))
    return torch.cat([p.detach().float().reshape(-1) for p in model.parameters()])


def compared_rounds(out: str) -> list[dict]:
    """The run's rounds file on `RESUMED_ROUND_KEYS` (empty when it has none)."""
    path = os.path.join(out, "adloco_rounds.jsonl")
    if not os.path.exists(path):
        return []
    with open(path, encoding="utf-8") as f:
        return [{k: line.get(k) for k in RESUMED_ROUND_KEYS} for line in map(json.loads, f)]
