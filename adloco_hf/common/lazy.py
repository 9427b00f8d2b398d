"""A package's main names loaded on first use (PEP 562 module `__getattr__`).

`adloco_hf.config`, `.worker` and `.trainer` give `AdLoCoConfig`, `Worker` and `AdLoCoTrainer`, yet importing a light
module of theirs (`config.choices`, `worker.preemption`, `trainer.callback`) must not pull in transformers' Trainer.
"""

import importlib
from collections.abc import Callable


__all__ = ["lazy_exports"]


def lazy_exports(package: str, exports: dict[str, str]) -> Callable[[str], object]:
    """The `__getattr__` of `package` that imports `exports[name]` (a module relative to `package`) on first use."""

    def __getattr__(name: str):
        if name in exports:
            return getattr(importlib.import_module(exports[name], package), name)
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    return __getattr__
