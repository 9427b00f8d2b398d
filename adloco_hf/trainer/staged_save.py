"""The checkpoint save of `AdLoCoTrainer`: every worker's state, staged, verified, and renamed into place at once.

A checkpoint folder is written under `.tmp-checkpoint-N` by every worker (the Trainer's files from rank 0, each
worker's `adloco/rank-R.pt`), then `adloco/run.json`, then `adloco/manifest.json` last, and renamed into place in one
move once every worker has written: a process killed while saving never leaves a half-written `checkpoint-N`. Every
wait is bounded by `worker_timeout` and names a missing worker; a failed write (a full disk) is one clear error.
"""

import os
import shutil

from transformers import Trainer
from transformers.trainer_callback import ExportableState
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR, rotate_checkpoints

from ..checkpoint.folders import save_errors, save_rank_state
from ..checkpoint.manifest import record_own_files, write_manifest
from ..checkpoint.run_settings import run_settings, save_run_settings
from ..common.files import publish_checkpoint
from ..common.logs import get_logger, quiet_saves
from ..common.upstream import (
    trainer_output_dir,
    trainer_save_optimizer_and_scheduler,
    trainer_save_rng_state,
    trainer_save_scaler,
)
from ..worker.checkpoint_view import CheckpointView


__all__ = ["save_staged_checkpoint"]

logger = get_logger(__name__)

TRAINER_STATE_NAME = "trainer_state.json"


def save_staged_checkpoint(trainer: Trainer, worker: CheckpointView, trial=None) -> None:
    """Maintenance note: follows `Trainer._save_checkpoint` (5.23) but writes into a staging folder renamed into
    place once every worker has written, and adds `checkpoint-N/adloco/rank-R.pt` (inner optimizer, sampler,
    scaler, instance state) for each worker, since the Trainer saves rank 0's optimizer only; then `adloco/run.json`
    (the settings that define the run) and, last, `adloco/manifest.json` (every file's size and checksum)."""
    step = trainer.state.global_step
    run_dir = trainer_output_dir(trainer, trial)
    checkpoint = f"{PREFIX_CHECKPOINT_DIR}-{step}"
    final_dir, staging = os.path.join(run_dir, checkpoint), os.path.join(run_dir, f".tmp-{checkpoint}")
    # Every wait is bounded by worker_timeout and names a missing worker; a failed write (full disk) is one clear
    # error on its worker, which the others' errors name.
    monitor, hint = worker.monitor, worker.resume_hint
    if trainer.args.should_save:
        with save_errors(final_dir, run_dir, monitor.report):
            shutil.rmtree(staging, ignore_errors=True)
            os.makedirs(staging, exist_ok=True)
    monitor.check(f"{checkpoint} (staging folder)", hint)
    if trainer.hp_search_backend is None and trial is None:
        trainer.store_flos()
    with save_errors(final_dir, run_dir, monitor.report), quiet_saves():  # one line when published, not one per file
        trainer.save_model(staging, _internal_call=True)
        if not trainer.args.save_only_model:
            trainer_save_optimizer_and_scheduler(trainer, staging)
            trainer_save_scaler(trainer, staging)
            trainer_save_rng_state(trainer, staging)
            path = save_rank_state(staging, trainer.args.process_index, worker.state_dict())
            record_own_files(
                staging, trainer.args.process_index, [path]
            )  # summed here, in parallel (`checkpoint/manifest.py`)
    monitor.check(f"{checkpoint} (every worker's files)", hint)
    if trainer.args.should_save:
        if trainer.state.best_global_step:
            best = os.path.join(run_dir, f"{PREFIX_CHECKPOINT_DIR}-{trainer.state.best_global_step}")
            if os.path.exists(best) or trainer.state.best_global_step == step:
                trainer.state.best_model_checkpoint = best
        for cb in [
            c for c in trainer.callback_handler.callbacks + [trainer.control] if isinstance(c, ExportableState)
        ]:
            name = cb.__class__.__name__
            if isinstance(trainer.state.stateful_callbacks.get(name), list):
                trainer.state.stateful_callbacks[name].append(cb.state())
            else:
                trainer.state.stateful_callbacks[name] = cb.state()
        with save_errors(final_dir, run_dir, monitor.report):
            trainer.state.save_to_json(os.path.join(staging, TRAINER_STATE_NAME))
            unwrapped = trainer.accelerator.unwrap_model(trainer.model)
            settings = run_settings(trainer.args, unwrapped, max_batch_size=worker.max_batch_size())
            save_run_settings(staging, settings)
            write_manifest(staging)  # the last file in: a published checkpoint with a manifest was complete
            publish_checkpoint(staging, final_dir)
            rotate_checkpoints(
                output_dir=run_dir,
                save_total_limit=trainer.args.save_total_limit,
                best_model_checkpoint=trainer.state.best_model_checkpoint,
                use_mtime=True,
            )
    monitor.check(f"{checkpoint} (published)", hint)
    if trainer.args.should_save:
        logger.info("saved %s", final_dir)
