"""Models for the recipes: Llama presets built from scratch, or any causal LM from a folder or the Hub.

| name | what it is |
|---|---|
| `"tiny"` | a 2-layer Llama (hidden 64) that trains on a laptop CPU in minutes: tests, CI and `make demo` |
| `"llama-50m"`, `"llama-100m"` | Llamas of about 51 M and 99 M parameters (with a 4096-token vocabulary): the GPU benchmark's small sizes (`recipes/benchmarks/gpu_bench/`) |
| `"microllama"` | the architecture of MicroLlama (300M parameters, the model of the AdLoCo paper), from scratch |
| anything else | `AutoModelForCausalLM.from_pretrained(name)`: a local folder (e.g. `outputs/demo/merged`) or a Hub id such as `keeeeenw/MicroLlama` (the paper's pretrained starting point) |

Presets are built on the CPU from a seed, so every worker of a launch builds the same weights without downloading
anything.

Example:
```python
>>> from adloco_hf.presets import build_model
>>> model = build_model("tiny", vocab_size=4096, seed=0)  # or tokenizer=tokenizer: its size and special tokens
>>> model.config.num_hidden_layers
2
```
"""

import logging
import os
from typing import Any

import torch
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM, PreTrainedModel


__all__ = ["MODEL_PRESETS", "build_model"]

logger = logging.getLogger(__name__)

# LlamaConfig fields of each preset. `vocab_size` is the default when the caller gives none (`None`: required).
MODEL_PRESETS: dict[str, dict[str, Any]] = {
    "tiny": {
        "hidden_size": 64,
        "intermediate_size": 256,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 256,
        "vocab_size": None,
    },
    # Head dimension 64 in both, as in MicroLlama; about 51 M and 99 M parameters with a 4096-token vocabulary.
    "llama-50m": {
        "hidden_size": 640,
        "intermediate_size": 1728,
        "num_hidden_layers": 10,
        "num_attention_heads": 10,
        "num_key_value_heads": 5,
        "max_position_embeddings": 2048,
        "rms_norm_eps": 1e-5,
        "vocab_size": None,
    },
    "llama-100m": {
        "hidden_size": 768,
        "intermediate_size": 2688,
        "num_hidden_layers": 12,
        "num_attention_heads": 12,
        "num_key_value_heads": 4,
        "max_position_embeddings": 2048,
        "rms_norm_eps": 1e-5,
        "vocab_size": None,
    },
    # keeeeenw/MicroLlama's config.json (a TinyLlama-style Llama with 12 layers, ~300M parameters).
    "microllama": {
        "hidden_size": 1024,
        "intermediate_size": 5632,
        "num_hidden_layers": 12,
        "num_attention_heads": 16,
        "num_key_value_heads": 4,
        "max_position_embeddings": 2048,
        "rms_norm_eps": 1e-5,
        "vocab_size": 32000,
    },
}


def build_model(
    preset_or_path: str,
    *,
    vocab_size: int | None = None,
    seed: int,
    tokenizer=None,
    dtype: torch.dtype | str | None = None,
    config_overrides: dict[str, Any] | None = None,
) -> PreTrainedModel:
    """Build a causal LM from a preset name (random init from `seed`) or load one from a folder or the Hub.

    Args:
        preset_or_path: a key of [`MODEL_PRESETS`] (`"tiny"`, `"llama-50m"`, `"llama-100m"`, `"microllama"`), or a
            local folder / Hub id for `AutoModelForCausalLM.from_pretrained`.
        vocab_size: the tokenizer's size (`len(tokenizer)`). Required by `"tiny"` and the `"llama-*"` presets (or
            `tokenizer`); overrides `"microllama"`'s 32000. For a pretrained model the embeddings are resized when
            the tokenizer is larger than they are.
        seed: seed of the random initialisation of a preset (the global RNG is left untouched), so every worker
            builds the same weights.
        tokenizer: the run's tokenizer: `vocab_size` defaults to its size, and a preset takes its bos, eos and pad
            token ids (Llama's own are 1, 2 and none: the Trainer would align them with the tokenizer's and warn, on
            every run). `config_overrides` win over it.
        dtype: parameter dtype (`torch.bfloat16`, `"float32"`, ...). `None` means float32, also for pretrained
            models (transformers 5 would otherwise load the saved dtype, often bfloat16, and AdamW updates of a small
            learning rate vanish in bfloat16 weights): train in mixed precision with `bf16=True` / `fp16=True`.
            `"auto"` keeps a pretrained model's saved dtype.
        config_overrides: extra `LlamaConfig` fields for a preset (e.g. `bos_token_id`, `eos_token_id`,
            `pad_token_id`, `tie_word_embeddings`); ignored, with a warning, for a pretrained model.

    Returns:
        A `LlamaForCausalLM` for a preset; whatever class the checkpoint names otherwise.
    """
    if dtype is None:
        dtype = torch.float32
    elif isinstance(dtype, str) and dtype != "auto":
        dtype = getattr(torch, dtype)
    if tokenizer is not None and vocab_size is None:
        vocab_size = len(tokenizer)
    if preset_or_path in MODEL_PRESETS:
        fields = dict(MODEL_PRESETS[preset_or_path])
        if tokenizer is not None:
            fields.update(
                {name: getattr(tokenizer, name) for name in ("bos_token_id", "eos_token_id", "pad_token_id")}
            )
        if vocab_size is not None:
            fields["vocab_size"] = vocab_size
        if fields["vocab_size"] is None:
            raise ValueError(
                f"the {preset_or_path!r} preset takes its vocabulary from the tokenizer: pass tokenizer=tokenizer "
                "(or vocab_size=len(tokenizer))"
            )
        fields.update(config_overrides or {})
        config = LlamaConfig(**fields)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            model = LlamaForCausalLM(config)
        return model if dtype in ("auto", torch.float32) else model.to(dtype)

    if config_overrides:
        logger.warning("config_overrides %s are ignored for the pretrained model %s", config_overrides, preset_or_path)
    preset_or_path = os.path.expanduser(preset_or_path)
    # A Hub id is "owner/name"; anything else that is not a folder is a mistyped path, not a download to try.
    looks_like_path = preset_or_path.startswith((".", "/", "~")) or preset_or_path.count("/") > 1
    if looks_like_path and not os.path.isdir(preset_or_path):
        raise ValueError(
            f"{preset_or_path!r} is neither a preset ({sorted(MODEL_PRESETS)}) nor an existing folder; check the path"
        )
    model = AutoModelForCausalLM.from_pretrained(preset_or_path, dtype=dtype)
    rows = model.get_input_embeddings().weight.shape[0]
    if vocab_size is not None and vocab_size > rows:
        logger.warning("resizing the embeddings of %s from %d to %d tokens", preset_or_path, rows, vocab_size)
        model.resize_token_embeddings(vocab_size)
    return model
