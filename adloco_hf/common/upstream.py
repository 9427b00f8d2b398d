"""The private members of the libraries AdLoCo builds on that it needs, each behind one shim naming why.

Nothing else in the package reads a private member of another module (`tests/test_classes.py` checks it): a release
that renames one of these breaks only its shim, and this page lists what to check when a pinned release moves
(`common/versions.py` holds the supported ones). Each shim says the release it was checked against. The module imports no library at import time (the command line
reads its argparse shims; `adloco-hf --help` imports neither torch nor transformers).
"""

import argparse
import os
from typing import TYPE_CHECKING, Any


if TYPE_CHECKING:
    import torch


__all__ = [
    "default_store",
    "exit_now",
    "fingerprint",
    "foreach_norms",
    "mark_prepared",
    "move_option",
    "optional_actions",
    "parser_actions",
    "restart_tqdm_rate",
    "set_scheduler_last_lr",
    "tokenizer_encodes_in_its_backend",
    "trainer_collator_with_removed_columns",
    "trainer_memory_tracker",
    "trainer_num_items_in_batch",
    "trainer_output_dir",
    "trainer_remove_unused_columns",
    "trainer_save_optimizer_and_scheduler",
    "trainer_save_rng_state",
    "trainer_save_scaler",
]


# ---- torch ----
def default_store():
    """The default process group's store (torchrun's or accelerate's rendezvous store), or None without one:
    `torch.distributed.distributed_c10d._get_default_store`, private but stable since torch 1.x (checked with 2.13).
    The worker monitor, the collective check and preemption post their keys there, so that a worker's state is seen
    without a collective."""
    import torch.distributed as dist

    try:
        return dist.distributed_c10d._get_default_store()
    except Exception:  # pragma: no cover - no default store: callers fall back on collectives
        return None


def set_scheduler_last_lr(scheduler, lrs: list[float]) -> None:
    """Set what `scheduler.get_last_lr()` returns (`LRScheduler._last_lr`, torch 2.13): the learning rates last set on
    the optimizer. `lr_batch_scaling` sets new ones between two `scheduler.step()` calls, and the Trainer logs (and
    `get_last_lr` reports) this list, not the optimizer's; torch has no public setter, and a `step()` would advance the
    schedule."""
    scheduler._last_lr = lrs


def foreach_norms(tensors: "list[torch.Tensor]") -> "list[torch.Tensor]":
    """The 2-norm of each tensor in one fused call (`torch._foreach_norm`, what `clip_grad_norm_` uses; torch 2.13):
    the gradient statistics read hundreds of parameters' norms every statistics step."""
    import torch

    return list(torch._foreach_norm(tensors, 2))


# ---- Python ----
def exit_now(code: int) -> None:
    """End the process at once: `os._exit`, public in Python's documentation despite its name. For a watchdog whose
    process has a thread stuck in a call that never returns (`common/job_store.py`): `sys.exit` would run the exit
    handlers, which wait for that thread or make the same call."""
    os._exit(code)


