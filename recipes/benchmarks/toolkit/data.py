"""The benchmarks' data and model: a spec's corpus, tokenizer and packed blocks, the preset model with the seed's
weights, and the eval perplexity of a model on packed blocks.

A spec (a method's `spec.json`, or a benchmark's settings) holds `data` (`corpus`, `vocab_size`, optionally
`eval_blocks`), `cache_dir`, `block_size`, `preset` and `seed`. The tokenizer and the packed blocks are cached in
`cache_dir`: the launched workers then only load them.
"""

import math

import torch
from transformers import default_data_collator

from adloco_hf.data import build_lm_datasets, load_or_train_tokenizer, load_text_corpus
from adloco_hf.presets import MODEL_PRESETS, build_model


__all__ = ["load_data", "make_model", "perplexity"]


def load_data(spec: dict):
    """(tokenizer, {"train", "eval"} packed blocks of `block_size` tokens); the eval split cut to `eval_blocks`.
    `num_proc` (optional): processes that tokenise and pack the corpus when its blocks are not cached yet."""
    data = spec["data"]
    texts = load_text_corpus(data["corpus"])
    tokenizer = load_or_train_tokenizer(None, texts, vocab_size=data["vocab_size"], cache_dir=spec["cache_dir"])
    lm = build_lm_datasets(
        texts, tokenizer, block_size=spec["block_size"], cache_dir=spec["cache_dir"], num_proc=data.get("num_proc")
    )
    eval_blocks = data.get("eval_blocks")
    if eval_blocks is not None and len(lm["eval"]) > eval_blocks:
        # The first blocks of the held-out files: evaluating every few rounds stays cheap, and the same for all.
        lm["eval"] = lm["eval"].select(range(eval_blocks))
    return tokenizer, lm


def make_model(spec: dict, tokenizer):
    """The spec's preset with the seed's initial weights, sized for the tokenizer and the blocks."""
    preset = spec["preset"]
    overrides = {
        "bos_token_id": tokenizer.bos_token_id,
        "eos_token_id": tokenizer.eos_token_id,
        "pad_token_id": tokenizer.pad_token_id,
        "max_position_embeddings": max(MODEL_PRESETS[preset]["max_position_embeddings"], spec["block_size"]),
    }
    return build_model(preset, vocab_size=len(tokenizer), seed=spec["seed"], config_overrides=overrides)


def perplexity(model, eval_set, batch: int = 64, device: str = "cpu") -> float:
    """The model's eval perplexity on packed blocks: next-token cross-entropy summed over every block, in `batch`
    blocks at a time on `device` (the model is put in eval mode; it must be on `device` already)."""
    total, count = 0.0, 0
    model.eval()
    with torch.no_grad():
        for start in range(0, len(eval_set), batch):
            inputs = default_data_collator([eval_set[i] for i in range(start, min(start + batch, len(eval_set)))])
            ids = inputs["input_ids"].to(device)
            logits = model(input_ids=ids).logits[:, :-1].float()
            labels = ids[:, 1:]
            total += torch.nn.functional.cross_entropy(
                logits.reshape(-1, logits.shape[-1]), labels.reshape(-1), reduction="sum"
            ).item()
            count += labels.numel()
    return math.exp(total / count)
