"""`AdLoCoTrainer`: the HF `Trainer` with AdLoCo's inner loop. Only overrides live here, each saying why.

The rounds belong to this process's [`Worker`] (`worker/core.py`); `AdLoCoCallback` (`callback.py`) hands it the
Trainer's events: training begins, a step's optimizer step, a step ends (every `inner_steps` steps, a round), training
ends. What the overrides run lives beside this file: the inner step (`inner_step.py`), the training data
(`loaders.py`), resuming (`checkpoint_load.py`), the checkpoint save (`staged_save.py`), the merge folders (`merge_folders.py`).
"""

import contextlib
import functools
import logging
import os
import warnings

import torch
from torch.utils.data import DataLoader
from transformers import Trainer
from transformers.trainer_callback import ProgressCallback
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

from ..checkpoint.folders import save_errors
from ..checkpoint.manifest import resolve_checkpoint
from ..common.collectives import collective, watch_exit
from ..common.inputs import batch_length, count_tokens
from ..common.logs import restart_rate_estimate
from ..common.versions import end_training
from ..config.arguments import AdLoCoConfig
from ..evaluation.evaluate import evaluate_instances
from ..evaluation.view import EvaluationSettings, EvaluationView
from ..reporting.earlier_run import warn_about_earlier_run
from ..reporting.hub import MergedModelHubMixin
from ..rounds.log_lines import round_logs, round_message
from ..rounds.state import AdLoCoState, RoundResult
from ..sampling.sampler import AdaptiveBatchSampler
from ..sampling.stream_sampler import AdaptiveStreamSampler
from ..worker.core import Worker
from ..worker.preemption import TrainingPreempted
from .callback import AdLoCoCallback
from .checkpoint_load import check_workers_for_instances, load_checkpoint, load_scheduler
from .inner_step import accumulate, no_sync, probe_step, worker_ddp
from .loaders import epoch_of, train_loader
from .merge_folders import save_global_weights_folder, save_merge
from .round_console import quiet_console, show_round_line, use_round_console
from .staged_save import save_staged_checkpoint


__all__ = ["AdLoCoTrainer"]

logger = logging.getLogger(__name__)


