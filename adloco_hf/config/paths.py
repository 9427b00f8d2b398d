"""The run's folders as the config names them, checked when the config is built: before any data is read.

`output_dir` that is a file (or lies inside one, or where nothing may be written) failed in the Trainer with a bare
`FileExistsError`, after the corpus was tokenised; `resume_from_checkpoint` naming a file was diagnosed as a folder
"not written by AdLoCoTrainer", and as a config field it was read by nothing (the Trainer leaves it to scripts;
`AdLoCoTrainer.train()` now resumes from it). Each is refused here, naming the field, what is there and the fix.

The checks read names and kinds of files only, never their content (`checkpoint/manifest.py` verifies a checkpoint's
files when training resumes): the same on every worker of a shared file system, and cheap.
"""

import os
import re


__all__ = [
    "CHECKPOINT_NAME",
    "RANK_STATE_DIR",
    "RESUME_NEWEST",
    "check_checkpoint_path",
    "check_output_dir",
    "check_paths",
    "check_resume_from_checkpoint",
    "checkpoints_newest_first",
]

# Every worker's resume state in a checkpoint: `checkpoint-N/adloco/` (`checkpoint/folders.py` writes it).
RANK_STATE_DIR = "adloco"
CHECKPOINT_NAME = re.compile(r"^checkpoint-(\d+)$")
# The words of `resume_from_checkpoint` that mean "the newest checkpoint of output_dir" (the recipes' `last`).
RESUME_NEWEST = ("last", "true")
_AUTO = "auto"


def checkpoints_newest_first(output_dir: str) -> list[str]:
    """The `checkpoint-N` folders of `output_dir`, highest step first (the Trainer's `get_last_checkpoint` order)."""
    if not os.path.isdir(output_dir):
        return []
    steps = {
        int(match.group(1)): name
        for name in os.listdir(output_dir)
        if (match := CHECKPOINT_NAME.match(name)) and os.path.isdir(os.path.join(output_dir, name))
    }
    return [os.path.join(output_dir, steps[step]) for step in sorted(steps, reverse=True)]


def _checkpoint_names(folder: str) -> str:
    return ", ".join(os.path.basename(path) for path in reversed(checkpoints_newest_first(folder)))


def check_checkpoint_path(checkpoint: str | os.PathLike, output_dir: str) -> None:
    """Refuse a checkpoint path that does not exist, is a file, is a run's output_dir rather than one of its
    checkpoints, or is a folder without AdLoCo's `adloco/` state, naming the checkpoints that do exist (in
    `output_dir`, and beside the path). Cheap: no file is read, so the config checks it before any data is read;
    `AdLoCoTrainer.train` checks it again."""
    path = os.fspath(checkpoint)
    if os.path.isfile(path):
        names = _checkpoint_names(os.path.dirname(os.path.abspath(path))) or _checkpoint_names(output_dir)
        there = f" (checkpoints there: {names})" if names else ""
        raise ValueError(
            f"resume_from_checkpoint={path!r} is a file, not a checkpoint folder: pass a checkpoint-N folder that "
            f"AdLoCoTrainer wrote{there}, or resume_from_checkpoint=True for the newest of output_dir."
        )
    if os.path.isdir(path) and not os.path.isdir(os.path.join(path, RANK_STATE_DIR)):
        if _checkpoint_names(path):
            raise ValueError(
                f"resume_from_checkpoint={path!r} is a run's output_dir, not a checkpoint: pass one of its checkpoints "
                f"({_checkpoint_names(path)}), or resume_from_checkpoint=True for the newest (with output_dir={path!r})."
            )
        raise ValueError(
            f"resume_from_checkpoint={path!r} has no {RANK_STATE_DIR}/ folder: it was not written by AdLoCoTrainer (or "
            "was saved with save_only_model=True). Pass a checkpoint-N folder of an AdLoCo run, or start a new run "
            "from these weights (from_pretrained on the folder)."
        )
    if os.path.exists(path):
        return
    found = []
    for folder in dict.fromkeys([output_dir, os.path.dirname(os.path.abspath(path))]):
        if names := _checkpoint_names(folder):
            found.append(f"{folder}: {names}")
    there = (
        f"Checkpoints that exist: {'; '.join(found)} (resume_from_checkpoint=True takes the newest of output_dir)."
        if found
        else f"No checkpoint-* folder exists in {output_dir} (save_steps writes them): train without "
        "resume_from_checkpoint to start a new run."
    )
    raise FileNotFoundError(f"resume_from_checkpoint={path!r} does not exist. {there}")


def check_output_dir(output_dir: str) -> None:
    """Refuse an `output_dir` that is a file, lies inside a file, or where this process may not write."""
    path = os.path.abspath(output_dir)
    if os.path.isfile(path):
        raise ValueError(
            f"output_dir={output_dir!r} is a file: the run writes a folder there (checkpoints, merged/, "
            "adloco_rounds.jsonl). Pass the path of a folder (a new one, or an earlier run's), or move the file."
        )
    parent = path
    while not os.path.exists(parent):
        parent = os.path.dirname(parent)
    if not os.path.isdir(parent):
        raise ValueError(
            f"output_dir={output_dir!r} lies inside {parent}, which is a file: no folder can be made there. Pass the "
            "path of a folder."
        )
    if not os.access(parent, os.W_OK | os.X_OK):
        what = "output_dir" if parent == path else f"{parent}, where output_dir={output_dir!r} would be made,"
        raise PermissionError(
            f"{what} is not writable by this user: the run could not save anything. Pass an output_dir you may "
            "write to (or change the folder's permissions)."
        )


def check_resume_from_checkpoint(value, output_dir: str) -> None:
    """The config field `resume_from_checkpoint`: a checkpoint folder (checked as `check_checkpoint_path` does),
    `"last"` / `"true"` (the newest checkpoint of `output_dir`, which must have one) or `"auto"` (the newest, or a
    new run when there is none)."""
    if value is None or value is False:
        return
    if value is True or (isinstance(value, str) and value.lower() in RESUME_NEWEST):
        if not checkpoints_newest_first(output_dir):
            raise ValueError(
                f"resume_from_checkpoint={value!r} resumes the newest checkpoint of output_dir={output_dir!r}, which "
                "has no checkpoint-* folder: train without resume_from_checkpoint to start the run, or set "
                "resume_from_checkpoint='auto' to resume when there is a checkpoint and start afresh when there is none."
            )
        return
    if isinstance(value, str) and value.lower() == _AUTO:
        return
    check_checkpoint_path(value, output_dir)


def check_paths(config) -> None:
    """`output_dir` and `resume_from_checkpoint` of a config (module docstring)."""
    check_output_dir(config.output_dir)
    check_resume_from_checkpoint(config.resume_from_checkpoint, config.output_dir)
