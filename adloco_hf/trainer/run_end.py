"""A run's end as the trainer records it: the final checkpoint marked as the end of a finished run, a resume of that
checkpoint that only says so, and the line a script ends with.

A run resumed from its final checkpoint finishes what it had not (`AdLoCoTrainer._run_epoch`: the final merge,
`merged/`, its evaluation, the push). A run that had finished all of that, resumed again (the recipes'
`--resume_from_checkpoint last` run twice), printed nothing about it, and the script's `save_metrics` rewrote
`train_results.json` and `all_results.json` with a `train_loss` of 0.0 and a runtime of a tenth of a second. Now the
end of a finished run is written into its final checkpoint (`adloco/run_end.json`: the step and the `TrainOutput`);
`train()` from that checkpoint with no step left to train logs one line, returns the run's own `TrainOutput`, and
`save_metrics` / `save_state` leave the run's files as they were.
"""

import functools
import json
import logging
import os

from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR, TrainOutput

from ..checkpoint.manifest import resolve_checkpoint
from ..common.files import atomic_write_text
from ..common.logs import get_logger
from ..config.paths import RANK_STATE_DIR
from ..reporting.report import summarize_run, summary_line
from .round_console import RoundPrinterCallback, RoundProgressCallback


__all__ = [
    "RUN_END_FILE",
    "checkpoint_to_resume",
    "ended_run",
    "keep_the_results_of_an_ended_run",
    "record_run_end",
    "show_run_line",
]

logger = get_logger(__name__)

RUN_END_FILE = "run_end.json"


def checkpoint_to_resume(argument, args):
    """`train()`'s `resume_from_checkpoint`: the argument, else the config's field (`TrainingArguments` leaves it to
    scripts: `AdLoCoConfig(resume_from_checkpoint=...)` with `train()` started afresh, silently); resolved and
    verified (`checkpoint.manifest.resolve_checkpoint`: `"last"`, `True`, `"auto"` or a folder)."""
    if argument is None and args.resume_from_checkpoint not in (None, False):
        argument = args.resume_from_checkpoint
        logger.info(f"resume_from_checkpoint={argument!r}: AdLoCoConfig's field")
    return resolve_checkpoint(argument, args.output_dir)


def _record_path(checkpoint: str) -> str:
    return os.path.join(checkpoint, RANK_STATE_DIR, RUN_END_FILE)


def ended_run(checkpoint, args) -> TrainOutput | None:
    """The `TrainOutput` of the finished run whose final checkpoint `checkpoint` is, when `max_steps` leaves no step
    to train (one WARNING line says so); None otherwise (a checkpoint inside a run, or one whose end was interrupted:
    resuming it finishes the run)."""
    if not isinstance(checkpoint, str | os.PathLike):
        return None
    try:
        with open(_record_path(os.fspath(checkpoint)), encoding="utf-8") as f:
            record = json.load(f)
    except (OSError, ValueError):
        return None
    step = record["global_step"]
    if step < args.max_steps:
        return None
    logger.warning(
        f"resume_from_checkpoint: {checkpoint} is the end of a run that finished at step {step} (max_steps="
        f"{args.max_steps}): nothing is trained, and the run's files (merged/, its results) stay as they were. Raise "
        "max_steps to train on from it, or pass another output_dir for a new run."
    )
    return TrainOutput(step, record["training_loss"], record["metrics"])


def record_run_end(trainer, output: TrainOutput) -> None:
    """On global rank 0, once a run finished (not preempted, merged/ saved, evaluated and pushed): its final
    checkpoint records the end (none with `save_strategy="no"`: nothing to resume), and the run's line is shown."""
    if not trainer.is_world_process_zero():
        return
    checkpoint = os.path.join(trainer.args.output_dir, f"{PREFIX_CHECKPOINT_DIR}-{output.global_step}")
    if os.path.isdir(os.path.join(checkpoint, RANK_STATE_DIR)):
        record = {"global_step": output.global_step, "training_loss": output.training_loss, "metrics": output.metrics}
        atomic_write_text(_record_path(checkpoint), json.dumps(record, indent=1) + "\n")
    show_run_line(trainer)


def show_run_line(trainer) -> None:
    """The recipes' summary in one line, for every script (global rank 0): at INFO, or printed where INFO does not
    show (the default `log_level="passive"`), as a round's line is."""
    output_dir = trainer.args.output_dir
    try:
        line = summary_line(summarize_run(output_dir))
    except (OSError, ValueError):  # no round written (nothing to summarise)
        return
    if logger.isEnabledFor(logging.INFO):
        logger.info(line)
        return
    consoles = [
        c for c in trainer.callback_handler.callbacks if isinstance(c, RoundProgressCallback | RoundPrinterCallback)
    ]
    if consoles:
        consoles[0].write_line(line)


def keep_the_results_of_an_ended_run(method):
    """`save_metrics` or `save_state` that writes nothing after `train()` resumed a run that had ended: the files are
    the run's own (`train()` returned its `TrainOutput`), a no-op must not rewrite them."""

    @functools.wraps(method)
    def unless_ended(trainer, *args, **kwargs):
        if getattr(trainer, "ended_run", None) is not None:
            logger.debug(f"{method.__name__}: the run had ended; its files in {trainer.args.output_dir} are kept")
            return None
        return method(trainer, *args, **kwargs)

    return unless_ended
