"""Files AdLoCo writes: merged safetensors checkpoints, per-rank resume state, atomically (cards: `reporting/model_card.py`).

Every folder is written under a temporary name next to its destination and renamed into place, so a process that
dies while saving never leaves a half-written checkpoint where a complete one was expected. Model weights are
written with safetensors (via `save_pretrained`); per-rank state is read back with `torch.load(weights_only=True)`.
"""

import contextlib
import json
import logging
import os
import pickle
import re
import shutil
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import torch
from safetensors import SafetensorError
from transformers.trainer_utils import get_last_checkpoint

from ..common.distributed import WorkerTimeoutError
from ..common.files import atomic_directory, fsync
from ..common.logs import quiet_saves
from ..config.paths import RANK_STATE_DIR


__all__ = [
    "RANK_STATE_DIR",
    "SaveError",
    "check_rank_states",
    "load_rank_state",
    "rank_state_path",
    "remove_stale_staging",
    "resume_hint",
    "save_global_weights",
    "save_model_folder",
    "last_good_checkpoint",
    "save_errors",
    "save_rank_state",
    "state_dict_with",
]

logger = logging.getLogger(__name__)

RANK_STATE_VERSION = 1


# What interrupted saves leave: a checkpoint's staging folder or the copy set aside by `publish_checkpoint`, the
# temporary and set-aside folders of `atomic_directory` (`.merged.tmp-1a2b3c4d`, `merges/.outer-4.old-...`) and the
# temporary files of `atomic_write_text` (`adloco_rounds.jsonl.tmp-1a2b3c4d`).
_LEFTOVER_FOLDER = re.compile(
    r"^\.(?:(?P<tmp>tmp)|old)-(?P<final>checkpoint-\d+)$|^\.(?P<name>.+)\.(?P<kind>tmp|old)-[0-9a-f]{8}$"
)
_LEFTOVER_FILE = re.compile(r"^.+\.tmp-[0-9a-f]{8}$")


def remove_stale_staging(output_dir: str) -> list[str]:
    """Clean what interrupted saves left in `output_dir` and its `merges/` (never complete, never loaded), logged.

    A set-aside copy whose folder is missing (a save killed between its two renames) is the last complete one: it
    is renamed back instead. Call it on one rank, before anything is saved. Returns the paths, relative to
    `output_dir`.
    """
    cleaned = []
    for folder in (output_dir, os.path.join(output_dir, "merges")):
        for name in sorted(os.listdir(folder)) if os.path.isdir(folder) else []:
            shown = os.path.relpath(os.path.join(folder, name), output_dir)
            if _clean_leftover(folder, name, shown):
                cleaned.append(shown)
    return cleaned


def _clean_leftover(folder: str, name: str, shown: str) -> bool:
    path = os.path.join(folder, name)
    found = _LEFTOVER_FOLDER.match(name) if os.path.isdir(path) and not os.path.islink(path) else None
    if found is None:
        if not (_LEFTOVER_FILE.match(name) and os.path.isfile(path)):
            return False
        os.remove(path)
    else:
        final = found["final"] or found["name"]
        set_aside = not (found["tmp"] or found["kind"] == "tmp")
        if set_aside and not os.path.exists(os.path.join(folder, final)):
            os.replace(path, os.path.join(folder, final))
            logger.warning("restored %s from %s, left by an interrupted save", final, shown)
            return True
        shutil.rmtree(path, ignore_errors=True)
    logger.warning("removed %s, left by an interrupted save", shown)
    return True


class SaveError(OSError):
    """A checkpoint, a merge or the merged model could not be written (full disk, I/O or permission error, an object
    that cannot be serialised). The message names the path, the free space there and the last good checkpoint,
    which is kept."""


# What a failed write raises: OSError; torch.save's RuntimeError ("basic_ios::clear: iostream error" or
# "PytorchStreamWriter failed writing file" on a full disk); safetensors' error; a pickling error.
_WRITE_ERRORS = (OSError, RuntimeError, SafetensorError, pickle.PicklingError)


def _free_space(path: str) -> str:
    where = os.path.abspath(path)
    while not os.path.exists(where) and os.path.dirname(where) != where:
        where = os.path.dirname(where)
    try:
        return f"{shutil.disk_usage(where).free / 2**20:,.0f} MiB free on {where}"
    except OSError as error:
        return f"free space on {where} unknown: {error}"


def _last_checkpoint(output_dir: str) -> str | None:
    return get_last_checkpoint(output_dir) if os.path.isdir(output_dir) else None


def last_good_checkpoint(output_dir: str) -> str:
    """Which checkpoint a failed save leaves to resume from, as a sentence."""
    last = _last_checkpoint(output_dir)
    if last is None:
        return "No checkpoint has been saved yet, so there is none to resume from."
    return f"The last good checkpoint ({last}) is kept: resume from it with train(resume_from_checkpoint=True)."


@contextlib.contextmanager
def save_errors(path: str, output_dir: str, report: Callable[[BaseException], None] | None = None) -> Iterator[None]:
    """Around a write of `path`: a failure (see `_WRITE_ERRORS`) is raised as one `SaveError` naming `path`, the
    free space there and the last good checkpoint of `output_dir`; `report` (the worker monitor's) hears it first,
    so the other workers' errors name this worker instead of a lost connection."""
    try:
        yield
    except WorkerTimeoutError:
        raise
    except SaveError as error:
        if report is not None:
            report(error)
        raise
    except _WRITE_ERRORS as error:
        failure = SaveError(
            f"AdLoCo could not write {path}: {type(error).__name__}: {error} ({_free_space(path)}). "
            + last_good_checkpoint(output_dir)
        )
        if report is not None:
            report(failure)
        raise failure from error


