"""What a user sees while AdLoCo trains: its log lines, and the progress bar's time estimate.

**Log lines.** The `adloco_hf` logger, parent of every logger of the package, hangs under the `transformers` library
logger instead of the root: `adloco_hf`'s lines print where, how and when the Trainer's own lines print. The Trainer
sets the `transformers` level from `log_level` on the main process and `log_level_replica` on the others
(`args.get_process_log_level()`), so `log_level="info"` shows the line of every round; with the default
`log_level="passive"` the level is `transformers.logging.set_verbosity_*`'s (warnings only). The handler (stderr),
`transformers.logging.enable_explicit_format()` and `enable_propagation()` (to reach your own root handlers) apply too.

**Lines left out.** [`leave_out_lines`] drops, inside a block, the lines of one logger that start with given words:
the trainer uses it for the Trainer's banner lines that do not hold for AdLoCo, and for the warnings every worker
would print alike (`trainer/round_console.py`).

**Lines beside the progress bar.** The bar redraws its line in place and never ends it: a log record printed while
it runs would continue the bar's line (`179/200 [00:25<00:04][transformers] round 9 ...` in a log file). Inside
[`lines_above_the_bar`] every record of the `transformers` and root loggers' stream handlers goes out as `tqdm.write`
sends the Trainer's own lines: on a terminal the bar is cleared, the record printed, the bar drawn again below it; in
a file or pipe the bar's line is ended with a newline first, so every record has a line of its own.

**Lines of every save.** transformers' `save_pretrained` logs a line per file at INFO ("Configuration saved in
out/.tmp-checkpoint-200/config.json"), naming the staging folder a save renames a moment later, and shows a bar
"Writing model shards": at `log_level="info"` they outnumbered the round lines. [`quiet_saves`] leaves them out
around AdLoCo's saves, which log one line each instead.

**Progress bar.** tqdm estimates the time left from the speed of past steps. A round that grows a batch makes the
next steps slower, and that estimate would promise an early finish: [`restart_rate_estimate`] makes it start again
from the steps that follow.
"""

import contextlib
import logging
import sys
from collections.abc import Iterator

from tqdm.std import EMA, tqdm
from transformers.utils import logging as hf_logging

from .upstream import restart_tqdm_rate


__all__ = [
    "PACKAGE_LOGGER",
    "SAVE_LINES",
    "get_logger",
    "leave_out_lines",
    "lines_above_the_bar",
    "quiet_saves",
    "restart_rate_estimate",
]

PACKAGE_LOGGER = "adloco_hf"


def get_logger(name: str) -> logging.Logger:
    """The logger of an `adloco_hf` module (`get_logger(__name__)`); its lines print like the Trainer's."""
    package = logging.getLogger(PACKAGE_LOGGER)
    library = hf_logging.get_logger("transformers")  # sets up transformers' handler and level first
    if package.parent is not library:
        package.parent = library
        package.setLevel(logging.NOTSET)  # inherit transformers' level (this also clears logging's level caches)
    return hf_logging.get_logger(name)


class _LeaveOut(logging.Filter):
    def __init__(self, starts: tuple[str, ...]):
        super().__init__()
        self.starts = starts

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith(self.starts)


@contextlib.contextmanager
def leave_out_lines(lines: dict[str, tuple[str, ...]]) -> Iterator[None]:
    """Inside the block, drop the records of each named logger whose message starts with one of its strings.

    A logger's filters see only the records logged on it (not its children's), so each name is the logger that
    logs the lines (`"transformers.trainer"`). Lines whose wording changes in another version are printed again.
    """
    filters = [(logging.getLogger(name), _LeaveOut(tuple(starts))) for name, starts in lines.items() if starts]
    for logger, dropped in filters:
        logger.addFilter(dropped)
    try:
        yield
    finally:
        for logger, dropped in filters:
            logger.removeFilter(dropped)


