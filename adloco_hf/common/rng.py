"""Every random generator a worker's training draws from (Python, NumPy, torch CPU and CUDA), as plain tensors.

A resumed run must draw the same dropout masks as the run it continues. The Trainer restores its RNG files at the
start of the resumed epoch, but creating the data loader's iterator then draws from torch's generator again, and
with `ignore_data_skip=True` (which AdLoCo needs) nothing puts it back. So each worker saves its generators with its
own resume state and restores them right before its first inner step after the resume.
"""

import random
from typing import Any

import numpy as np
import torch


__all__ = ["get_rng_state", "set_rng_state"]


def get_rng_state() -> dict[str, Any]:
    """This process's generator states, loadable with `torch.load(weights_only=True)` (NumPy's as a tensor)."""
    kind, keys, position, has_gauss, cached = np.random.get_state()
    state = {
        "python": random.getstate(),
        "numpy": [kind, torch.from_numpy(np.asarray(keys, dtype=np.int64)), position, has_gauss, cached],
        "cpu": torch.random.get_rng_state(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state()  # the current device's: one worker, one device
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Put back what `get_rng_state` returned."""
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    kind, keys, position, has_gauss, cached = state["numpy"]
    np.random.set_state((kind, keys.numpy().astype(np.uint32), int(position), int(has_gauss), float(cached)))
    torch.random.set_rng_state(state["cpu"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])
