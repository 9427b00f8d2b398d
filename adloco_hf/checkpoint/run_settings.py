"""The settings that define a run, recorded in every checkpoint and compared before a resume.

`checkpoint-N/adloco/run.json` holds the AdLoCo settings that decide the run's trajectory (`TRAJECTORY_FIELDS`), the
world size, the largest micro-batch as resolved, the inner optimizer's settings that a resume restores from the
checkpoint (`RESTORED_FIELDS`), and the model's configuration (`config.to_dict()` without `VOLATILE_CONFIG_KEYS`).
A resume that changes a trajectory field or the model's configuration is refused before training with a
`ValueError` naming the field, the checkpoint's value and this run's. A changed restored field is accepted with a
warning: the checkpoint's value goes on. Another world size (`ELASTIC_FIELDS`) is an elastic resume (`checkpoint/elastic.py`),
logged. Every other setting may change (docs/resuming.md).
"""

import json
import os
from dataclasses import dataclass
from typing import Any

from ..common.files import atomic_write_text
from ..common.logs import get_logger
from .folders import RANK_STATE_DIR


__all__ = [
    "ELASTIC_FIELDS",
    "RESTORED_FIELDS",
    "RUN_SETTINGS_NAME",
    "TRAJECTORY_FIELDS",
    "VOLATILE_CONFIG_KEYS",
    "Change",
    "check_run_settings",
    "compare_run_settings",
    "elastic_changes",
    "load_run_settings",
    "model_settings",
    "run_settings",
    "save_run_settings",
]

logger = get_logger(__name__)

RUN_SETTINGS_NAME = "run.json"
RUN_SETTINGS_VERSION = 1

# What the run computes depends on each of these: with another value a resume would not continue the same run.
TRAJECTORY_FIELDS = (
    "inner_steps", "num_instances", "merge_every", "merge_policy", "instance_init", "batch_size_test", "eta", "theta",
    "nu", "max_batch_size", "batch_size_cap", "batch_size_smoothing", "noise_preconditioner", "nonpositive_signal",
    "batch_size_shrink", "shrink_hysteresis", "batch_size_floor", "batch_size_target", "noise_scale_multiple",
    "goodput_hysteresis", "goodput_timing", "merge_batch_rule",
    "inner_steps_rule", "max_inner_steps", "outer_noise_theta",
    "switch_threshold", "pseudo_grad_dtype", "pseudo_grad_compression", "merge_transport", "merge_payload",
    "compression_block_size", "outer_overlap", "outer_overlap_local_weight", "num_fragments", "fragment_sync_delay",
    "fragment_update_alpha", "outer_lr", "outer_momentum",
    "outer_nesterov", "lr_batch_scaling", "per_device_train_batch_size", "seed", "data_seed", "processes_per_worker",
    "worker_parallelism", "worker_batch_split", "split_hysteresis",
)  # fmt: skip
# Recorded and compared, but a change is an elastic resume (logged): each instance keeps its state (`checkpoint/elastic.py`).
ELASTIC_FIELDS = ("world_size",)
# A resume loads the inner optimizer's param groups (optimizer.pt) and the schedule's base rates (scheduler.pt, and
# the workers' own): a new value of these is not applied, the checkpoint's goes on.
RESTORED_FIELDS = ("learning_rate", "weight_decay", "adam_beta1", "adam_beta2", "adam_epsilon")
# Keys of `config.to_dict()` that say how a model was loaded, saved or called, not what it computes in training.
VOLATILE_CONFIG_KEYS = frozenset(
    {
        "transformers_version", "_name_or_path", "_commit_hash", "name_or_path", "architectures", "dtype",
        "torch_dtype", "use_cache", "output_attentions", "output_hidden_states", "return_dict", "problem_type",
        "attn_implementation", "_attn_implementation", "_attn_implementation_autoset", "_attn_implementation_internal",
    }
)  # fmt: skip


def _plain(value: Any) -> Any:
    """JSON's view of a value (tuples become lists, keys strings), so saved and current values compare alike."""
    return json.loads(json.dumps(value, default=str, sort_keys=True))


def model_settings(model) -> dict | None:
    """The model's configuration without volatile keys (None for a model without a `to_dict` config)."""
    config = getattr(model, "config", None)
    if config is None or not hasattr(config, "to_dict"):
        return None
    return _plain({k: v for k, v in config.to_dict().items() if k not in VOLATILE_CONFIG_KEYS})


