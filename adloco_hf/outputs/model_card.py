"""Model cards for the folders AdLoCo writes (`merges/outer-N/`, `merged/`, `merged-full/`).

A card is a README.md with the Hub's metadata: `library_name` (`transformers`, or `peft` for an adapter), the task,
`base_model`, and the final evaluation in the Hub's `model-index` form (through `huggingface_hub.ModelCardData`).
Its body has a snippet that loads the folder as written (from the repo it is pushed to, else from the folder on
disk), the run's plot when there is one, the settings that were used (`max_batch_size` as resolved, not `"auto"`)
and the run's numbers. [`model_card`] only renders; [`ModelCardMixin`] gathers what the trainer knows and writes.
"""

import copy
import logging
import math
import os
import shutil
from dataclasses import dataclass
from typing import Any

import torch
from huggingface_hub import EvalResult, ModelCardData

from ..checkpoint.folders import save_model_folder
from ..common.files import atomic_write_text
from ..common.formats import format_bytes
from .plotting import PLOT_FILE
from .report import instance_label


__all__ = ["ModelCardMixin", "ModelKind", "card_metrics", "describe_model", "format_value", "model_card"]

logger = logging.getLogger(__name__)

# The Auto class and Hub task of a model, found from its class (the first mapping that lists it wins).
_TASKS = (
    ("AutoModelForCausalLM", "MODEL_FOR_CAUSAL_LM_MAPPING_NAMES", "text-generation"),
    ("AutoModelForSeq2SeqLM", "MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES", "text2text-generation"),
    ("AutoModelForMaskedLM", "MODEL_FOR_MASKED_LM_MAPPING_NAMES", "fill-mask"),
    ("AutoModelForSequenceClassification", "MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES", "text-classification"),
    ("AutoModelForTokenClassification", "MODEL_FOR_TOKEN_CLASSIFICATION_MAPPING_NAMES", "token-classification"),
    ("AutoModelForQuestionAnswering", "MODEL_FOR_QUESTION_ANSWERING_MAPPING_NAMES", "question-answering"),
)
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

_MERGE_ABOUT = (
    "This checkpoint is a merge saved during training: the demand-weighted average of two instances (see "
    "`adloco_merge.json`); training went on from it."
)


@dataclass(frozen=True)
class ModelKind:
    """How a folder loads: its Auto class and Hub task, and for a PEFT adapter the model it applies to."""

    auto_class: str = "AutoModelForCausalLM"
    pipeline_tag: str | None = "text-generation"
    adapter: bool = False  # a PEFT adapter folder (adapter_config.json), not a full model
    base_model: str | None = None


def describe_model(model) -> ModelKind:
    """The [`ModelKind`] of a (possibly PEFT-wrapped) model."""
    from transformers.models.auto import modeling_auto

    adapter = hasattr(model, "peft_config") and hasattr(model, "get_base_model")
    inner = model.get_base_model() if adapter else model
    auto_class, pipeline_tag = "AutoModel", None
    for name, mapping, task in _TASKS:
        classes = {c for v in getattr(modeling_auto, mapping).values() for c in (v if isinstance(v, tuple) else (v,))}
        if type(inner).__name__ in classes:
            auto_class, pipeline_tag = name, task
            break
    if adapter:
        config = model.peft_config.get(getattr(model, "active_adapter", "default"))
        base = getattr(config, "base_model_name_or_path", None)
    else:  # a full fine-tune names the Hub model it started from (not a local folder, not a model built in code)
        base = getattr(getattr(model, "config", None), "_name_or_path", None)
        base = base if base and not os.path.exists(base) else None
    return ModelKind(auto_class, pipeline_tag, adapter, base or None)


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


def _snippet(kind: ModelKind, model_id: str, subfolder: str | None, tokenizer: bool) -> list[str]:
    where = f'"{model_id}"' + (f', subfolder="{subfolder}"' if subfolder else "")
    if not kind.adapter:
        lines = [f"from transformers import {kind.auto_class}" + (", AutoTokenizer" if tokenizer else ""), ""]
        lines.append(f"model = {kind.auto_class}.from_pretrained({where})")
        return lines + ([f"tokenizer = AutoTokenizer.from_pretrained({where})"] if tokenizer else [])
    base = kind.base_model or "BASE_MODEL"
    lines = ["from peft import PeftModel", f"from transformers import {kind.auto_class}", ""]
    if kind.base_model is None:
        lines.append("# BASE_MODEL: the model the adapter was trained on (its name was not recorded in the adapter)")
    lines += [
        f'base = {kind.auto_class}.from_pretrained("{base}")',
        f"model = PeftModel.from_pretrained(base, {where})",
        "# model = model.merge_and_unload()  # fuse the adapter into the weights for inference without peft",
    ]
    if kind.auto_class in _PEFT_AUTO and kind.base_model is not None:
        auto = _PEFT_AUTO[kind.auto_class]
        lines.append(f"# or in one call (the base named in adapter_config.json): peft.{auto}.from_pretrained({where})")
    return lines


