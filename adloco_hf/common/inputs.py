"""A training batch as the Trainer hands it to `training_step`: its length, its chunks, its tokens."""

from typing import Any

import torch


__all__ = ["batch_length", "count_tokens", "split_inputs"]


def batch_length(inputs: dict[str, Any]) -> int:
    """Samples in the batch: the first dimension of its first batched tensor."""
    for value in inputs.values():
        if torch.is_tensor(value) and value.dim() > 0:
            return value.shape[0]
    raise ValueError("could not find a batched tensor in the inputs to split into micro-batches")


def split_inputs(inputs: dict[str, Any], sizes: list[int]) -> list[dict[str, Any]]:
    """Split every batched tensor along its first dimension into chunks of `sizes`; other values are shared."""
    batch = batch_length(inputs)
    chunks = [{} for _ in sizes]
    for key, value in inputs.items():
        if torch.is_tensor(value) and value.dim() > 0 and value.shape[0] == batch:
            for chunk, part in zip(chunks, torch.split(value, sizes)):
                chunk[key] = part
        else:
            for chunk in chunks:
                chunk[key] = value
    return chunks


def count_tokens(inputs: dict[str, Any], main_input_name: str = "input_ids") -> torch.Tensor | int:
    """Tokens the batch trains on: the attention mask's sum, else the main input's size (a tensor: no sync)."""
    if "attention_mask" in inputs and torch.is_tensor(inputs["attention_mask"]):
        return inputs["attention_mask"].sum()
    value = inputs.get(main_input_name)
    return value.numel() if torch.is_tensor(value) else 0