class AdLoCoTrainer(MergedModelHubMixin, Trainer):
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
        if args.eval_strategy != "no" and self.eval_dataset is None:
            raise ValueError(
                f"eval_strategy={args.eval_strategy.value!r} asks for evaluation but no eval_dataset was given; pass "
                "eval_dataset=... or set eval_strategy='no'"
            )
        self.worker = Worker(args)
        self.evaluation_settings = EvaluationSettings.from_args(args)
        # worker_parallelism="fsdp": shard before the Trainer creates the optimizer (in train()), so that AdamW holds
        # the shards; the Trainer's own FSDP (which would shard over the world) stays refused (compat.py).
        self.worker.shard(self.model)
        self._preempted_at: int | None = None
        self.train_sampler: AdaptiveBatchSampler | AdaptiveStreamSampler | None = None
        self._train_loader: DataLoader | None = None
        # Right after DefaultFlowCallback, before reporting and user callbacks (they see a round's synchronised weights).
        events = AdLoCoCallback(
            start=self._start_rounds,
            optimizer_step=self.worker.step_trained,
            step_end=self._maybe_end_round,
            end=self._finish_rounds,
        )
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
        )

    def _maybe_end_round(self) -> None:
        self.worker.close_step()  # the step's optimizer has run: the end of its timing (batch_size_target="goodput")
        step = self.state.global_step
        # The data training consumed (`loaders.epoch_of`): the Trainer's steps over max_steps would end every run at 1.
        self.state.epoch = epoch_of(self.train_sampler, step, self.state.max_steps)
        self.worker.sync_fragments(step)  # Streaming DiLoCo: the fragment due after this step (none otherwise)
        round_end = self.worker.is_round_end(step) and step != self.worker.last_synced_step
        stop = self.worker.preemption.after_step(step, steps_to_round_end=self.worker.steps_to_round_end(step))
        if round_end:
            result = self.worker.end_round(step)
            self._after_round(result)
            stop = stop or result.preempted
        if stop:
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
        if self.args.logging_strategy != "no":
            self.log(round_logs(result.lines, self.worker.state, self.worker.instances))  # for report_to
            message = round_message(result.lines, len(self.worker.instances), result.merge and result.merge.plan)
            level = logging.WARNING if any(line.skipped for line in result.lines) else logging.INFO
            show_round_line(self.callback_handler, self.is_world_process_zero(), message, level)
        if result.merge is not None or any(line.next_batch_size != line.batch_size for line in result.lines):
            self._restart_progress_estimate()

    def _restart_progress_estimate(self) -> None:
        """The batches change and with them the steps' speed: the progress bar's estimate of the time left restarts
        from the next steps instead of averaging in the old speed (the bar is moved to this step right after)."""
        for callback in self.callback_handler.callbacks:
            if isinstance(callback, ProgressCallback) and callback.training_bar is not None:
                restart_rate_estimate(callback.training_bar, self.state.global_step)

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
        if self.args.push_to_hub:
            self.push_at_end_of_training()  # a failure is raised by train() once every callback saw the end

    # The public collectives: every worker calls them, in the same order; one that calls one alone (`if rank == 0:`)
    # fails at once with the rule named, instead of waiting up to worker_timeout (`common/collectives.py`).
    @collective("train()")
    def train(self, resume_from_checkpoint=None, *args, **kwargs):
        """`Trainer.train`; raises [`TrainingPreempted`] naming the checkpoint written when SIGTERM/SIGINT stopped it.
        The checkpoint to resume from is verified first; `True` takes the newest intact one (`checkpoint/manifest.py`).
        Another run's checkpoints or merges in `output_dir` are named in a warning (`reporting/earlier_run.py`)."""
        self._preempted_at, self._run_plot = None, None
        resume_from_checkpoint = resolve_checkpoint(resume_from_checkpoint, self.args.output_dir)
        check_workers_for_instances(self.worker, resume_from_checkpoint)
        if self.is_world_process_zero():
            warn_about_earlier_run(self.args.output_dir, resume_from_checkpoint)
        with quiet_console(self.is_world_process_zero()):  # the banner's true lines, warnings once
            output = super().train(resume_from_checkpoint, *args, **kwargs)
        if self._preempted_at is not None:
            checkpoint = os.path.join(self.args.output_dir, f"{PREFIX_CHECKPOINT_DIR}-{self._preempted_at}")
            raise TrainingPreempted(
                f"training was preempted ({self.worker.preemption.signal_name or 'a signal to another worker'}) and "
                f"stopped at step {self._preempted_at}: every worker saved its state in {checkpoint}. Resume with "
                f"train(resume_from_checkpoint={checkpoint!r}) (or True) and the same number of processes (it was "
                "written inside a round: another number of workers can resume only from a round's end).",
                checkpoint,
            )
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
        halves on a round's last step for the gradient statistics)."""
        batch = batch_length(inputs)
        plan = self.worker.plan_step(self.state.global_step, batch)
        # processes_per_worker > 1: a step whose gradient statistics are read keeps each process's own gradient
        # (DDP's all-reduce off) and averages it after the statistics (`Worker.sync_gradients`).
        local = self.worker.local_gradient_step(self.state.global_step)
        with no_sync(model) if local else contextlib.nullcontext():
            if plan.accumulates:
                step = super().training_step
                loss = accumulate(self, self.worker, step, model, inputs, plan, num_items_in_batch, synced=not local)
            else:
                loss = super().training_step(model, inputs, num_items_in_batch)
        tokens = count_tokens(inputs, getattr(self.model, "main_input_name", "input_ids"))
        self.worker.finish_step(plan, loss, batch, tokens)
        if local:
            self.worker.sync_gradients()
        return loss

    def run_probe_step(self, size: int) -> None:
        """Forward and backward on `size` training samples, gradients cleared after (for max_batch_size='auto')."""
        probe_step(self, size)

    @collective("evaluate()")
    def evaluate(self, eval_dataset=None, ignore_keys=None, metric_key_prefix: str = "eval") -> dict[str, float]:
        """Exact token-weighted loss, `compute_metrics` and (causal LMs only) perplexity of every model being trained.

        While several instances train, each instance's global model is evaluated on the whole eval set by its own
        workers (each predicts a shard; `compute_metrics` runs once per instance on the joined predictions) and
        logged as `{prefix}_instance_{i}_{metric}`; the top-level `{prefix}_{metric}` is the demand-weighted mean of
        the instances' values (a causal LM's perplexity is that of the mean loss). That mean is no model's loss: no
        single model achieves it, and the merge of instances that drifted apart can be far worse; it is also logged
        under its honest name, `{prefix}_instances_mean_loss` (and `_perplexity`). With `eval_merged_model=True`
        every evaluation also evaluates the model the final merge would produce now (all workers share the eval
        set; their own weights are put back exactly afterwards) as `{prefix}_merged_loss`, `_perplexity` and
        `{prefix}_merged_{metric}`. With one instance (or after the final merge) all workers share the eval set and
        `compute_metrics` runs through the Trainer's `evaluation_loop`. A dict of datasets is evaluated name by name with the prefix
        `{prefix}_{name}`, and a name evaluates that dataset of `self.eval_dataset`, as `Trainer.evaluate` does;
        every line of `adloco_eval.jsonl` names its `dataset` (None for a single eval dataset).
        """
        dataset = eval_dataset if eval_dataset is not None else self.eval_dataset
        if dataset is None:
            raise ValueError("AdLoCoTrainer.evaluate needs an eval_dataset.")
        view, settings = EvaluationView.from_worker(self.worker), self.evaluation_settings
        if isinstance(dataset, str):
            name, dataset = dataset, self.eval_dataset[dataset]
            return evaluate_instances(self, view, settings, dataset, ignore_keys, metric_key_prefix, dataset_name=name)
        if isinstance(dataset, dict):
            metrics = {}
            for name, part in dataset.items():
                prefix = f"{metric_key_prefix}_{name}"
                metrics.update(evaluate_instances(self, view, settings, part, ignore_keys, prefix, dataset_name=name))
            return metrics
        return evaluate_instances(self, view, settings, dataset, ignore_keys, metric_key_prefix)

    # ---- checkpoints: per-worker state, written atomically ----
    def _save_checkpoint(self, model, trial) -> None:
        """Every worker's state, staged and renamed into place once all have written (see `trainer/staged_save.py`)."""
        save_staged_checkpoint(self, self.worker, trial)

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
        if not self.worker.fsdp:
            return super()._load_optimizer_and_scheduler(checkpoint)
        load_scheduler(self.lr_scheduler, checkpoint)

    def _load_from_checkpoint(self, resume_from_checkpoint: str, model=None) -> None:
        """Load the weights as the Trainer does (with fsdp, each process's rows), then this worker's AdLoCo state,
        refusing changed settings that define the run (`checkpoint/run_settings.py`). A checkpoint written by another number of
        workers is an elastic resume (`checkpoint/elastic.py`): its refusals come before anything is loaded (`checkpoint_load.py`)."""
        load_weights = functools.partial(super()._load_from_checkpoint, resume_from_checkpoint, model)
        load_checkpoint(self, self.worker, resume_from_checkpoint, load_weights)

    def _init_training_state(self, max_steps, *args, **kwargs):
        """On resume the Trainer takes logging/eval/save steps from the checkpoint's trainer_state.json: this run's
        win (validated as multiples of inner_steps). Maintenance note: private in transformers 5.23."""
        trained = super()._init_training_state(max_steps, *args, **kwargs)
        self.state.compute_steps(self.args, max_steps)
        return trained

    @collective("end()")
    def end(self) -> None:
        """Wait for every worker, then finish the trackers and destroy the process groups (call it last).

        A worker that leaves with a live gloo group while another still uses its own can abort ("terminate called
        without an active exception"), so the workers leave together. A script that never calls it still has its
        process groups destroyed at interpreter exit (`destroy_process_groups_at_exit`).
        """
        self.worker.monitor.check("end of training")
        end_training(self, super())  # Trainer.end() is new in transformers 5.18

    # ---- merges and the merged model ----
    def _save_global_weights(self, folder: str, phi, *, title: str, extra: dict | None = None) -> str:
        """Save flat global weights as a `from_pretrained` folder with a model card (on the writing rank). With
        worker_parallelism="fsdp", `phi` is the full state dict already gathered (`Worker.full_save_state`). Here
        because the model cards (`MergedModelHubMixin`) save through it."""
        return save_global_weights_folder(self, folder, phi, title=title, extra=extra)

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
                self.save_merged_folders(folder, phi)  # and merged-full/, cards
            logger.info("saved the merged model to %s", folder)
        self.worker.monitor.check(f"saving {folder}", self.worker.resume_hint)
        return folder

    predict = collective("predict()")(Trainer.predict)
    push_merged_to_hub = collective("push_merged_to_hub()")(MergedModelHubMixin.push_merged_to_hub)
    push_to_hub = collective("push_to_hub()")(MergedModelHubMixin.push_to_hub)