def model_card(
    *,
    title: str,
    settings: dict[str, Any],
    summary: dict[str, Any] | None = None,
    base_model: str | None = None,
    datasets: list[str] | None = None,
    kind: ModelKind | None = None,
    model_id: str | None = None,
    subfolder: str | None = None,
    description: str | None = None,
    metrics: dict[str, float] | None = None,
    eval_dataset: str = "evaluation set",
    plot: str | None = None,
    tokenizer: bool = False,
) -> str:
    """A model card (README.md with Hub metadata) recording how the model was trained with AdLoCo.

    Args:
        kind: how the folder loads (default: a causal LM); `kind.base_model` is used when `base_model` is not given.
        model_id, subfolder: where the snippet loads from: a Hub repo id (and a folder in it) or a local folder.
        metrics: the model's final evaluation (`card_metrics`), written as `model-index` and as a table.
        plot: a file in the folder to show (the run's `adloco_run.png`).
    """
    kind = kind or ModelKind()
    local = model_id is None or os.path.isabs(model_id) or os.path.exists(model_id)  # not a Hub repo id
    base_model = base_model or kind.base_model
    tags = ["adloco", "diloco", "adloco_hf"] + (["lora", f"base_model:adapter:{base_model}"] if kind.adapter else [])
    results = [
        EvalResult(
            task_type=kind.pipeline_tag or "other",
            dataset_type=eval_dataset,
            dataset_name=eval_dataset,
            metric_type=name,
            metric_value=value,
        )
        for name, value in (metrics or {}).items()
    ]
    data = ModelCardData(
        library_name="peft" if kind.adapter else "transformers",
        pipeline_tag=kind.pipeline_tag,
        base_model=base_model,
        datasets=datasets or None,
        tags=tags,
        model_name=(title if local else model_id) if results else None,  # model-index needs a name
        eval_results=results or None,
    )
    about = description or "This checkpoint is the demand-weighted average of the instances that remained."
    if kind.adapter:
        about += f" Only the adapter was trained and communicated; the base model (`{base_model}`) stays as it was."
    elif base_model:
        about += f" Training started from `{base_model}`."
    lines = ["---", data.to_yaml(), "---", "", f"# {title}", "", f"{_ABOUT} {about}", ""]
    if plot:
        lines += [f"![the run: batch sizes, instances, losses and bytes sent over tokens]({plot})", ""]
    lines += ["## Use", "", "```python", *_snippet(kind, model_id or ".", subfolder, tokenizer), "```", ""]
    if metrics:
        lines += [f"## Evaluation ({eval_dataset})", "", "| metric | value |", "|---|---|"]
        lines += [f"| {name} | {format_value(value)} |" for name, value in metrics.items()] + [""]
    lines += ["## AdLoCo settings", "", "| setting | value |", "|---|---|"]
    lines += [f"| `{k}` | `{format_value(v)}` |" for k, v in settings.items()] + [""]
    if summary:
        lines += ["## Run", "", "| | |", "|---|---|"]
        lines += [f"| {k} | {_summary_value(k, v)} |" for k, v in summary.items()] + [""]
    return "\n".join(lines)


def _cpu_copy(model: torch.nn.Module) -> torch.nn.Module:
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


