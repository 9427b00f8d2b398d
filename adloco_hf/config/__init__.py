"""`AdLoCoConfig`: the Trainer's arguments plus AdLoCo's; the allowed values and the checks run before training."""

from typing import TYPE_CHECKING

from ..common.lazy import lazy_exports


if TYPE_CHECKING:
    from .arguments import AdLoCoConfig

__all__ = ["AdLoCoConfig"]
__getattr__ = lazy_exports(__name__, {"AdLoCoConfig": ".arguments"})
