"""What the Trainer prints while AdLoCo trains: one short line per round, a banner that holds for adaptive batches,
and the warnings that every worker would print alike printed once.

**A round.** The `adloco/*` values of a round go to the reporting integrations (`report_to`) through `Trainer.log`,
but the console callbacks (the progress bar's `ProgressCallback`, `PrinterCallback` with `disable_tqdm`) leave them
out: a round's dict is some 600 characters. The round's line (`round 3 (step 60) | instances 2 | batch i0=4→6 | ...`)
is logged at INFO on global rank 0 (`worker/round_end.py`); where that level does not show (the default
`log_level="passive"` shows warnings only), the console callback prints the line in the dict's place, as it prints
the Trainer's loss dicts at any level. So the console has one line per round either way.

**The banner.** With `max_steps` and AdLoCo's endless sampler, the Trainer's "Running training" banner describes a
fixed-batch epoch loop that does not happen (`Num Epochs = 9,223,372,036,854,775,807`, a total batch of the initial
request). Those lines are left out; the steps and the trainable parameters stay, and AdLoCo's own line follows them
(workers, instances, rounds, batches: `worker/start.py`).

**Warnings.** Every worker aligns the same model with the same tokenizer: the Trainer's PAD/BOS/EOS warning is
printed by global rank 0 only.

**Beside the bar.** While training runs, a log line never continues the progress bar's line, on a terminal or in a
log file (`common/logs.py`: `lines_above_the_bar`).
"""

import contextlib
import logging
from collections.abc import Iterator

from transformers.trainer_callback import CallbackHandler, PrinterCallback, ProgressCallback

from ..common.logs import leave_out_lines, lines_above_the_bar, restart_rate_estimate
from ..rounds.log_lines import round_logs, round_message
from ..rounds.state import RoundResult
from ..worker.round_end import logger as round_logger


__all__ = [
    "RoundPrinterCallback",
    "RoundProgressCallback",
    "announce_round",
    "quiet_console",
    "show_round_line",
    "use_round_console",
]

# The banner's lines about a fixed-batch epoch loop (transformers' `Trainer._inner_training_loop`).
FIXED_BATCH_BANNER = (
    "  Num examples =",
    "  Num Epochs =",
    "  Num update steps per epoch =",
    "  Instantaneous batch size per device =",
    "  Training with DataParallel",
    "  Total train batch size",
    "  Gradient Accumulation steps =",
)
# Warnings that every worker logs alike; only global rank 0 prints them.
SAME_ON_EVERY_WORKER = {"transformers.trainer_utils": ("The tokenizer has new PAD/BOS/EOS tokens",)}
# What `Trainer.log` adds to any logs: a dict holding only these beside `adloco/*` values has nothing to print.
_BOOKKEEPING = frozenset({"epoch", "num_input_tokens_seen"})


def _console_logs(logs: dict | None) -> dict | None:
    """The logs without `adloco/*` values; None when nothing but bookkeeping is left of a round's logs."""
    if not logs or not any(key.startswith("adloco/") for key in logs):
        return logs
    shown = {key: value for key, value in logs.items() if not key.startswith("adloco/")}
    return shown if set(shown) - _BOOKKEEPING else None


class RoundProgressCallback(ProgressCallback):
    """The Trainer's progress bar, whose printed logs leave out the `adloco/*` values (a round has its line)."""

    def on_log(self, args, state, control, logs=None, **kwargs):
        shown = _console_logs(logs)
        if shown is not None:
            super().on_log(args, state, control, logs=shown, **kwargs)

    def write_line(self, line: str) -> None:
        if self.training_bar is not None:
            self.training_bar.write(line)  # above the bar, which stays in place
        else:
            print(line)


class RoundPrinterCallback(PrinterCallback):
    """The Trainer's log printer (`disable_tqdm=True`), leaving out the `adloco/*` values."""

    def on_log(self, args, state, control, logs=None, **kwargs):
        shown = _console_logs(logs)
        if shown is not None:
            super().on_log(args, state, control, logs=shown, **kwargs)

    def write_line(self, line: str) -> None:
        print(line)


def use_round_console(handler: CallbackHandler) -> None:
    """Put the round-aware console callbacks in place of the Trainer's own (a subclass a user gave is kept)."""
    for index, callback in enumerate(handler.callbacks):
        if type(callback) is ProgressCallback:
            handler.callbacks[index] = RoundProgressCallback(max_str_len=callback.max_str_len)
        elif type(callback) is PrinterCallback:
            handler.callbacks[index] = RoundPrinterCallback()


def show_round_line(handler: CallbackHandler, is_world_process_zero: bool, line: str, level: int) -> None:
    """Print a round's line through the console callback when its log record (`level`) does not show."""
    if not is_world_process_zero or round_logger.isEnabledFor(level):
        return
    for callback in handler.callbacks:
        if isinstance(callback, RoundProgressCallback | RoundPrinterCallback):
            callback.write_line(line)
            return


@contextlib.contextmanager
def quiet_console(is_world_process_zero: bool) -> Iterator[None]:
    """Inside `train()`: the Trainer's banner without its fixed-batch lines, the warnings every worker would print
    alike left to global rank 0, and log lines kept off the progress bar's line."""
    lines = {"transformers.trainer": FIXED_BATCH_BANNER}
    if not is_world_process_zero:
        lines.update(SAME_ON_EVERY_WORKER)
    with leave_out_lines(lines), lines_above_the_bar():
        yield


def announce_round(trainer, result: RoundResult) -> None:
    """A round of `trainer`'s worker, as people and trackers see it (the same call on every rank): its `adloco/*`
    values through `trainer.log` (for `report_to`), its line on the console, and, when the batches changed, the
    progress bar's estimate of the time left restarted from the next steps instead of averaging in the old speed."""
    worker = trainer.worker
    if trainer.args.logging_strategy != "no":
        trainer.log(round_logs(result.lines, worker.state, worker.instances))
        message = round_message(result.lines, len(worker.instances), result.merge and result.merge.plan)
        level = logging.WARNING if any(line.skipped for line in result.lines) else logging.INFO
        show_round_line(trainer.callback_handler, trainer.is_world_process_zero(), message, level)
    if result.merge is not None or any(line.next_batch_size != line.batch_size for line in result.lines):
        for callback in trainer.callback_handler.callbacks:
            if isinstance(callback, ProgressCallback) and callback.training_bar is not None:
                restart_rate_estimate(callback.training_bar, trainer.state.global_step)
