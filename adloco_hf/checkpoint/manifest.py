"""A checkpoint's manifest: every file's size and CRC-32, written last into the checkpoint, checked before a resume.

`checkpoint-N/adloco/manifest.json` lists every other file of the checkpoint (the Trainer's and AdLoCo's). It is the
last file written into the staging folder before the folder is renamed into place, so a checkpoint that has one was
complete when it was published. Before a resume every file it lists must be there, with its size and checksum: a
missing, truncated or altered file is named in a [`CheckpointDamagedError`]. A checkpoint without a manifest (written
before manifests existed) still loads, with a warning that it cannot be verified.

Each worker sums the files it wrote itself (its `rank-R.pt`, the largest) while the others do the same; the first
worker sums the rest and writes the manifest. CRC-32 (zlib) catches truncation and damage, not tampering; it costs
about 50 ms per 100 MB here (SHA-256: about 170 ms).

The checks that read no file (a checkpoint path that is missing, a file, or a run's folder; the checkpoints of a
folder) are `config/paths.py`'s, run when the config is built, before any data; re-exported here.
"""

import json
import os
import zlib

from ..common.files import atomic_write_text
from ..common.logs import get_logger
from ..config.paths import RESUME_NEWEST, check_checkpoint_path, checkpoints_newest_first
from .folders import RANK_STATE_DIR


__all__ = [
    "MANIFEST_NAME",
    "CheckpointDamagedError",
    "check_checkpoint_path",
    "checkpoints_newest_first",
    "file_crc32",
    "newest_intact_checkpoint",
    "record_own_files",
    "resolve_checkpoint",
    "verify_checkpoint",
    "write_manifest",
]

logger = get_logger(__name__)

MANIFEST_NAME = "manifest.json"
MANIFEST_VERSION = 1
_SUMS_PREFIX = "sums-rank-"
_CHUNK = 4 * 1024 * 1024


class CheckpointDamagedError(ValueError):
    """A checkpoint file is missing, truncated or altered since it was written (the message names it)."""


def file_crc32(path: str) -> str:
    """The CRC-32 of a file's bytes, as 8 hex digits."""
    crc = 0
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            crc = zlib.crc32(chunk, crc)
    return f"{crc:08x}"


def _entry(path: str) -> dict:
    return {"size": os.path.getsize(path), "crc32": file_crc32(path)}


def _manifest_path(checkpoint_dir: str) -> str:
    return os.path.join(checkpoint_dir, RANK_STATE_DIR, MANIFEST_NAME)


def _relative(path: str, root: str) -> str:
    return os.path.relpath(path, root).replace(os.sep, "/")


def record_own_files(checkpoint_dir: str, rank: int, paths: list[str]) -> None:
    """Sum the files this worker wrote into a staging checkpoint, for the manifest (every worker, in parallel)."""
    sums = {_relative(path, checkpoint_dir): _entry(path) for path in paths if os.path.isfile(path)}
    atomic_write_text(
        os.path.join(checkpoint_dir, RANK_STATE_DIR, f"{_SUMS_PREFIX}{rank}.json"), json.dumps(sums, sort_keys=True)
    )


def write_manifest(checkpoint_dir: str) -> dict:
    """Write `adloco/manifest.json` for a complete staging checkpoint (one process, once every worker has written).

    The workers' own sums (`record_own_files`) are used where a file's size still matches; every other file is summed
    here. Returns the manifest.
    """
    state_dir = os.path.join(checkpoint_dir, RANK_STATE_DIR)
    os.makedirs(state_dir, exist_ok=True)
    known: dict[str, dict] = {}
    for name in sorted(os.listdir(state_dir)):
        if name.startswith(_SUMS_PREFIX):
            with open(os.path.join(state_dir, name), encoding="utf-8") as f:
                known.update(json.load(f))
            os.remove(os.path.join(state_dir, name))
    files = {}
    for dirpath, _, filenames in os.walk(checkpoint_dir):
        for filename in filenames:
            path = os.path.join(dirpath, filename)
            relative = _relative(path, checkpoint_dir)
            if relative == f"{RANK_STATE_DIR}/{MANIFEST_NAME}":
                continue
            entry = known.get(relative)
            files[relative] = entry if entry and entry["size"] == os.path.getsize(path) else _entry(path)
    manifest = {"version": MANIFEST_VERSION, "checksum": "crc32", "files": dict(sorted(files.items()))}
    atomic_write_text(_manifest_path(checkpoint_dir), json.dumps(manifest, indent=1) + "\n")
    return manifest