def resume_hint(output_dir: str) -> str:
    """What a user can do after a lost worker, from the checkpoints in `output_dir`."""
    last = _last_checkpoint(output_dir)
    if last is None:
        return "No checkpoint has been saved yet; set save_steps to a multiple of inner_steps to be able to resume."
    return f"The last checkpoint ({last}) is intact: resume with train(resume_from_checkpoint=True)."


def state_dict_with(model: torch.nn.Module, named_values: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The model's state dict with some entries replaced (cast to the model's dtype), on the CPU."""
    state = {}
    for name, tensor in model.state_dict().items():
        value = named_values.get(name, tensor)
        state[name] = value.detach().to(device="cpu", dtype=tensor.dtype).contiguous()
    return state


def save_model_folder(
    folder: str,
    model,
    *,
    state_dict: dict[str, torch.Tensor] | None = None,
    processing_class=None,
    card: str | None = None,
    extra_files: dict[str, Any] | None = None,
) -> str:
    """Write a `from_pretrained`-loadable folder atomically: config, `model.safetensors`, tokenizer, card, JSON extras.

    Call it on the writing rank only (`save_pretrained` writes on global rank 0 once a process group exists).
    transformers' line per file, naming the temporary folder, is left out (`common/logs.py`: `quiet_saves`).
    """
    with quiet_saves(), atomic_directory(folder) as tmp:
        model.save_pretrained(tmp, state_dict=state_dict, is_main_process=True)
        if processing_class is not None:
            processing_class.save_pretrained(tmp)
        if card is not None:
            with open(os.path.join(tmp, "README.md"), "w", encoding="utf-8") as f:
                f.write(card)
        for filename, payload in (extra_files or {}).items():
            with open(os.path.join(tmp, filename), "w", encoding="utf-8") as f:
                json.dump(payload, f, indent=2)
                f.write("\n")
    return folder


def save_global_weights(folder: str, model, trainable_values: list[torch.Tensor], **kwargs: Any) -> str:
    """`save_model_folder` with the model's trainable parameters, in order, replaced by `trainable_values`."""
    names = [n for n, p in model.named_parameters() if p.requires_grad]
    return save_model_folder(
        folder, model, state_dict=state_dict_with(model, dict(zip(names, trainable_values))), **kwargs
    )


def rank_state_path(checkpoint_dir: str, rank: int) -> str:
    return os.path.join(checkpoint_dir, RANK_STATE_DIR, f"rank-{rank}.pt")


def save_rank_state(checkpoint_dir: str, rank: int, state: dict[str, Any]) -> str:
    """Write one worker's resume state (tensors and plain values only), atomically."""
    path = rank_state_path(checkpoint_dir, rank)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = f"{path}.tmp-{uuid.uuid4().hex[:8]}"
    torch.save({"version": RANK_STATE_VERSION, **state}, tmp)
    fsync(tmp)
    os.replace(tmp, path)
    return path


def check_rank_states(checkpoint_dir: str, world_size: int) -> int:
    """Refuse, before anything is loaded, a checkpoint that was not written by AdLoCo or lacks a worker's state;
    return how many workers wrote it (another number than `world_size` is an elastic resume, `checkpoint/elastic.py`)."""
    state_dir = os.path.join(checkpoint_dir, RANK_STATE_DIR)
    if not os.path.isdir(state_dir):
        raise ValueError(
            f"{checkpoint_dir} has no {RANK_STATE_DIR}/ folder: it was not written by AdLoCoTrainer "
            "(or was saved with save_only_model=True); start a new run from its weights instead"
        )
    saved = sorted(f for f in os.listdir(state_dir) if f.startswith("rank-") and f.endswith(".pt"))
    written = _written_world_size(state_dir, saved)
    missing = [f"{RANK_STATE_DIR}/rank-{rank}.pt" for rank in range(written) if f"rank-{rank}.pt" not in saved]
    if missing:
        raise ValueError(
            f"{checkpoint_dir} was written by {written} workers but {', '.join(missing)} is missing: every worker's "
            "state is needed, this checkpoint cannot be resumed; resume from an earlier one"
        )
    return written


def _written_world_size(state_dir: str, saved: list[str]) -> int:
    """How many workers wrote a checkpoint: rank 0's record of it, else the highest rank file's number + 1."""
    guess = max((int(name[5:-3]) for name in saved if name[5:-3].isdigit()), default=-1) + 1
    try:
        state = torch.load(os.path.join(state_dir, "rank-0.pt"), map_location="cpu", weights_only=True, mmap=True)
        return int(state.get("world_size", guess))
    except Exception:  # noqa: BLE001 - missing or unreadable: the file names tell
        return guess


def load_rank_state(checkpoint_dir: str, rank: int) -> dict[str, Any]:
    path = rank_state_path(checkpoint_dir, rank)
    if not os.path.isfile(path):
        raise FileNotFoundError(
            f"{path} is missing: {checkpoint_dir} was not written by AdLoCoTrainer with this many processes "
            "(each worker needs its own state file)"
        )
    state = torch.load(path, map_location="cpu", weights_only=True)
    if state.get("version") != RANK_STATE_VERSION:
        raise ValueError(f"{path} has state version {state.get('version')}, expected {RANK_STATE_VERSION}")
    return state