# ---- argparse (the recipes' `--help` sections) ----
def parser_actions(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    """Every action of `parser` (`ArgumentParser._actions`: argparse has no public list; Python 3.10-3.13)."""
    return list(parser._actions)


def optional_actions(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    """The actions of the parser's default "options" group (`parser._optionals._group_actions`)."""
    return list(parser._optionals._group_actions)


def move_option(parser: argparse.ArgumentParser, action: argparse.Action, group) -> None:
    """Show `action` under `group` in `--help` instead of the default group (parsing is unchanged): argparse only
    lets an option be added to a group, never moved, and `HfArgumentParser` adds every field to the default one."""
    parser._optionals._group_actions.remove(action)
    group._group_actions.append(action)


# ---- tqdm ----
def restart_tqdm_rate(bar, step: int, ema) -> None:
    """Make a tqdm bar estimate its speed from the steps after `step` only: its smoothed speed (exponential averages
    `_ema_dn`, `_ema_dt`, `_ema_miniters`) and its last refresh restart there (tqdm 4.x bookkeeping; `ema` is
    `tqdm.std.EMA`). A bar without them (disabled, or a notebook's) is left alone."""
    if getattr(bar, "disable", True) or not all(hasattr(bar, a) for a in ("_ema_dn", "_ema_dt", "_time")):
        return
    bar._ema_dn, bar._ema_dt, bar._ema_miniters = ema(bar.smoothing), ema(bar.smoothing), ema(bar.smoothing)
    bar.last_print_n = step
    bar.last_print_t = bar._time()
    if bar.dynamic_miniters:
        bar.miniters = 0


# ---- datasets ----
def fingerprint(dataset) -> str:
    """A `datasets.Dataset`'s fingerprint (`Dataset._fingerprint`, datasets 4.x): the hash of its content and the
    transforms that made it, which our caches of tokenised and packed data extend."""
    return dataset._fingerprint


# ---- transformers' tokenizers (checked with 5.23) ----
def tokenizer_encodes_in_its_backend(tokenizer) -> bool:
    """Whether `tokenizer(texts)` is its Rust backend's `encode_batch` and nothing else: a fast tokenizer whose class
    keeps the base `_encode_plus` (transformers 5.23: it sets the truncation, padding and `encode_special_tokens`
    state, then calls the backend). The packing of a corpus (`data/tokenizer.py`: `document_token_ids`) then calls
    the backend itself, without the character offsets it would compute."""
    from transformers import PreTrainedTokenizerFast

    return isinstance(tokenizer, PreTrainedTokenizerFast) and (
        type(tokenizer)._encode_plus is PreTrainedTokenizerFast._encode_plus
    )


# ---- transformers' Trainer (checked with 5.17 and 5.23) and accelerate (1.15) ----
def trainer_num_items_in_batch(trainer, inputs: dict, device: "torch.device"):
    """The items (label tokens that count) `trainer.prediction_step` divides the loss of `inputs` by: a tensor on
    `device`, or None when the loss is a plain mean. `Trainer._get_num_items_in_batch([inputs], device)` is the count
    `prediction_step` itself uses (and subclasses override): an evaluation that multiplies the loss back into a sum,
    or a statistics step that weighs its halves, must use the same one. The public `get_batch_samples` calls it too,
    but is overridden by subclasses that change their training batches."""
    return trainer._get_num_items_in_batch([inputs], device)


def trainer_memory_tracker(trainer):
    """The Trainer's `TrainerMemoryTracker` (`Trainer._memory_tracker`), whose public `start()` and
    `stop_and_update_metrics(metrics)` add the memory metrics of `skip_memory_metrics=False` to an evaluation, as
    `Trainer.evaluate` does."""
    return trainer._memory_tracker


def trainer_remove_unused_columns(trainer, dataset, description: str):
    """`Trainer._remove_unused_columns`: the columns the model's forward does not take, dropped as the Trainer's own
    loaders drop them (`remove_unused_columns`)."""
    return trainer._remove_unused_columns(dataset, description=description)


def trainer_collator_with_removed_columns(trainer, collator, description: str):
    """`Trainer._get_collator_with_removed_columns`: the same for data that is not a `datasets.Dataset` (a stream),
    done by the collator."""
    return trainer._get_collator_with_removed_columns(collator, description=description)


def trainer_output_dir(trainer, trial) -> str:
    """`Trainer._get_output_dir(trial)`: where a checkpoint of this run (or hyperparameter-search trial) goes."""
    return trainer._get_output_dir(trial=trial)


def trainer_save_optimizer_and_scheduler(trainer, folder: str) -> None:
    """`Trainer._save_optimizer_and_scheduler`: the Trainer's optimizer and scheduler files of a checkpoint (ours
    with `worker_parallelism="fsdp"`, `AdLoCoTrainer`), written into a staged checkpoint folder."""
    trainer._save_optimizer_and_scheduler(folder)


def trainer_save_scaler(trainer, folder: str) -> None:
    """`Trainer._save_scaler`: fp16's gradient scaler file of a checkpoint."""
    trainer._save_scaler(folder)


def trainer_save_rng_state(trainer, folder: str) -> None:
    """`Trainer._save_rng_state`: the random states of a checkpoint (`rng_state_R.pth`), which `train()` restores."""
    trainer._save_rng_state(folder)


def mark_prepared(model: Any) -> None:
    """Mark a model that AdLoCo wrapped itself (DDP over one worker's processes) as accelerate's own
    (`model._is_accelerate_prepared`, read by `Accelerator.prepare`): accelerate then prepares only the optimizer,
    and `unwrap_model` still finds the model."""
    model._is_accelerate_prepared = True
