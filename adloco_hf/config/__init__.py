"""`AdLoCoConfig`: the Trainer's arguments plus AdLoCo's; the allowed values and the checks run before training."""

import importlib
from typing import TYPE_CHECKING


if TYPE_CHECKING:
    from .arguments import AdLoCoConfig

__all__ = ["AdLoCoConfig"]
# Loaded on first use: importing a light module of this folder (e.g. `config.choices`) must not pull in transformers.
_LAZY = {"AdLoCoConfig": ".arguments"}


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
