"""Where startup profiles are kept between runs, so that a second run on the same hardware neither pays for nor
re-measures its profile (and so takes the same decisions as the first: `batch/startup_profile.py`).

A profile is a file `{cache}/device_profiles/{digest}.json` holding its key and its numbers; the key is what the
measurement depends on: the model's configuration, the device, the precision, the sequence length, compilation, the
workers and their processes, the pseudo-gradient's payload, the sizes timed, the backend and the machines. The folder
is `$ADLOCO_HF_CACHE`, else `$XDG_CACHE_HOME/adloco_hf`, else `~/.cache/adloco_hf`; delete a file to measure again.
Only global rank 0 reads and writes it (the others take its numbers), atomically.
"""

import hashlib
import json
import os

from ..common.files import atomic_write_text
from ..common.logs import get_logger
from .startup_profile import StartupProfile


__all__ = ["cache_folder", "load_profile", "profile_key", "save_profile"]

logger = get_logger(__name__)


def cache_folder() -> str:
    """The library's cache folder (module docstring)."""
    explicit = os.environ.get("ADLOCO_HF_CACHE")
    if explicit:
        return os.path.abspath(os.path.expanduser(explicit))
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "adloco_hf")


def profile_key(
    *,
    model_config: str,
    device: str,
    precision: str,
    sequence_length: int,
    compiled: bool,
    workers: int,
    processes_per_worker: int,
    payload_bytes: int,
    sizes: tuple[int, ...],
    backend: str,
    hosts: list[str],
) -> dict:
    """What a profile depends on, as a JSON-able dict (the model's configuration as its digest)."""
    return {
        "model": hashlib.sha256(model_config.encode()).hexdigest()[:16],
        "device": device,
        "precision": precision,
        "sequence_length": int(sequence_length),
        "compiled": bool(compiled),
        "workers": int(workers),
        "processes_per_worker": int(processes_per_worker),
        "payload_bytes": int(payload_bytes),
        "sizes": [int(s) for s in sizes],
        "backend": backend,
        "hosts": sorted(set(hosts)),
    }


def _path(key: dict, folder: str | None) -> str:
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:20]
    return os.path.join(folder or cache_folder(), "device_profiles", f"{digest}.json")


def load_profile(key: dict, folder: str | None = None) -> StartupProfile | None:
    """The cached profile of `key`, or None (none kept, or a file that does not hold this key or does not parse)."""
    path = _path(key, folder)
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
        if data.get("key") != key:
            return None
        return StartupProfile.from_json(data["profile"]).with_origin(source=path)
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError) as error:
        logger.warning(f"ignoring the unreadable startup profile {path} ({error}); measuring again")
        return None


def save_profile(profile: StartupProfile, key: dict, folder: str | None = None) -> str | None:
    """Keep `profile` under `key`; returns its path, or None when the folder cannot be written (a warning: the run
    goes on, the next one measures again)."""
    path = _path(key, folder)
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        atomic_write_text(path, json.dumps({"key": key, "profile": profile.to_json()}, indent=1, sort_keys=True))
    except OSError as error:
        logger.warning(f"could not keep the startup profile in {path} ({error}); the next run measures it again")
        return None
    return path
