"""`AdLoCoTrainer`: the Hugging Face `Trainer` with AdLoCo's inner loop, its callback and its checkpoint save."""

from .callback import AdLoCoCallback
from .trainer import AdLoCoTrainer


__all__ = ["AdLoCoCallback", "AdLoCoTrainer"]
