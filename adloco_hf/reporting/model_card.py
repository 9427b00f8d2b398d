"""Model cards for the folders AdLoCo writes (`merges/outer-N/`, `merged/`, `merged-full/`).

A card is a README.md with the Hub's metadata: `library_name` (`transformers`, or `peft` for an adapter), the task,
`base_model` and `datasets` where they are Hub repos (`card_details.py`: a local path never goes into the metadata),
and the final evaluation in the Hub's `model-index` form (through `huggingface_hub.ModelCardData`) when the data is
a Hub dataset (a result without a dataset is no valid `model-index`, as the Trainer's own cards have it). Its body has
a snippet that loads the folder as written (from the repo it is pushed to, else from the folder on disk), this run's
plot (drawn at the end of training from its rounds file), the evaluation (beside the starting model's, when given),
the settings that were used (`max_batch_size` as resolved, not `"auto"`) and the run's numbers, with the batch that
ran in the last round. [`model_card`] only renders; `run_cards.RunCards` gathers what the run knows and writes.
"""

import copy
import logging
import math
import os
from typing import Any

import torch
from huggingface_hub import EvalResult, ModelCardData

from ..common.formats import format_bytes
from .card_details import CardDetails, ModelKind, describe_model, hub_dataset_id
from .report import instance_label


__all__ = [
    "CardDetails",
    "full_folder_of",
    "ModelKind",
    "MERGE_ABOUT",
    "card_metrics",
    "cpu_copy",
    "describe_model",
    "format_value",
    "model_card",
]

logger = logging.getLogger(__name__)

_PEFT_AUTO = {
    "AutoModelForCausalLM": "AutoPeftModelForCausalLM",
    "AutoModelForSeq2SeqLM": "AutoPeftModelForSeq2SeqLM",
    "AutoModelForSequenceClassification": "AutoPeftModelForSequenceClassification",
    "AutoModelForTokenClassification": "AutoPeftModelForTokenClassification",
    "AutoModelForQuestionAnswering": "AutoPeftModelForQuestionAnswering",
    "AutoModel": "AutoPeftModel",
}
# Evaluation keys that describe the evaluation run rather than the model.
_NOT_METRICS = ("runtime", "samples_per_second", "steps_per_second", "epoch", "_mem_", "_instance_")
_ABOUT = (
    "Trained with [adloco_hf](https://github.com/adloco-hf/adloco_hf): AdLoCo ([arXiv 2508.18182]"
    "(https://arxiv.org/abs/2508.18182)), low-communication DiLoCo training with adaptive batch sizes and several "
    "model instances merged as training goes on."
)

MERGE_ABOUT = (
    "This checkpoint is a merge saved during training: the demand-weighted average of two instances (see "
    "`adloco_merge.json`); training went on from it."
)


def format_value(value: Any) -> str:
    """A value for people: integral floats as integers (`38008`), dicts as `key: value` text, None as `-`."""
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, float):
        if value.is_integer():
            return str(int(value))
        return f"{value:.6g}"
    if isinstance(value, dict):
        return ", ".join(
            f"{instance_label(k) if isinstance(k, int) else k}: {format_value(v)}" for k, v in value.items()
        )
    if isinstance(value, list | tuple):
        return ", ".join(format_value(v) for v in value)
    return "-" if value is None else str(value)


def _summary_value(key: str, value: Any) -> str:
    if "bytes" in key and isinstance(value, int | float):
        return f"{format_bytes(value)} ({format_value(value)} B)" if value >= 1024 else f"{format_value(value)} B"
    return format_value(value)


def card_metrics(metrics: dict[str, Any] | None, prefix: str = "eval_merged") -> dict[str, float]:
    """The model's metrics of an `evaluate()` result, without the prefix and without timings (`loss`, `perplexity`,
    and what `compute_metrics` adds); non-finite values are left out."""
    found = {}
    for key, value in (metrics or {}).items():
        if not key.startswith(f"{prefix}_") or any(part in key for part in _NOT_METRICS):
            continue
        if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
            found[key[len(prefix) + 1 :]] = float(value)
    return found


def _snippet(kind: ModelKind, model_id: str, subfolder: str | None, tokenizer: bool, local: bool) -> list[str]:
    where = f'"{model_id}"' + (f', subfolder="{subfolder}"' if subfolder else "")
    if not kind.adapter:
        lines = [f"from transformers import {kind.auto_class}" + (", AutoTokenizer" if tokenizer else ""), ""]
        lines.append(f"model = {kind.auto_class}.from_pretrained({where})")
        return lines + ([f"tokenizer = AutoTokenizer.from_pretrained({where})"] if tokenizer else [])
    base = kind.base_model or (kind.base_path if local else None)
    lines = ["from peft import PeftModel", f"from transformers import {kind.auto_class}", ""]
    if base is None:
        lines.append("# BASE_MODEL: the model the adapter was trained on (not a Hub model, or not recorded)")
    lines += [
        f'base = {kind.auto_class}.from_pretrained("{base or "BASE_MODEL"}")',
        f"model = PeftModel.from_pretrained(base, {where})",
        "# model = model.merge_and_unload()  # fuse the adapter into the weights for inference without peft",
    ]
    if kind.auto_class in _PEFT_AUTO and base is not None and (local or kind.base_path is None):
        auto = _PEFT_AUTO[kind.auto_class]
        lines.append(f"# or in one call (the base named in adapter_config.json): peft.{auto}.from_pretrained({where})")
    return lines


