"""Model cards for the folders AdLoCo writes (`merges/outer-N/`, `merged/`, `merged-full/`).

A card is a README.md with the Hub's metadata: `library_name` (`transformers`, or `peft` for an adapter), the task,
`base_model` and `datasets` where they are Hub repos (`card_details.py`: a local path never goes into the metadata),
and the final evaluation in the Hub's `model-index` form (through `huggingface_hub.ModelCardData`) when the data is
a Hub dataset (a result without a dataset is no valid `model-index`, as the Trainer's own cards have it). Its body has
a snippet that loads the folder as written (from the repo it is pushed to, else from the folder on disk), this run's
plot (drawn at the end of training from its rounds file), the evaluation (beside the starting model's, when given),
the settings that were used (`max_batch_size` as resolved, not `"auto"`) and the run's numbers, with the batch that
ran in the last round. [`model_card`] only renders; [`ModelCardMixin`] gathers what the trainer knows and writes.
"""

import copy
import logging
import math
import os
import shutil
from typing import Any

import torch
from huggingface_hub import EvalResult, ModelCardData

from ..checkpoint.folders import save_model_folder
from ..common.files import atomic_write_text
from ..common.formats import format_bytes
from .card_details import CardDetails, ModelKind, describe_model, hub_dataset_id, last_round_batches
from .plotting import PLOT_FILE, plot_run
from .report import instance_label
from .run_log import load_rounds


__all__ = [
    "CardDetails",
    "ModelCardMixin",
    "ModelKind",
    "card_metrics",
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

_MERGE_ABOUT = (
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
    return ["## Evaluation", "", *rows, ""]


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

    Needs the Trainer's `args`, `model`, `accelerator`, `processing_class`, `hub_model_id`, `is_world_process_zero`
    and AdLoCo's `worker` and `_save_global_weights`. What the trainer cannot find out (the data's name, the starting
    model's evaluation) is set in `card_details` ([`CardDetails`]).
    """

    _card_details: CardDetails | None = None
    _run_plot: str | None = None  # this run's plot, once drawn (`draw_run_plot`)

    @property
    def card_details(self) -> CardDetails:
        """The cards' [`CardDetails`]: set its fields (e.g. `trainer.card_details.dataset = "my.jsonl"`) before the
        cards are written, or call `write_merged_cards()` after."""
        if self._card_details is None:
            self._card_details = CardDetails()
        return self._card_details

    @card_details.setter
    def card_details(self, details: CardDetails) -> None:
        self._card_details = details

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
            kind = ModelKind(kind.auto_class, kind.pipeline_tag, False, kind.base_model, kind.base_path)
        location = (repo_id, "merged-full" if full else None) if repo_id else self._hub_location(folder)
        if full:
            kwargs.setdefault("description", "This checkpoint is the merged adapter fused into its base model.")
        elif os.path.basename(os.path.dirname(os.path.abspath(folder))) == "merges":
            kwargs.setdefault("description", _MERGE_ABOUT)
        model_id, subfolder = location if location else (folder, None)
        details = self.card_details
        return model_card(
            title=title,
            settings=self.card_settings(),
            summary=self.card_summary(),
            kind=kind,
            model_id=model_id,
            subfolder=subfolder,
            dataset=details.dataset,
            metrics=metrics,
            metrics_before=(details.metrics_before or None) if metrics else None,
            tokenizer=self.processing_class is not None and not kind.adapter,
            **kwargs,
        )

    def card_summary(self) -> dict[str, Any]:
        """The run's numbers (`Worker.summary`) and, from the rounds file of the writing rank, the per-worker batch
        that ran in the last round (switch mode may cap a request or split it into micro-batches)."""
        summary = {}
        try:
            batches = last_round_batches(load_rounds(self.args.output_dir))
        except (FileNotFoundError, ValueError):  # no round yet, or a file that is not this run's
            batches = {}
        for key, value in self.worker.summary().items():
            summary[key] = value
            if key == "instances at the end" and batches:
                summary["per-worker batch in the last round"] = batches
        return summary

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

    def draw_run_plot(self) -> str | None:
        """Draw this run's `{output_dir}/adloco_run.png` from its rounds and eval files and show it in the merged
        folders' cards (global rank 0, at the end of training). The model is saved already: a plot that cannot be
        drawn is a warning, and the cards go without it. Returns the plot's path."""
        if not self.is_world_process_zero():
            return None
        self._run_plot = None
        if not self.args.plot_run:  # AdLoCoConfig.plot_run=False: the cards go without a plot
            self.write_merged_cards()
            return None
        try:
            self._run_plot = plot_run(self.args.output_dir)
        except Exception as error:  # noqa: BLE001 - the trained model is on disk; the plot is an extra
            logger.warning(
                "could not draw the run's plot (%s: %s); its cards go without it", type(error).__name__, error
            )
        self.write_merged_cards()
        return self._run_plot

    def write_merged_cards(self, folder: str | None = None, *, repo_id: str | None = None) -> None:
        """(Re)write the card of the merged folder and of its `-full` twin (global rank 0): the final metrics, this
        run's plot (copied in once `draw_run_plot` drew it: never an earlier run's), the snippet naming `repo_id`."""
        if not self.is_world_process_zero():
            return
        folder = folder or os.path.join(self.args.output_dir, "merged")
        targets = [(folder, False)] + ([(full_folder_of(folder), True)] if self.args.save_merged_full else [])
        for target, full in targets:
            if not os.path.isdir(target):
                continue
            plot = self._run_plot is not None and os.path.isfile(self._run_plot)
            if plot:
                shutil.copyfile(self._run_plot, os.path.join(target, PLOT_FILE))
            title = "AdLoCo merged model" + (" (adapter fused)" if full else "")
            card = self.render_card(
                target,
                title,
                repo_id=repo_id,
                full=full,
                metrics=getattr(self, "_merged_metrics", None),
                plot=PLOT_FILE if plot else None,
            )
            atomic_write_text(os.path.join(target, "README.md"), card)

    def create_model_card(self, *args, **kwargs) -> None:
        """The merged model's card, written to `output_dir` (the merged folders have their own), beside this run's
        plot once drawn."""
        if self.is_world_process_zero():
            folder = os.path.join(self.args.output_dir, "merged")
            drawn = self._run_plot is not None and os.path.isfile(os.path.join(self.args.output_dir, PLOT_FILE))
            card = self.render_card(
                folder,
                "AdLoCo merged model",
                metrics=getattr(self, "_merged_metrics", None),
                plot=PLOT_FILE if drawn else None,
            )
            atomic_write_text(os.path.join(self.args.output_dir, "README.md"), card)
