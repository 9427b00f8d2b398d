"""`RunCards`: the cards of a run's folders (`merges/outer-N/`, `merged/`, `merged-full/`, `output_dir`), written
from what the run knows: its settings, its numbers and rounds file, its plot and the merged model's evaluation.

A part of `AdLoCoTrainer`, handed what it reads as a [`RunView`]; what the trainer cannot find out (the data's
name, the starting model's evaluation) is set in its `details` ([`CardDetails`], the trainer's `card_details`).
"""

import logging
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from ..checkpoint.folders import save_model_folder
from ..common.files import atomic_write_text
from .card_details import CardDetails, ModelKind, describe_model, last_round_batches
from .model_card import MERGE_ABOUT, card_metrics, cpu_copy, full_folder_of, model_card
from .plotting import PLOT_FILE, plot_run
from .run_log import load_rounds


__all__ = ["RunCards", "RunView"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class RunView:
    """What the cards and uploads of a run read of its trainer and worker (built by `AdLoCoTrainer`).

    Attributes:
        args: the run's `AdLoCoConfig` (its output folder, settings, `plot_run`, `save_merged_full`, Hub settings).
        model: the model being trained, unwrapped.
        processing_class: the tokenizer or processor saved beside a model, or None.
        is_writer: whether this process writes the run's files (global rank 0).
        summary: the run in a few numbers (`Worker.summary`).
        max_batch_size: a process's largest micro-batch, as resolved (None before training).
        views_of: a flat φ as views shaped like the trainable parameters.
        save_weights: writes a flat φ as a `from_pretrained` folder with its card: (folder, φ, title, extra files).
    """

    args: Any
    model: Callable[[], torch.nn.Module]
    processing_class: Any
    is_writer: Callable[[], bool]
    summary: Callable[[], dict[str, Any]]
    max_batch_size: Callable[[], int | None]
    views_of: Callable[[torch.Tensor], list[torch.Tensor]]
    save_weights: Callable[..., str]


class RunCards:
    """The cards of one run's folders (module docstring).

    Args:
        run: what the cards read of the trainer and worker.
        hub_location: (repo id, folder in the repo) a folder of this run is pushed to, or None.
    """

    def __init__(self, run: RunView, hub_location: Callable[[str], tuple[str, str | None] | None]):
        self.run = run
        self.hub_location = hub_location
        self.details = CardDetails()
        self.merged_metrics: dict[str, Any] | None = None  # the merged model's final evaluation
        self.plot: str | None = None  # this run's plot, once drawn (`draw_plot`)

    def settings(self) -> dict[str, Any]:
        """The AdLoCo settings as used: `max_batch_size` as resolved by the worker (not `"auto"`)."""
        settings = dict(self.run.args.adloco_settings)
        if self.run.max_batch_size() is not None:
            settings["max_batch_size"] = self.run.max_batch_size()
        return settings

    def render(
        self,
        folder: str,
        title: str,
        *,
        repo_id: str | None = None,
        metrics=None,
        full: bool = False,
        merged: bool = False,
        **kwargs,
    ) -> str:
        """The card of one of this run's folders; it loads from `repo_id`, the run's repo or the folder itself. The
        merged model's card (`merged`) shows `card_details.metrics_before` also when the model was not evaluated
        (they were dropped without a word), with a line that says so; a merge's shows them beside its metrics only."""
        kind = describe_model(self.run.model())
        if full:  # merged-full/: the adapter fused into its base, a plain model
            kind = ModelKind(kind.auto_class, kind.pipeline_tag, False, kind.base_model, kind.base_path)
        location = (repo_id, "merged-full" if full else None) if repo_id else self.hub_location(folder)
        if full:
            kwargs.setdefault("description", "This checkpoint is the merged adapter fused into its base model.")
        elif os.path.basename(os.path.dirname(os.path.abspath(folder))) == "merges":
            kwargs.setdefault("description", MERGE_ABOUT)
        model_id, subfolder = location if location else (folder, None)
        details = self.details
        return model_card(
            title=title,
            settings=self.settings(),
            summary=self.summary(),
            kind=kind,
            model_id=model_id,
            subfolder=subfolder,
            dataset=details.dataset,
            metrics=metrics,
            metrics_before=(details.metrics_before or None) if metrics or merged else None,
            tokenizer=self.run.processing_class is not None and not kind.adapter,
            **kwargs,
        )

    def summary(self) -> dict[str, Any]:
        """The run's numbers (`Worker.summary`) and, from the rounds file of the writing rank, the per-worker batch
        that ran in the last round (switch mode may cap a request or split it into micro-batches)."""
        summary = {}
        try:
            batches = last_round_batches(load_rounds(self.run.args.output_dir))
        except (FileNotFoundError, ValueError):  # no round yet, or a file that is not this run's
            batches = {}
        for key, value in self.run.summary().items():
            summary[key] = value
            if key == "instances at the end" and batches:
                summary["per-worker batch in the last round"] = batches
        return summary

    def record_merged_metrics(self, metrics: dict[str, Any]) -> None:
        """Keep the merged model's final evaluation for its cards and rewrite them (on global rank 0)."""
        self.merged_metrics = card_metrics(metrics)
        self.write_merged()

    def save_merged_folders(self, folder: str, phi: torch.Tensor) -> None:
        """On the writing rank: `folder` from the global weights, `<folder>-full` with `save_merged_full` for an
        adapter, then their cards (with the plot, and the final metrics once evaluated)."""
        self.run.save_weights(folder, phi, title="AdLoCo merged model")
        model = self.run.model()
        if self.run.args.save_merged_full:
            if describe_model(model).adapter:
                self._save_fused(full_folder_of(folder), model, phi)
            else:
                logger.info("save_merged_full: %s already holds the full model (no adapter to fuse)", folder)
        self.write_merged(folder)

    def _save_fused(self, folder: str, model, phi: torch.Tensor) -> None:
        """The adapter fused into a CPU copy of its base (`merge_and_unload`), saved as a plain model."""
        fused = cpu_copy(model)
        trainable = [p for p in fused.parameters() if p.requires_grad]
        with torch.no_grad():
            for param, value in zip(trainable, self.run.views_of(phi)):
                param.copy_(value.to(param.dtype))
        save_model_folder(folder, fused.merge_and_unload(), processing_class=self.run.processing_class)
        logger.info("saved the merged model with its adapter fused to %s", folder)

    def draw_plot(self, plot: Callable[[str], str] = plot_run) -> str | None:
        """Draw this run's `{output_dir}/adloco_run.png` from its rounds and eval files and show it in the merged
        folders' cards (global rank 0, at the end of training). The model is saved already: a plot that cannot be
        drawn is a warning, and the cards go without it. Returns the plot's path."""
        if not self.run.is_writer():
            return None
        self.plot = None
        if not self.run.args.plot_run:  # AdLoCoConfig.plot_run=False: the cards go without a plot
            self.write_merged()
            return None
        try:
            self.plot = plot(self.run.args.output_dir)
        except Exception as error:  # noqa: BLE001 - the trained model is on disk; the plot is an extra
            logger.warning(
                "could not draw the run's plot (%s: %s); its cards go without it", type(error).__name__, error
            )
        self.write_merged()
        return self.plot

    def write_merged(self, folder: str | None = None, *, repo_id: str | None = None) -> None:
        """(Re)write the card of the merged folder and of its `-full` twin (global rank 0): the final metrics, this
        run's plot (copied in once `draw_plot` drew it: never an earlier run's), the snippet naming `repo_id`."""
        if not self.run.is_writer():
            return
        args = self.run.args
        folder = folder or os.path.join(args.output_dir, "merged")
        targets = [(folder, False)] + ([(full_folder_of(folder), True)] if args.save_merged_full else [])
        for target, full in targets:
            if not os.path.isdir(target):
                continue
            plot = self.plot is not None and os.path.isfile(self.plot)
            if plot:
                shutil.copyfile(self.plot, os.path.join(target, PLOT_FILE))
            title = "AdLoCo merged model" + (" (adapter fused)" if full else "")
            card = self.render(
                target,
                title,
                repo_id=repo_id,
                full=full,
                merged=True,
                metrics=self.merged_metrics,
                plot=PLOT_FILE if plot else None,
            )
            atomic_write_text(os.path.join(target, "README.md"), card)

    def write_output_dir_card(self) -> None:
        """The merged model's card, written to `output_dir` (the merged folders have their own), beside this run's
        plot once drawn."""
        if not self.run.is_writer():
            return
        output_dir = self.run.args.output_dir
        folder = os.path.join(output_dir, "merged")
        drawn = self.plot is not None and os.path.isfile(os.path.join(output_dir, PLOT_FILE))
        card = self.render(
            folder, "AdLoCo merged model", merged=True, metrics=self.merged_metrics, plot=PLOT_FILE if drawn else None
        )
        atomic_write_text(os.path.join(output_dir, "README.md"), card)
