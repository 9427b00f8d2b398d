"""Another run's checkpoints and merges in `output_dir`, named in one warning before training.

transformers 5 has no `overwrite_output_dir`: the Trainer trains into a folder that is not empty. A run that starts
afresh (or resumes from a checkpoint of another folder) in an earlier run's `output_dir` rewrites its run files
(`adloco_rounds.jsonl`, `adloco_eval.jsonl`, `adloco_run.png`, `merged/`), but the earlier `checkpoint-N/` and
`merges/outer-N/` it does not reach stay beside its own, and `resume_from_checkpoint=True` later takes the newest
checkpoint whichever run wrote it. Resuming from a checkpoint of `output_dir` continues the run that wrote it: no
warning then.
"""

import os
import re

from ..checkpoint.manifest import checkpoints_newest_first
from ..common.logs import get_logger


__all__ = ["earlier_run_outputs", "warn_about_earlier_run"]

logger = get_logger(__name__)

_MERGE = re.compile(r"^outer-(\d+)$")
_SHOWN = 6  # folders named in the warning; the rest are counted


def earlier_run_outputs(output_dir: str, resume_from_checkpoint: str | bool | None) -> list[str]:
    """The `checkpoint-N` and `merges/outer-N` folders of `output_dir` (relative to it, lowest step first) that belong
    to another run: all of them, unless this run resumes from a checkpoint in `output_dir` (then none).
    `resume_from_checkpoint` is the resolved one (`checkpoint.manifest.resolve_checkpoint`): `True` is left only when
    there is no checkpoint, for the Trainer's own error."""
    if resume_from_checkpoint is True:
        return []
    if isinstance(resume_from_checkpoint, str | os.PathLike):
        parent = os.path.dirname(os.path.abspath(os.fspath(resume_from_checkpoint)))
        if parent == os.path.abspath(output_dir):
            return []
    found = [os.path.basename(path) for path in reversed(checkpoints_newest_first(output_dir))]
    merges = os.path.join(output_dir, "merges")
    if os.path.isdir(merges):
        steps = {
            int(match.group(1)): name
            for name in os.listdir(merges)
            if (match := _MERGE.match(name)) and os.path.isdir(os.path.join(merges, name))
        }
        found += [f"merges/{steps[step]}" for step in sorted(steps)]
    return found


def warn_about_earlier_run(output_dir: str, resume_from_checkpoint: str | bool | None) -> list[str]:
    """Log one warning naming another run's checkpoints and merges in `output_dir` and the fix (call it on global
    rank 0, before training); returns what was found."""
    found = earlier_run_outputs(output_dir, resume_from_checkpoint)
    if not found:
        return found
    named = ", ".join(found[:_SHOWN]) + (f" and {len(found) - _SHOWN} more" if len(found) > _SHOWN else "")
    how = f"resumes from {resume_from_checkpoint}" if resume_from_checkpoint else "starts afresh"
    logger.warning(
        f"output_dir {output_dir} holds another run's checkpoints or merges: {named}. This run {how} and writes "
        "beside them: they stay where it does not write (and train(resume_from_checkpoint=True) takes the newest "
        "checkpoint, whichever run wrote it). Pass a new output_dir or delete them; to continue that run instead, "
        "pass resume_from_checkpoint=True (transformers 5 has no overwrite_output_dir)."
    )
    return found
