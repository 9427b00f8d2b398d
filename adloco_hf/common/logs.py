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

**Progress bar.** tqdm estimates the time left from the speed of past steps. A round that grows a batch makes the
next steps slower, and that estimate would promise an early finish: [`restart_rate_estimate`] makes it start again
from the steps that follow.
"""

import contextlib
import logging
from collections.abc import Iterator

from tqdm.std import EMA
from transformers.utils import logging as hf_logging

from .upstream import restart_tqdm_rate


__all__ = ["PACKAGE_LOGGER", "get_logger", "leave_out_lines", "restart_rate_estimate"]

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


def restart_rate_estimate(bar, step: int) -> None:
    """Make a tqdm bar estimate its speed, and so the time left, from the steps after `step` only.

    Call it at the end of step `step`, before the Trainer's `ProgressCallback` moves the bar to `step`: the bar's
    smoothed speed (its exponential averages of steps and seconds between refreshes) and its last refresh restart
    there, so the first refresh after it measures the new steps alone (`upstream.restart_tqdm_rate`: tqdm's
    bookkeeping attributes); a bar without them (disabled, or a notebook's) is left alone.
    """
    restart_tqdm_rate(bar, step, EMA)
