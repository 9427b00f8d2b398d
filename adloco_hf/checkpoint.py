"""Files AdLoCo writes: merged safetensors checkpoints, per-rank resume state, atomically (cards: `model_card.py`).

Every folder is written under a temporary name next to its destination and renamed into place, so a process that
dies while saving never leaves a half-written checkpoint where a complete one was expected. Model weights are
written with safetensors (via `save_pretrained`); per-rank state is read back with `torch.load(weights_only=True)`.
"""

import contextlib
import json
import logging
import os
import shutil
import uuid
from collections.abc import Iterator
from typing import Any

import torch
from transformers.trainer_utils import get_last_checkpoint


__all__ = [
    "RANK_STATE_DIR",
    "check_rank_states",
    "atomic_directory",
    "atomic_write_text",
    "load_rank_state",
    "publish_files",
    "publish_checkpoint",
    "rank_state_path",
    "remove_stale_staging",
    "replace_directory",
    "resume_hint",
    "save_global_weights",
    "save_model_folder",
    "save_rank_state",
    "state_dict_with",
]

logger = logging.getLogger(__name__)

RANK_STATE_DIR = "adloco"
RANK_STATE_VERSION = 1


@contextlib.contextmanager
def atomic_directory(final_dir: str) -> Iterator[str]:
    """Yield a temporary directory beside `final_dir`; on success it replaces `final_dir` in one rename.

    An existing `final_dir` is first renamed aside and removed only after the new one is in place. On error the
    temporary directory is removed and `final_dir` is left as it was.
    """
    final_dir = os.path.abspath(final_dir)
    parent, name = os.path.split(final_dir)
    os.makedirs(parent, exist_ok=True)
    tmp = os.path.join(parent, f".{name}.tmp-{uuid.uuid4().hex[:8]}")
    os.makedirs(tmp)
    try:
        yield tmp
        _fsync_tree(tmp)
        old = None
        if os.path.exists(final_dir):
            old = os.path.join(parent, f".{name}.old-{uuid.uuid4().hex[:8]}")
            os.replace(final_dir, old)
        os.replace(tmp, final_dir)
        _fsync_dir(parent)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _fsync_dir(path: str) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _fsync_tree(root: str) -> None:
    for dirpath, _, filenames in os.walk(root):
        for filename in filenames:
            with contextlib.suppress(OSError), open(os.path.join(dirpath, filename), "rb") as f:
                os.fsync(f.fileno())
        _fsync_dir(dirpath)


def atomic_write_text(path: str, text: str) -> None:
    tmp = f"{path}.tmp-{uuid.uuid4().hex[:8]}"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def remove_stale_staging(output_dir: str) -> list[str]:
    """Remove staging folders of checkpoint saves that were interrupted (never complete, never loaded)."""
    removed = []
    if not os.path.isdir(output_dir):
        return removed
    for name in os.listdir(output_dir):
        if name.startswith((".tmp-checkpoint-", ".old-checkpoint-")):
            shutil.rmtree(os.path.join(output_dir, name), ignore_errors=True)
            logger.warning("removed %s, left by an interrupted checkpoint save", name)
            removed.append(name)
    return removed


def resume_hint(output_dir: str) -> str:
    """What a user can do after a lost worker, from the checkpoints in `output_dir`."""
    last = get_last_checkpoint(output_dir) if os.path.isdir(output_dir) else None
    if last is None:
        return "No checkpoint has been saved yet; set save_steps to a multiple of inner_steps to be able to resume."
    return f"The last checkpoint ({last}) is intact: resume with train(resume_from_checkpoint=True)."


def publish_checkpoint(staging: str, final_dir: str) -> None:
    """Rename a complete staging folder to `final_dir`; an existing one is set aside first and removed after."""
    aside = None
    if os.path.exists(final_dir):
        parent, name = os.path.split(os.path.abspath(final_dir))
        aside = os.path.join(parent, f".old-{name}")
        shutil.rmtree(aside, ignore_errors=True)
        os.replace(final_dir, aside)
    os.replace(staging, final_dir)
    if aside is not None:
        shutil.rmtree(aside, ignore_errors=True)


def replace_directory(tmp: str, path: str) -> None:
    """Move a finished directory into place; if another process got there first, keep theirs (same content)."""
    try:
        os.replace(tmp, path)
    except OSError:
        if not os.path.isdir(path):
            raise


def publish_files(tmp: str, target: str, *, last: str) -> None:
    """Move the files of `tmp` into `target` one by one (each `os.replace` is atomic), `last` at the end.

    `last` is the marker a reader checks: it is removed first, so a reader never pairs old files with a new marker.
    """
    with contextlib.suppress(FileNotFoundError):
        os.remove(os.path.join(target, last))
    for name in sorted(os.listdir(tmp), key=lambda name: name == last):
        os.replace(os.path.join(tmp, name), os.path.join(target, name))


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
    """
    with atomic_directory(folder) as tmp:
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
    with open(tmp, "rb") as f:
        os.fsync(f.fileno())
    os.replace(tmp, path)
    return path


def check_rank_states(checkpoint_dir: str, world_size: int) -> None:
    """Refuse, before anything is loaded, a checkpoint that was not written by AdLoCo with `world_size` workers."""
    state_dir = os.path.join(checkpoint_dir, RANK_STATE_DIR)
    if not os.path.isdir(state_dir):
        raise ValueError(
            f"{checkpoint_dir} has no {RANK_STATE_DIR}/ folder: it was not written by AdLoCoTrainer "
            "(or was saved with save_only_model=True); start a new run from its weights instead"
        )
    saved = sorted(f for f in os.listdir(state_dir) if f.startswith("rank-") and f.endswith(".pt"))
    if len(saved) != world_size:
        raise ValueError(
            f"{checkpoint_dir} was written by {len(saved)} workers but this run has {world_size}; resume with "
            f"{len(saved)} processes (per-worker optimizer, data and instance state cannot be split or joined)"
        )


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
