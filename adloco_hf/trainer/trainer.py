"""`AdLoCoTrainer`: the HF `Trainer` with AdLoCo's inner loop. Only overrides live here, each saying why.

The rounds belong to this process's [`Worker`] (`worker/core.py`); `AdLoCoCallback` (`callback.py`) hands it the
Trainer's events: training begins, a step's optimizer step, a step ends (every `inner_steps` steps, a round), training
ends. What the overrides run lives beside this file: the inner step (`inner_step.py`), the training data
(`loaders.py`), resuming (`checkpoint_load.py`), the checkpoint save (`staged_save.py`), the merge folders (`merge_folders.py`).
"""

import functools
import logging
import os
import warnings

import torch
from torch.utils.data import DataLoader
from transformers import Trainer
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

from ..checkpoint.folders import save_errors
from ..common.collectives import collective, watch_exit
from ..common.versions import end_training
from ..config.arguments import AdLoCoConfig
from ..evaluation.evaluate import evaluate_datasets
from ..evaluation.view import EvaluationSettings, EvaluationView
from ..reporting.card_details import CardDetails
from ..reporting.hub import HubUploadError
from ..reporting.run_hub import create_run_repo
from ..rounds.state import AdLoCoState, RoundResult
from ..sampling.sampler import AdaptiveBatchSampler
from ..sampling.stream_sampler import AdaptiveStreamSampler
from ..worker.core import Worker
from ..worker.preemption import TrainingPreempted
from .callback import AdLoCoCallback
from .checkpoint_load import load_checkpoint, load_cpu_optimizer, load_scheduler, resume_point
from .inner_step import StartupProbe, TrainerPasses, probe_step, worker_ddp
from .inputs_check import check_eval_dataset
from .loaders import epoch_of, train_loader
from .merge_folders import reporting_parts, save_merge
from .round_console import announce_round, quiet_console, use_round_console
from .run_end import keep_the_results_of_an_ended_run, record_run_end
from .staged_save import save_staged_checkpoint


__all__ = ["AdLoCoTrainer"]

logger = logging.getLogger(__name__)


