"""`AdLoCoTrainer`: the Hugging Face `Trainer` with AdLoCo's inner loop, its callback, and the steps its overrides run
(the inner step, the training data, resuming, the checkpoint save, the merge folders)."""

from typing import TYPE_CHECKING

from ..common.lazy import lazy_exports


if TYPE_CHECKING:
    from .callback import AdLoCoCallback
    from .trainer import AdLoCoTrainer

__all__ = ["AdLoCoCallback", "AdLoCoTrainer"]
__getattr__ = lazy_exports(__name__, {"AdLoCoCallback": ".callback", "AdLoCoTrainer": ".trainer"})
