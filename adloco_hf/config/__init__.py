"""`AdLoCoConfig`: the Trainer's arguments plus AdLoCo's; the allowed values and the checks run before training."""

from .arguments import AdLoCoConfig


__all__ = ["AdLoCoConfig"]