class AdLoCoTrainer(Trainer):
    """A drop-in replacement for `transformers.Trainer` that trains with AdLoCo.

    Launch it with `accelerate launch`: every process is a worker with its own model copy, inner AdamW and data
    shard. There is no DDP: workers of an instance average their pseudo-gradients once per round. Batch sizes grow
    with the gradient noise, micro-batches are accumulated only when a batch no longer fits (switch mode), several
    instances merge as training goes on, and the final merged model is written to `{output_dir}/merged/`.

    Args:
        model: the model to train (the same on every worker).
        args: an [`AdLoCoConfig`].
        **kwargs: everything `transformers.Trainer` accepts (`train_dataset`, `eval_dataset`, `data_collator`,
            `processing_class`, `callbacks`, ...). `train_dataset` is map-style (with a length) or a stream: a
            `datasets.IterableDataset`, a `data.PackedStream`, or a torch `IterableDataset` with `state_dict()` /
            `load_state_dict()` (each worker reads its own part; resume continues it exactly, `sampling/stream_parts.py`).

    Example:
    ```python
    from adloco_hf import AdLoCoConfig, AdLoCoTrainer

    args = AdLoCoConfig(output_dir="out", max_steps=2000, inner_steps=100, num_instances=4,
                        per_device_train_batch_size=4, learning_rate=3e-4)
    trainer = AdLoCoTrainer(model=model, args=args, train_dataset=train, eval_dataset=valid)
    trainer.train()                  # accelerate launch --num_processes 4 train.py
    print(trainer.adloco_state)      # rounds, tokens, bytes, merges, batch sizes
    trainer.push_merged_to_hub("me/my-model")
    ```
    """

    def __init__(self, model=None, args: AdLoCoConfig | None = None, **kwargs):
        if not isinstance(args, AdLoCoConfig):
            raise TypeError(
                f"AdLoCoTrainer needs args=AdLoCoConfig(...), got {type(args).__name__}; AdLoCoConfig accepts every "
                "TrainingArguments field plus AdLoCo's (inner_steps, num_instances, ...)"
            )
        super().__init__(model=model, args=args, **kwargs)
        check_eval_dataset(args, self.eval_dataset)  # one to evaluate, with samples (inputs_check.py)
        self.worker = Worker.from_args(args)
        self.evaluation_settings = EvaluationSettings.from_args(args)
        self.cards, self.hub = reporting_parts(self)  # the cards of the run's folders, its Hub uploads
        # worker_parallelism="fsdp": shard before the Trainer creates the optimizer (in train()), so that AdamW holds
        # the shards; the Trainer's own FSDP (which would shard over the world) stays refused (compat.py).
        self.worker.shard(self.model)
        self._preempted_at: int | None = None
        self.train_sampler: AdaptiveBatchSampler | AdaptiveStreamSampler | None = None
        self._train_loader: DataLoader | None = None
        # Right after DefaultFlowCallback, before reporting and user callbacks (they see a round's synchronised weights).
        events = AdLoCoCallback(start=self._start_rounds, step_end=self._maybe_end_round, end=self._finish_rounds)
        self.callback_handler.callbacks.insert(1, events)
        use_round_console(self.callback_handler)  # a round prints one line, not its adloco/* dict (round_console.py)
        watch_exit()  # a worker that leaves while the others wait in a collective is seen leaving (`collective`)

    @property
    def adloco_state(self) -> AdLoCoState:
        """Where the run stands: rounds, tokens, bytes, merges, instances and their batch sizes (same on every rank)."""
        return self.worker.state

    @property
    def adloco(self) -> Worker:
        """Deprecated alias of `worker` (read `adloco_state` for the run's numbers)."""
        warnings.warn("AdLoCoTrainer.adloco is deprecated; use .worker or .adloco_state", FutureWarning, stacklevel=2)
        return self.worker

    # ---- the worker's events ----
    def _start_rounds(self) -> None:
        self.worker.start(
            model=self.model,
            optimizer=self.optimizer,
            lr_scheduler=self.lr_scheduler,
            sampler=self.train_sampler,
            scaler=self.accelerator.scaler,
            max_steps=self.state.max_steps,
            global_step=self.state.global_step,
            probe_step=self.run_probe_step,
            startup_probe=StartupProbe(
                self, self._train_loader, self.train_sampler, super().training_step, self._prepare_inputs
            ),
        )

    def _maybe_end_round(self) -> None:
        step = self.state.global_step
        # The data training consumed (`loaders.epoch_of`): the Trainer's steps over max_steps would end every run at 1.
        self.state.epoch = epoch_of(self.train_sampler, step, self.state.max_steps)
        end = self.worker.after_step(step)  # the step's end: a fragment sync, a round's end, a preemption's stop
        if end.round is not None:
            self._after_round(end.round)
        if end.stop:
            self._stop_for_preemption()  # inside a round, the checkpoint holds every worker's own weights

    def _stop_for_preemption(self) -> None:
        """Save a checkpoint at this step on every worker, then leave the training loop (see `worker/preemption.py`)."""
        self.control.should_save = True
        self.control.should_training_stop = True
        self._preempted_at = self.state.global_step

    def _after_round(self, result: RoundResult) -> None:
        """Save (and push) a merge, count tokens for the Trainer, report `adloco/*` values (same call on every rank)."""
        if result.merge is not None and result.merge.phi is not None:
            save_merge(self, result)
        if self.args.include_num_input_tokens_seen != "no":
            self.state.num_input_tokens_seen = self.worker.totals.tokens
        announce_round(self, result)  # adloco/* to the trackers, a line on the console, the bar's estimate

    def _finish_rounds(self) -> None:
        self.worker.preemption.uninstall()
        if self._preempted_at is not None:
            return  # not the end of training: the checkpoint just written is where the run continues
        if self.state.global_step != self.worker.last_synced_step:
            # Training stopped inside a round (max_steps, or a callback): finish it so the replicas agree.
            self._after_round(self.worker.end_round(self.state.global_step))
        self.save_merged_model()
        if self.eval_dataset is not None and self.args.eval_strategy != "no":
            self.record_merged_metrics(self.evaluate(metric_key_prefix="eval_merged"))  # into the merged cards
        self.draw_run_plot()  # rank 0: this run's plot, from its rounds file, into the merged cards
        if self.args.push_to_hub:  # a failure is raised by train() once every callback saw the end
            try:
                self.push_merged_to_hub(commit_message="AdLoCo merged model (end of training)")
            except HubUploadError as error:
                self.hub.error = error

    # The public collectives: every worker calls them, in the same order; one that calls one alone (`if rank == 0:`)
    # fails at once with the rule named, instead of waiting up to worker_timeout (`common/collectives.py`).
    @collective("train()")
    def train(self, resume_from_checkpoint=None, *args, **kwargs):
        """`Trainer.train`; raises [`TrainingPreempted`] naming the checkpoint written when SIGTERM/SIGINT stopped it.
        The checkpoint to resume from (else the config's `resume_from_checkpoint`) is verified first; `True` takes the
        newest intact one; a finished run's last checkpoint only returns that run's output (`run_end.py`). Another
        run's checkpoints or merges in `output_dir` are named in a warning (`checkpoint_load.resume_point`)."""
        self._preempted_at, self.cards.plot = None, None
        resume_from_checkpoint, self.ended_run = resume_point(self, resume_from_checkpoint)
        if self.ended_run is not None:  # nothing to train: one line said so, the run's files are kept
            return self.ended_run
        self.hub.error = None
        with quiet_console(self.is_world_process_zero()):  # the banner's true lines, warnings once
            output = super().train(resume_from_checkpoint, *args, **kwargs)
        error, self.hub.error = self.hub.error, None
        if error is not None:  # the end-of-training upload failed: the trained model is in the folder it names
            error.train_output = output
            raise error
        if self._preempted_at is not None:
            checkpoint = os.path.join(self.args.output_dir, f"{PREFIX_CHECKPOINT_DIR}-{self._preempted_at}")
            raise TrainingPreempted.saved(checkpoint, self._preempted_at, self.worker.preemption.signal_name)
        record_run_end(self, output)  # the last checkpoint records the end; the run's line (run_end.py)
        return output

    def _run_epoch(self, *args, **kwargs) -> None:
        """A run resumed from its final checkpoint (`global_step >= max_steps`) only ends: `_finish_rounds` redoes
        what it had not finished (the final merge, `merged/`, its evaluation, the push). The Trainer would train one
        more step first (its loop checks `max_steps` after a step) and save its checkpoint. Maintenance note:
        `Trainer._run_epoch` is private in transformers 5.23; nothing else of it differs."""
        if self.state.global_step >= self.state.max_steps:
            self.control.should_training_stop = True
            return
        super()._run_epoch(*args, **kwargs)

    # ---- data: a plain DataLoader over the adaptive sampler ----
    def get_train_dataloader(self) -> DataLoader:
        """A plain loader over the adaptive sampler: accelerate's `BatchSamplerShard` would freeze the batch size.
        A stream goes through `AdaptiveStreamSampler` (this worker's part of it, batches of the planned size)."""
        if self.train_dataset is None:
            raise ValueError("AdLoCoTrainer: training requires a train_dataset.")
        self._train_loader, self.train_sampler = train_loader(self)
        return self._train_loader

    def _wrap_model(self, model, training: bool = True, dataloader=None):
        """Skip DDP across workers: they synchronise once per round. `prepare_model(evaluation_mode=True)` still
        applies device placement and autocast, and marks the model prepared so the later
        `accelerator.prepare(model, optimizer)` only wraps the optimizer (GradScaler).

        With `processes_per_worker` > 1 the worker's processes train one replica through DDP over the worker's own
        group: accelerate cannot take a process group, so the prepared model is wrapped here and marked prepared
        (the Trainer then prepares only the optimizer; `unwrap_model` still finds the model)."""
        if self.accelerator.unwrap_model(model, keep_torch_compile=False) is not model:
            return model
        if not training:
            return model
        prepared = self.accelerator.prepare_model(model, evaluation_mode=True)
        if self.worker.processes_per_worker == 1 or self.worker.fsdp:
            return prepared  # FSDP: sharded in __init__, its collectives run inside the worker's group
        return worker_ddp(prepared, self.args, self.accelerator.device, self.worker.intra_group)

    def _track_num_input_tokens(self, inputs):
        """Counted locally and summed once per round by the worker: the Trainer's per-step all-gather would
        synchronise the workers every step."""

    # ---- one inner step: switch mode and gradient statistics ----
    def training_step(self, model, inputs, num_items_in_batch=None) -> torch.Tensor:
        """One inner step as the worker plans it: the whole batch, or micro-batches accumulated (switch mode, or two
        halves on a round's last step for the gradient statistics), each chunk run by the Trainer's own step."""
        passes = TrainerPasses(self, super().training_step, model, num_items_in_batch)
        return self.worker.train_step(self.state.global_step, inputs, passes)

    def run_probe_step(self, size: int) -> None:
        """Forward and backward on `size` training samples, gradients cleared after (for max_batch_size='auto')."""
        probe_step(self, self._train_loader, self.train_sampler, size, self._prepare_inputs)

    @collective("evaluate()")
    def evaluate(self, eval_dataset=None, ignore_keys=None, metric_key_prefix: str = "eval") -> dict[str, float]:
        """Exact token-weighted loss, `compute_metrics` and (causal LMs only) perplexity of every model being trained:
        each instance's own global model on the whole eval set (`{prefix}_instance_{i}_{metric}`), their
        demand-weighted mean (`{prefix}_{metric}`, also `{prefix}_instances_mean_loss`: no model's loss), and with
        `eval_merged_model=True` the model the final merge would make now (`{prefix}_merged_*`). A dict of datasets
        is evaluated name by name (`{prefix}_{name}_*`), as `Trainer.evaluate` does. See `evaluation/evaluate.py`."""
        dataset = eval_dataset if eval_dataset is not None else self.eval_dataset
        if dataset is None:
            raise ValueError("AdLoCoTrainer.evaluate needs an eval_dataset.")
        view = EvaluationView.from_worker(self.worker)
        return evaluate_datasets(self, view, self.evaluation_settings, dataset, ignore_keys, metric_key_prefix)

    # ---- checkpoints: per-worker state, written atomically ----
    def _save_checkpoint(self, model, trial) -> None:
        """Every worker's state, staged and renamed into place once all have written (see `trainer/staged_save.py`)."""
        save_staged_checkpoint(self, self.worker.checkpoint_view(), trial)

    @collective(
        "save_model()",
        when=lambda self, *args, _internal_call=False, **kwargs: self.worker.fsdp and not _internal_call,
    )
    def save_model(self, output_dir: str | None = None, _internal_call: bool = False) -> None:
        """worker_parallelism="fsdp": the full model gathered inside worker 0 (collective over its processes) and
        written by rank 0 as plain safetensors that `from_pretrained` loads; otherwise the Trainer's."""
        if not self.worker.fsdp:
            return super().save_model(output_dir, _internal_call=_internal_call)
        output_dir = output_dir if output_dir is not None else self.args.output_dir
        state = self.worker.full_state_dict() if self.worker.worker_id == 0 else None
        if self.args.should_save:
            self._save(output_dir, state_dict=state)

    def _save_optimizer_and_scheduler(self, output_dir: str) -> None:
        """worker_parallelism="fsdp": only the schedule (rank 0); each process's optimizer shard is in its
        `adloco/rank-R.pt`, and rank 0's shard alone would be no optimizer for the others."""
        if not self.worker.fsdp:
            return super()._save_optimizer_and_scheduler(output_dir)
        if self.args.should_save:
            torch.save(self.lr_scheduler.state_dict(), os.path.join(output_dir, "scheduler.pt"))

    def _load_optimizer_and_scheduler(self, checkpoint: str | None) -> None:
        """worker_parallelism="fsdp": the schedule only (the inner optimizer's shard is restored from rank-R.pt)."""
        if self.worker.fsdp:
            return load_scheduler(self.lr_scheduler, checkpoint)
        if not load_cpu_optimizer(self, checkpoint):  # older transformers map a CPU world's state to "cpu:0"
            super()._load_optimizer_and_scheduler(checkpoint)

    def _load_from_checkpoint(self, resume_from_checkpoint: str, model=None) -> None:
        """Load the weights as the Trainer does (with fsdp, each process's rows), then this worker's AdLoCo state,
        refusing changed settings that define the run (`checkpoint/run_settings.py`). A checkpoint written by another number of
        workers is an elastic resume (`checkpoint/elastic.py`): its refusals come before anything is loaded (`checkpoint_load.py`)."""
        load_weights = functools.partial(super()._load_from_checkpoint, resume_from_checkpoint, model)
        load_checkpoint(self, self.worker.checkpoint_view(), resume_from_checkpoint, load_weights)

    def _init_training_state(self, max_steps, *args, **kwargs):
        """On resume the Trainer takes logging/eval/save steps from the checkpoint's trainer_state.json: this run's
        win (validated as multiples of inner_steps). Maintenance note: private in transformers 5.23."""
        trained = super()._init_training_state(max_steps, *args, **kwargs)
        self.state.compute_steps(self.args, max_steps)
        return trained

    @collective("end()")
    def end(self) -> None:
        """Wait for every worker, then finish the trackers and destroy the process groups (call it last): a worker
        that leaves with a live gloo group while another still uses its own can abort. A script that never calls it
        still has its process groups destroyed at interpreter exit (`destroy_process_groups_at_exit`)."""
        self.worker.monitor.check("end of training")
        end_training(self, super())  # Trainer.end() is new in transformers 5.18

    # ---- merges and the merged model ----
    @collective("save_merged_model()")
    def save_merged_model(self, output_dir: str | None = None) -> str:
        """Merge the surviving instances (demand-weighted) into every worker's model and save it on rank 0.

        Collective: call it on every worker. Training calls it at the end and writes `{output_dir}/merged/`.
        Returns the folder.
        """
        folder = output_dir or os.path.join(self.args.output_dir, "merged")
        self.worker.finish()
        phi = self.worker.global_model.phi.detach()
        if self.worker.fsdp and self.worker.worker_id == 0:
            phi = self.worker.full_save_state(phi)  # collective over worker 0's processes, before rank 0 writes
        if self.is_world_process_zero():
            with save_errors(folder, self.args.output_dir, self.worker.monitor.report):
                self.cards.save_merged_folders(folder, phi)  # and merged-full/, cards
            logger.info("saved the merged model to %s", folder)
        self.worker.monitor.check(f"saving {folder}", self.worker.resume_hint)
        return folder

    predict = collective("predict()")(Trainer.predict)
    save_metrics = keep_the_results_of_an_ended_run(Trainer.save_metrics)  # a resume that trained nothing keeps them
    save_state = keep_the_results_of_an_ended_run(Trainer.save_state)

    # ---- model cards and the Hub: the run's `cards` (`reporting/run_cards.py`) and `hub` (`run_hub.py`) ----
    @property
    def card_details(self) -> CardDetails:
        """What the cards cannot find out ([`CardDetails`]): set it before they are written (`write_merged_cards`)."""
        return self.cards.details

    @card_details.setter
    def card_details(self, details: CardDetails) -> None:
        self.cards.details = details

    def record_merged_metrics(self, metrics: dict) -> None:  # the merged model's evaluation, into its cards
        self.cards.record_merged_metrics(metrics)

    def write_merged_cards(self, folder: str | None = None, *, repo_id: str | None = None) -> None:
        self.cards.write_merged(folder, repo_id=repo_id)

    def draw_run_plot(self) -> str | None:  # `{output_dir}/adloco_run.png`, shown in the merged cards
        return self.cards.draw_plot()

    def create_model_card(self, *args, **kwargs) -> None:  # the merged model's card, in `output_dir` too
        self.cards.write_output_dir_card()

    @collective("push_merged_to_hub()")
    def push_merged_to_hub(
        self,
        repo_id: str | None = None,
        *,
        commit_message: str = "AdLoCo merged model",
        token: str | None = None,
        private: bool | None = None,
        revision: str | None = None,
    ):
        """Upload `{output_dir}/merged/` (saved first if missing; with `save_merged_full`, `merged-full/` too, to the
        repo's `merged-full/`) from global rank 0 (collective). Its card is rewritten first to load from the repo.

        Raises:
            HubUploadError: on every rank, when the upload failed after `PUSH_ATTEMPTS` tries; it names the local
                folder that holds the model and the repo.
        """
        folder = os.path.join(self.args.output_dir, "merged")
        if not os.path.isdir(folder) or not self.worker.final_merged:
            self.save_merged_model(folder)
        return self.hub.push_merged(
            folder, repo_id, commit_message=commit_message, token=token, private=private, revision=revision
        )

    @collective("push_to_hub()")
    def push_to_hub(self, commit_message: str | None = "End of training", blocking: bool = True, token=None,
                    revision=None, private=None, **kwargs):  # fmt: skip
        """The model worth sharing is the merged one: same as `push_merged_to_hub`."""
        return self.push_merged_to_hub(
            commit_message=commit_message or "AdLoCo merged model", token=token, revision=revision, private=private
        )

    def init_hf_repo(self, token: str | None = None, private: bool | None = None) -> None:
        """Create the repo through the same Hub client as every other upload of this trainer (`run_hub.py`)."""
        if self.is_world_process_zero():
            self.hub_model_id = create_run_repo(self.args, token, private)
            self.push_in_progress = None

    def _push_from_checkpoint(self, checkpoint_folder: str) -> None:
        """Checkpoints hold per-worker resume state and stay local; merges and the merged model go to the Hub."""