NOT_EVALUATED = (
    'The trained model was not evaluated: training ran without an evaluation (`eval_strategy="no"`), and no '
    "metrics were recorded for it (`trainer.record_merged_metrics`)."
)


def _evaluation(metrics: dict[str, float] | None, before: dict[str, float] | None) -> list[str]:
    """The evaluation table: the final metrics, beside the starting model's when given."""
    if not metrics and not before:
        return []
    metrics, before = metrics or {}, before or {}
    names = list(metrics) + [name for name in before if name not in metrics]
    if not before:
        rows = ["| metric | value |", "|---|---|"] + [f"| {n} | {format_value(metrics[n])} |" for n in names]
    else:
        rows = ["| metric | before training | after |", "|---|---|---|"]
        rows += [f"| {n} | {format_value(before.get(n))} | {format_value(metrics.get(n))} |" for n in names]
    # The starting model's metrics without the trained one's: kept, and the card says why "after" is empty.
    note = [] if metrics else ["", NOT_EVALUATED]
    return ["## Evaluation", "", *rows, *note, ""]


def model_card(
    *,
    title: str,
    settings: dict[str, Any],
    summary: dict[str, Any] | None = None,
    base_model: str | None = None,
    dataset: str | None = None,
    kind: ModelKind | None = None,
    model_id: str | None = None,
    subfolder: str | None = None,
    description: str | None = None,
    metrics: dict[str, float] | None = None,
    metrics_before: dict[str, float] | None = None,
    plot: str | None = None,
    tokenizer: bool = False,
) -> str:
    """A model card (README.md with Hub metadata) recording how the model was trained with AdLoCo.

    Args:
        base_model: the Hub id training started from; default `kind.base_model`. A local folder (`kind.base_path`)
            is named in the text of a card on disk only.
        dataset: the data trained on (`CardDetails.dataset`): a Hub dataset id also goes into the metadata and the
            `model-index`; anything else is named in the text only. None: not named.
        kind: how the folder loads (default: a causal LM).
        model_id, subfolder: where the snippet loads from: a Hub repo id (and a folder in it) or a local folder.
        metrics: the model's final evaluation (`card_metrics`): a table, and the `model-index` with a Hub dataset.
        metrics_before: the starting model's evaluation on the same data, shown beside `metrics`.
        plot: a file in the folder to show (the run's `adloco_run.png`).
    """
    kind = kind or ModelKind()
    local = model_id is None or os.path.isabs(model_id) or os.path.exists(model_id)  # not a Hub repo id
    base_model = base_model or kind.base_model
    hub_dataset = hub_dataset_id(dataset)
    tags = ["adloco", "diloco", "adloco_hf"] + (["lora"] if kind.adapter else [])
    tags += [f"base_model:adapter:{base_model}"] if kind.adapter and base_model else []
    results = [
        EvalResult(
            task_type=kind.pipeline_tag or "other",
            dataset_type=hub_dataset,
            dataset_name=hub_dataset,
            metric_type=name,
            metric_value=value,
        )
        for name, value in (metrics or {}).items()
        if hub_dataset  # a model-index result needs its dataset
    ]
    data = ModelCardData(
        library_name="peft" if kind.adapter else "transformers",
        pipeline_tag=kind.pipeline_tag,
        base_model=base_model,
        datasets=[hub_dataset] if hub_dataset else None,
        tags=tags,
        model_name=(title if local else model_id) if results else None,  # model-index needs a name
        eval_results=results or None,
    )
    started = f"`{base_model}`" if base_model else f"`{kind.base_path}`" if local and kind.base_path else None
    about = description or "This checkpoint is the demand-weighted average of the instances that remained."
    if kind.adapter:
        model = f"the base model ({started})" if started else "the base model"
        about += f" Only the adapter was trained and communicated; {model} stays as it was."
    elif started:
        about += f" Training started from {started}."
    if dataset:
        about += f" Trained on `{dataset}`."
    lines = ["---", data.to_yaml(), "---", "", f"# {title}", "", f"{_ABOUT} {about}", ""]
    if plot:
        lines += [f"![the run: batch sizes, instances, losses and bytes sent over tokens]({plot})", ""]
    lines += ["## Use", "", "```python", *_snippet(kind, model_id or ".", subfolder, tokenizer, local), "```", ""]
    lines += _evaluation(metrics, metrics_before)
    lines += ["## AdLoCo settings", "", "| setting | value |", "|---|---|"]
    lines += [f"| `{k}` | `{format_value(v)}` |" for k, v in settings.items()] + [""]
    if summary:
        lines += ["## Run", "", "| | |", "|---|---|"]
        lines += [f"| {k} | {_summary_value(k, v)} |" for k, v in summary.items()] + [""]
    return "\n".join(lines)


def cpu_copy(model: torch.nn.Module) -> torch.nn.Module:
    """A deep copy of `model` with every parameter and buffer on the CPU (no second copy on the accelerator)."""
    memo: dict[int, Any] = {}
    for p in model.parameters():
        memo.setdefault(id(p), torch.nn.Parameter(p.detach().to("cpu", copy=True), requires_grad=p.requires_grad))
    for b in model.buffers():
        memo.setdefault(id(b), b.detach().to("cpu", copy=True))
    return copy.deepcopy(model, memo)


def full_folder_of(folder: str) -> str:
    """Where `save_merged_full` writes the fused model of the adapter in `folder`: `merged/` → `merged-full/`."""
    return os.path.normpath(folder) + "-full"
