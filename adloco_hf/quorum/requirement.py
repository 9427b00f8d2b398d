"""torchft, imported where live recovery needs it: an optional dependency (the `ft` extra, pinned), so that a user
who never turns live recovery on never installs it, and one who does is told how."""

import importlib
from types import ModuleType


__all__ = ["TORCHFT_REQUIREMENT", "import_torchft"]

TORCHFT_REQUIREMENT = "torchft==0.2.0"  # setup.py's `ft` extra: the release live recovery is built and tested on


def import_torchft() -> ModuleType:
    """The `torchft` module, or an `ImportError` that names the extra to install."""
    try:
        return importlib.import_module("torchft")
    except ImportError as error:
        raise ImportError(
            f"live recovery (the round quorum) needs torchft, which is not installed ({error}). Install the extra: "
            f"pip install 'adloco_hf[ft]' (it pins {TORCHFT_REQUIREMENT})."
        ) from error