# The lines transformers logs at INFO for every file a save writes (transformers 5.23), by logger.
SAVE_LINES = {
    "transformers.configuration_utils": ("Configuration saved in",),
    "transformers.generation.configuration_utils": ("Configuration saved in",),
    "transformers.modeling_utils": ("Model weights saved in",),
    "transformers.tokenization_utils_base": (
        "tokenizer config file saved in",
        "added tokens file saved in",
        "chat template saved in",
    ),
    "transformers.processing_utils": ("chat template saved in",),
    "transformers.trainer": ("Saving model checkpoint to",),
}


@contextlib.contextmanager
def quiet_saves() -> Iterator[None]:
    """Inside the block, transformers' per-file save lines ([`SAVE_LINES`]) and its "Writing model shards" bar are
    left out; the caller logs the save in one line of its own."""
    bars = hf_logging.is_progress_bar_enabled()
    if bars:
        hf_logging.disable_progress_bar()
    try:
        with leave_out_lines(SAVE_LINES):
            yield
    finally:
        if bars:
            hf_logging.enable_progress_bar()


def _unwrapped(stream):
    return getattr(stream, "_wrapped", stream)  # tqdm wraps its file in an ObjectWrapper


def _same_output(bar_file, stream) -> bool:
    """As tqdm decides for `tqdm.write`: the same file, or both the process's stdout/stderr (one terminal or log)."""
    a, b = _unwrapped(bar_file), _unwrapped(stream)
    standard = (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__)
    return a is b or (a in standard and b in standard)


def _is_terminal(stream) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # no isatty, or closed
        return False


class _AboveTheBar(logging.Handler):
    """Delegates to a stream handler, with the progress bars on its output moved out of the record's way."""

    def __init__(self, handler: logging.StreamHandler):
        super().__init__(handler.level)
        self.handler = handler

    def handle(self, record: logging.LogRecord) -> bool:
        stream = getattr(self.handler, "stream", None)
        bars = [
            bar
            for bar in list(getattr(tqdm, "_instances", ()))
            if not bar.disable
            and stream is not None
            and not type(bar).__module__.startswith("tqdm.notebook")  # a widget: no line to share
            and _same_output(bar.fp, stream)
        ]
        if not bars:
            return self.handler.handle(record)
        with tqdm.get_lock():
            ended = set()
            for bar in bars:
                if _is_terminal(bar.fp):
                    bar.clear(nolock=True)
                elif id(_unwrapped(bar.fp)) not in ended:  # a file or pipe: end the bar's line
                    ended.add(id(_unwrapped(bar.fp)))
                    bar.fp.write("\n")
                    bar.fp.flush()
            try:
                return self.handler.handle(record)
            finally:
                for bar in bars:
                    bar.refresh(nolock=True)


@contextlib.contextmanager
def lines_above_the_bar() -> Iterator[None]:
    """Inside the block, the records of the `transformers` and root loggers' stream handlers never share a line with
    a progress bar (see the module's docstring); handlers are put back as they were after it."""
    swapped = []
    for logger in (logging.getLogger("transformers"), logging.getLogger()):
        for index, handler in enumerate(list(logger.handlers)):
            if isinstance(handler, logging.StreamHandler):
                wrapper = _AboveTheBar(handler)
                logger.handlers[index] = wrapper
                swapped.append((logger, wrapper, handler))
    try:
        yield
    finally:
        for logger, wrapper, handler in swapped:
            if wrapper in logger.handlers:  # else removed meanwhile (transformers' disable_default_handler)
                logger.handlers[logger.handlers.index(wrapper)] = handler


def restart_rate_estimate(bar, step: int) -> None:
    """Make a tqdm bar estimate its speed, and so the time left, from the steps after `step` only.

    Call it at the end of step `step`, before the Trainer's `ProgressCallback` moves the bar to `step`: the bar's
    smoothed speed (its exponential averages of steps and seconds between refreshes) and its last refresh restart
    there, so the first refresh after it measures the new steps alone (`upstream.restart_tqdm_rate`: tqdm's
    bookkeeping attributes); a bar without them (disabled, or a notebook's) is left alone.
    """
    restart_tqdm_rate(bar, step, EMA)