class ModelCardMixin:
    """The cards of the trainer's folders (mixed into `AdLoCoTrainer` through `MergedModelHubMixin`).

    Needs the Trainer's `args`, `model`, `accelerator`, `processing_class`, `eval_dataset`, `hub_model_id`,
    `is_world_process_zero` and AdLoCo's `worker` and `_save_global_weights`.
    """

    def card_settings(self) -> dict[str, Any]:
        """The AdLoCo settings as used: `max_batch_size` as resolved by the worker (not `"auto"`)."""
        settings = dict(self.args.adloco_settings)
        if getattr(self.worker, "max_batch_size", None) is not None:
            settings["max_batch_size"] = self.worker.max_batch_size
        return settings

    def _hub_location(self, folder: str) -> tuple[str, str | None] | None:
        """(repo id, folder in the repo) a folder of this run is pushed to, else None (`MergedModelHubMixin`)."""
        return None

    def render_card(
        self, folder: str, title: str, *, repo_id: str | None = None, metrics=None, full: bool = False, **kwargs
    ) -> str:
        """The card of one of this run's folders; it loads from `repo_id`, the run's repo or the folder itself."""
        model = self.accelerator.unwrap_model(self.model)
        kind = describe_model(model)
        if full:  # merged-full/: the adapter fused into its base, a plain model
            kind = ModelKind(kind.auto_class, kind.pipeline_tag, False, kind.base_model)
        location = (repo_id, "merged-full" if full else None) if repo_id else self._hub_location(folder)
        if full:
            kwargs.setdefault("description", "This checkpoint is the merged adapter fused into its base model.")
        elif os.path.basename(os.path.dirname(os.path.abspath(folder))) == "merges":
            kwargs.setdefault("description", _MERGE_ABOUT)
        model_id, subfolder = location if location else (folder, None)
        eval_name = getattr(getattr(self.eval_dataset, "info", None), "dataset_name", None)
        return model_card(
            title=title,
            settings=self.card_settings(),
            summary=self.worker.summary(),
            kind=kind,
            model_id=model_id,
            subfolder=subfolder,
            metrics=metrics,
            eval_dataset=eval_name or "evaluation set",
            tokenizer=self.processing_class is not None and not kind.adapter,
            **kwargs,
        )

    def record_merged_metrics(self, metrics: dict[str, Any]) -> None:
        """Keep the merged model's final evaluation for its cards and rewrite them (on global rank 0)."""
        self._merged_metrics = card_metrics(metrics)
        self.write_merged_cards()

    def save_merged_folders(self, folder: str, phi: torch.Tensor) -> None:
        """On the writing rank: `folder` from the global weights, `<folder>-full` with `save_merged_full` for an
        adapter, then their cards (with the plot, and the final metrics once evaluated)."""
        self._save_global_weights(folder, phi, title="AdLoCo merged model")
        model = self.accelerator.unwrap_model(self.model)
        if self.args.save_merged_full:
            if describe_model(model).adapter:
                self._save_fused(full_folder_of(folder), model, phi)
            else:
                logger.info("save_merged_full: %s already holds the full model (no adapter to fuse)", folder)
        self.write_merged_cards(folder)

    def _save_fused(self, folder: str, model, phi: torch.Tensor) -> None:
        """The adapter fused into a CPU copy of its base (`merge_and_unload`), saved as a plain model."""
        fused = _cpu_copy(model)
        trainable = [p for p in fused.parameters() if p.requires_grad]
        with torch.no_grad():
            for param, value in zip(trainable, self.worker.global_model.views_of(phi)):
                param.copy_(value.to(param.dtype))
        save_model_folder(folder, fused.merge_and_unload(), processing_class=self.processing_class)
        logger.info("saved the merged model with its adapter fused to %s", folder)

    def write_merged_cards(self, folder: str | None = None, *, repo_id: str | None = None) -> None:
        """(Re)write the card of the merged folder and of its `-full` twin (global rank 0): the final metrics, the
        run's plot copied in when `{output_dir}/adloco_run.png` exists, the snippet naming `repo_id` if given."""
        if not self.is_world_process_zero():
            return
        folder = folder or os.path.join(self.args.output_dir, "merged")
        plot = os.path.join(self.args.output_dir, PLOT_FILE)
        targets = [(folder, False)] + ([(full_folder_of(folder), True)] if self.args.save_merged_full else [])
        for target, full in targets:
            if not os.path.isdir(target):
                continue
            if os.path.isfile(plot):
                shutil.copyfile(plot, os.path.join(target, PLOT_FILE))
            title = "AdLoCo merged model" + (" (adapter fused)" if full else "")
            card = self.render_card(
                target,
                title,
                repo_id=repo_id,
                full=full,
                metrics=getattr(self, "_merged_metrics", None),
                plot=PLOT_FILE if os.path.isfile(os.path.join(target, PLOT_FILE)) else None,
            )
            atomic_write_text(os.path.join(target, "README.md"), card)

    def create_model_card(self, *args, **kwargs) -> None:
        """The merged model's card, written to `output_dir` (the merged folders have their own)."""
        if self.is_world_process_zero():
            folder = os.path.join(self.args.output_dir, "merged")
            card = self.render_card(folder, "AdLoCo merged model", metrics=getattr(self, "_merged_metrics", None))
            atomic_write_text(os.path.join(self.args.output_dir, "README.md"), card)
