"""`AdLoCoTrainer`: the Hugging Face `Trainer` with AdLoCo's inner loop, its callback, and the steps its overrides run
(the inner step, the training data, resuming, the checkpoint save, the merge folders)."""

import importlib
from typing import TYPE_CHECKING


if TYPE_CHECKING:
    from .callback import AdLoCoCallback
    from .trainer import AdLoCoTrainer

__all__ = ["AdLoCoCallback", "AdLoCoTrainer"]
# Loaded on first use: importing a light module of this folder (e.g. `trainer.callback`) must not pull in the Trainer.
_LAZY = {"AdLoCoCallback": ".callback", "AdLoCoTrainer": ".trainer"}


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