def verify_checkpoint(checkpoint_dir: str) -> bool:
    """Check every file the checkpoint's manifest lists: there, of its size, with its checksum.

    Returns True when verified, False (with a warning) for a checkpoint without a manifest. Raises
    `CheckpointDamagedError` naming every missing or truncated file (sizes are checked first), else the first file
    whose checksum differs.
    """
    path = _manifest_path(checkpoint_dir)
    if not os.path.isfile(path):
        logger.warning(
            f"{checkpoint_dir} has no {RANK_STATE_DIR}/{MANIFEST_NAME} (written before AdLoCo checkpoints had one): "
            "its files cannot be verified before resuming"
        )
        return False
    advice = "This checkpoint cannot be resumed; resume from an earlier one (resume_from_checkpoint=True skips it)."
    try:
        with open(path, encoding="utf-8") as f:
            files = json.load(f)["files"]
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise CheckpointDamagedError(f"{path} is unreadable ({error}). {advice}") from error
    problems = []
    for relative, entry in files.items():
        file = os.path.join(checkpoint_dir, *relative.split("/"))
        if not os.path.isfile(file):
            problems.append(f"{file} is missing (it was written with {entry['size']} bytes)")
        elif os.path.getsize(file) != entry["size"]:
            problems.append(
                f"{file} has {os.path.getsize(file)} bytes but {entry['size']} were written (truncated or overwritten)"
            )
    if problems:
        raise CheckpointDamagedError("; ".join(problems) + f". {advice}")
    for relative, entry in files.items():
        file = os.path.join(checkpoint_dir, *relative.split("/"))
        crc = file_crc32(file)
        if crc != entry["crc32"]:
            raise CheckpointDamagedError(
                f"{file} was altered after it was written (CRC-32 {crc}, written as {entry['crc32']}). {advice}"
            )
    return True


def newest_intact_checkpoint(output_dir: str) -> str | None:
    """The newest checkpoint of `output_dir` that passes `verify_checkpoint`; damaged newer ones are skipped with a
    warning naming them. None when there is no checkpoint; `CheckpointDamagedError` when none is intact."""
    checkpoints = checkpoints_newest_first(output_dir)
    skipped = []
    for checkpoint in checkpoints:
        try:
            verify_checkpoint(checkpoint)
        except CheckpointDamagedError as error:
            logger.warning(f"resume_from_checkpoint: skipped {checkpoint}, it is damaged: {error}")
            skipped.append(checkpoint)
            continue
        if skipped:
            logger.warning(f"resume_from_checkpoint: resuming from {checkpoint}, the newest intact checkpoint")
        return checkpoint
    if skipped:
        raise CheckpointDamagedError(
            f"no intact checkpoint in {output_dir}: {', '.join(skipped)} are damaged (see the warnings above); start a "
            "new run"
        )
    return None


def resolve_checkpoint(resume_from_checkpoint, output_dir: str):
    """What `Trainer.train(resume_from_checkpoint=...)` should load, verified first: `True` becomes the newest intact
    checkpoint of `output_dir` (stays True when there is none, for the Trainer's own error), and so do `"last"` and
    `"true"`; `"auto"` the same, or
    None (a fresh start) when there is none, for scripts that run again after a restart; a folder is verified."""
    if isinstance(resume_from_checkpoint, str) and resume_from_checkpoint.lower() in RESUME_NEWEST:
        resume_from_checkpoint = True  # the recipes' `last`, also as the config field
    if isinstance(resume_from_checkpoint, str) and resume_from_checkpoint.lower() == "auto":
        checkpoint = newest_intact_checkpoint(output_dir)
        logger.info(
            f"resume_from_checkpoint='auto': resuming from {checkpoint}"
            if checkpoint
            else f"resume_from_checkpoint='auto': no checkpoint in {output_dir}, a fresh start"
        )
        return checkpoint
    if resume_from_checkpoint is True:
        return newest_intact_checkpoint(output_dir) or True
    if isinstance(resume_from_checkpoint, str | os.PathLike):
        check_checkpoint_path(resume_from_checkpoint, output_dir)
        verify_checkpoint(os.fspath(resume_from_checkpoint))
    return resume_from_checkpoint