def run_settings(args, model, *, max_batch_size: int | None = None) -> dict:
    """What defines a run of `args` (an `AdLoCoConfig`) on `model`.

    `max_batch_size` is the resolved largest micro-batch (the worker's); without it an integer `args.max_batch_size`
    is used, and `"auto"` is left out (on resume the checkpoint's resolved value is kept, whatever it is).
    """
    settings = {name: getattr(args, name) for name in TRAJECTORY_FIELDS + RESTORED_FIELDS + ELASTIC_FIELDS}
    # What the script asked for: one worker trains one instance of it (`config/launch.py`), and the same script
    # resumes the run on more workers, or a run merged down to one instance on one worker.
    settings["num_instances"] = getattr(args, "num_instances_asked", args.num_instances)
    if max_batch_size is None:
        max_batch_size = args.max_batch_size if isinstance(args.max_batch_size, int) else None
    if max_batch_size is None:
        del settings["max_batch_size"]
    else:
        settings["max_batch_size"] = int(max_batch_size)
    return {"version": RUN_SETTINGS_VERSION, "settings": _plain(settings), "model": model_settings(model)}


def _path(checkpoint_dir: str) -> str:
    return os.path.join(checkpoint_dir, RANK_STATE_DIR, RUN_SETTINGS_NAME)


def save_run_settings(checkpoint_dir: str, record: dict) -> str:
    """Write `adloco/run.json` into a (staging) checkpoint."""
    path = _path(checkpoint_dir)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    atomic_write_text(path, json.dumps(record, indent=1, sort_keys=True) + "\n")
    return path


def load_run_settings(checkpoint_dir: str) -> dict | None:
    """A checkpoint's `adloco/run.json`, or None when it has none (written before run settings were recorded)."""
    path = _path(checkpoint_dir)
    if not os.path.isfile(path):
        return None
    with open(path, encoding="utf-8") as f:
        return json.load(f)


@dataclass(frozen=True)
class Change:
    """One setting whose value differs between a checkpoint and the run resuming from it."""

    field: str
    old: Any
    new: Any

    def describe(self) -> str:
        return f"{self.field} was {self.old!r} in the checkpoint, is {self.new!r} now"


def compare_run_settings(saved: dict, current: dict) -> tuple[list[Change], list[Change]]:
    """(refused, restored) changes from a checkpoint's record to this run's (both from `run_settings`).

    Only settings present on both sides are compared (an older record may lack some; `max_batch_size="auto"` is
    left out of the current one). Model config keys are compared when both records have a model configuration.
    """
    old, new = saved.get("settings", {}), current.get("settings", {})
    refused, restored = [], []
    for name in TRAJECTORY_FIELDS + RESTORED_FIELDS:
        if name in old and name in new and old[name] != new[name]:
            (restored if name in RESTORED_FIELDS else refused).append(Change(name, old[name], new[name]))
    old_model, new_model = saved.get("model"), current.get("model")
    if old_model is not None and new_model is not None:
        for key in sorted(set(old_model) & set(new_model) - VOLATILE_CONFIG_KEYS):
            if old_model[key] != new_model[key]:
                refused.append(Change(f"model config {key}", old_model[key], new_model[key]))
    return refused, restored


def elastic_changes(saved: dict, current: dict) -> list[Change]:
    """The `ELASTIC_FIELDS` that differ from a checkpoint's record to this run's (an elastic resume)."""
    old, new = saved.get("settings", {}), current.get("settings", {})
    return [
        Change(name, old[name], new[name])
        for name in ELASTIC_FIELDS
        if name in old and name in new and old[name] != new[name]
    ]


def check_run_settings(checkpoint_dir: str, current: dict) -> None:
    """Refuse, before training, a resume from `checkpoint_dir` that changes what defines the run; warn about
    restored settings that will keep the checkpoint's value, and about a checkpoint without a record."""
    saved = load_run_settings(checkpoint_dir)
    if saved is None:
        logger.warning(
            f"{checkpoint_dir} has no {RANK_STATE_DIR}/{RUN_SETTINGS_NAME} (written before AdLoCo recorded a run's "
            "settings): make sure this run's settings and model are the ones it was written with"
        )
        return
    refused, restored = compare_run_settings(saved, current)
    if refused:
        raise ValueError(
            f"Resuming from {checkpoint_dir} with settings that define the run changed: "
            + "; ".join(change.describe() for change in refused)
            + ". Resume with the checkpoint's values, or start a new run from its weights (from_pretrained). The "
            "settings that may change on resume are listed in docs/resuming.md."
        )
    for change in elastic_changes(saved, current):
        logger.warning(
            f"{change.describe()}: an elastic resume, every instance keeps its weights, momentum and request (docs/resuming.md)"
        )
    for change in restored:
        logger.warning(
            f"{change.field}={change.new!r} differs from the checkpoint's {change.old!r}: a resume restores the inner "
            f"optimizer and its schedule from {checkpoint_dir}, so the checkpoint's value goes on (start a new run "
            "from its weights to change it)"
        )
