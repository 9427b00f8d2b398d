"""`Worker`: one process's part of AdLoCo (its instance, its round), with DDP or FSDP inside a worker."""

import importlib
from typing import TYPE_CHECKING


if TYPE_CHECKING:
    from .core import Worker

__all__ = ["Worker"]
# Loaded on first use: importing a light module of this folder (e.g. `worker.preemption`) must not pull in the whole worker.
_LAZY = {"Worker": ".core"}


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
