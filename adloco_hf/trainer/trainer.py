"""`AdLoCoTrainer`: the HF `Trainer` with AdLoCo's inner loop. Only overrides live here, each saying why.

The rounds themselves belong to this process's [`Worker`] (`worker.py`); `AdLoCoCallback` (`callback.py`) hands
the Trainer's events to it: training begins, a step ends (and with it, every `inner_steps` steps, a round), training
ends.
"""

import contextlib
import logging
import os
import warnings

import datasets
import torch
from torch.utils.data import DataLoader
from transformers import Trainer
from transformers.trainer_callback import ProgressCallback
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

from ..batch.switch_mode import Statistics, StepPlan
from ..checkpoint.elastic import check_instances_fit, elastic_rank_state
from ..checkpoint.folders import (
    check_rank_states,
    load_rank_state,
    save_errors,
    save_global_weights,
    save_model_folder,
)
from ..checkpoint.manifest import resolve_checkpoint
from ..checkpoint.run_settings import check_run_settings, run_settings
from ..common.console import restart_rate_estimate
from ..common.inputs import batch_length, count_tokens, split_inputs
from ..config.arguments import AdLoCoConfig
from ..evaluation.evaluate import evaluate_instances
from ..outputs.hub import MergedModelHubMixin
from ..rounds.messages import merge_record, round_logs
from ..rounds.state import AdLoCoState, RoundResult
from ..sampling.sampler import AdaptiveBatchSampler, adaptive_train_loader
from ..sampling.stream import is_stream
from ..sampling.stream_sampler import AdaptiveStreamSampler, adaptive_stream_loader
from ..worker.core import Worker
from ..worker.preemption import TrainingPreempted
from .callback import AdLoCoCallback
from .staged_save import save_staged_checkpoint


__all__ = ["AdLoCoTrainer"]

logger = logging.getLogger(__name__)


def _no_sync(model):
    """DDP's `no_sync` for a worker of several processes; nothing to turn off for a bare model."""
    return (
        model.no_sync() if isinstance(model, torch.nn.parallel.DistributedDataParallel) else contextlib.nullcontext()
    )


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
            `load_state_dict()` (each worker reads its own part; resume continues it exactly, `stream.py`).

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
        # worker_parallelism="fsdp": shard before the Trainer creates the optimizer (in train()), so that AdamW holds
        # the shards; the Trainer's own FSDP (which would shard over the world) stays refused (compat.py).
        self.worker.shard(self.model)
        self._preempted_at: int | None = None
        self.train_sampler: AdaptiveBatchSampler | AdaptiveStreamSampler | None = None
        self._train_loader: DataLoader | None = None
        # Right after DefaultFlowCallback, before reporting and user callbacks: at a round's end they then see the
        # synchronised weights and the round's totals.
        events = AdLoCoCallback(start=self._start_rounds, step_end=self._maybe_end_round, end=self._finish_rounds)
        self.callback_handler.callbacks.insert(1, events)

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
        step = self.state.global_step
        # The sampler never runs out, so the Trainer's epoch is max_steps steps long; it counts from the resumed
        # step's position, not from 0, so a resumed run logs the epochs an uninterrupted one does.
        self.state.epoch = step / self.state.max_steps
        round_end = self.worker.is_round_end(step) and step != self.worker.last_synced_step
        stop = self.worker.preemption.after_step(step, steps_to_round_end=self.worker.steps_to_round_end(step))
        if round_end:
            result = self.worker.end_round(step)
            self._after_round(result)
            stop = stop or result.preempted
        if stop:
            self._stop_for_preemption()  # inside a round, the checkpoint holds every worker's own weights

    def _stop_for_preemption(self) -> None:
        """Save a checkpoint at this step on every worker, then leave the training loop (see `preemption.py`)."""
        self.control.should_save = True
        self.control.should_training_stop = True
        self._preempted_at = self.state.global_step

    def _after_round(self, result: RoundResult) -> None:
        """Save (and push) a merge, count tokens for the Trainer, report `adloco/*` values (same call on every rank)."""
        if result.merge is not None and result.merge.phi is not None:
            self._save_merge(result)
        if self.args.include_num_input_tokens_seen != "no":
            self.state.num_input_tokens_seen = self.worker.totals.tokens
        if self.args.logging_strategy != "no":
            self.log(round_logs(result.lines, self.worker.state, self.worker.instances))
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
        if self.args.push_to_hub:
            self.push_at_end_of_training()  # a failure is raised by train() once every callback saw the end

    def train(self, resume_from_checkpoint=None, *args, **kwargs):
        """`Trainer.train`; raises [`TrainingPreempted`] naming the checkpoint written when SIGTERM/SIGINT stopped it.
        The checkpoint to resume from is verified first; `True` takes the newest intact one (`manifest.py`)."""
        self._preempted_at = None
        resume_from_checkpoint = resolve_checkpoint(resume_from_checkpoint, self.args.output_dir)
        self._check_instances_fit(resume_from_checkpoint)
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

    def _check_instances_fit(self, resume_from_checkpoint: str | None) -> None:
        """Every instance needs a worker: a new run's `num_instances`, a resumed run's checkpoint's instances (merges
        may have left fewer than `num_instances`; an elastic resume may have fewer workers, `elastic.py`)."""
        args = self.args
        num_workers = self.worker.num_workers
        if resume_from_checkpoint is not None:
            check_instances_fit(resume_from_checkpoint, num_workers)
        elif args.num_instances > num_workers:
            cpu = (
                " Without a GPU, `accelerate launch --num_processes N` alone starts ONE process: launch with "
                f"`accelerate launch --multi_gpu --num_processes {args.num_instances} train.py` and use_cpu=True "
                "(AdLoCoConfig sets it when no GPU is present), or --config_file accelerate_configs/cpu_4_workers.yaml."
            )
            g = self.worker.processes_per_worker
            launch = f"{args.num_instances} processes" if g == 1 else f"{args.num_instances * g} processes"
            per = "" if g == 1 else f" (processes_per_worker={g})"
            raise ValueError(
                f"num_instances={args.num_instances} exceeds the {num_workers} worker(s) of this launch{per}; lower "
                f"num_instances or launch at least {launch} (accelerate launch --num_processes)."
                + (cpu if args.device.type == "cpu" else "")
            )

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
        dataset, collator = self.train_dataset, self.data_collator
        if is_stream(dataset):
            self._train_loader = adaptive_stream_loader(
                dataset,
                self._get_collator_with_removed_columns(collator, description="training"),
                batch_size=self.args.per_device_train_batch_size,
                num_workers=self.args.world_size,
                rank=self.args.process_index,
                pin_memory=self.args.dataloader_pin_memory,
            )
            self.train_sampler = self._train_loader.dataset
            return self._train_loader
        if isinstance(dataset, datasets.Dataset):
            dataset = self._remove_unused_columns(dataset, description="training")
        else:
            collator = self._get_collator_with_removed_columns(collator, description="training")
        self._train_loader = adaptive_train_loader(
            dataset,
            collator,
            batch_size=self.args.per_device_train_batch_size,
            num_workers=self.args.world_size,
            rank=self.args.process_index,
            seed=self.args.data_seed if self.args.data_seed is not None else self.args.seed,
            pin_memory=self.args.dataloader_pin_memory,
        )
        self.train_sampler = self._train_loader.batch_sampler
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
        args = self.args
        device = self.accelerator.device
        kwargs = {
            "find_unused_parameters": bool(args.ddp_find_unused_parameters),
            "broadcast_buffers": True if args.ddp_broadcast_buffers is None else bool(args.ddp_broadcast_buffers),
        }
        if args.ddp_bucket_cap_mb is not None:
            kwargs["bucket_cap_mb"] = args.ddp_bucket_cap_mb
        if args.ddp_static_graph is not None:
            kwargs["static_graph"] = bool(args.ddp_static_graph)
        ddp = torch.nn.parallel.DistributedDataParallel(
            prepared,
            device_ids=[device] if device.type == "cuda" else None,
            process_group=self.worker.intra_group,
            **kwargs,
        )
        ddp._is_accelerate_prepared = True
        return ddp

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
        with _no_sync(model) if local else contextlib.nullcontext():
            if plan.accumulates:
                loss = self._accumulate(model, inputs, plan, num_items_in_batch, synced=not local)
            else:
                loss = super().training_step(model, inputs, num_items_in_batch)
        tokens = count_tokens(inputs, getattr(self.model, "main_input_name", "input_ids"))
        self.worker.finish_step(plan, loss, batch, tokens)
        if local:
            self.worker.sync_gradients()
        return loss

    def _accumulate(self, model, inputs, plan: StepPlan, num_items_in_batch, synced: bool = True) -> torch.Tensor:
        """Forward/backward each chunk inside one optimizer step; the gradient equals the whole batch's.

        Inside a worker of several processes (DDP) every chunk but the last runs under `no_sync` (`synced`: the
        last one all-reduces the accumulated gradient; else the caller keeps all of them local).

        With `num_items_in_batch` the model normalises every chunk by the whole batch's token count; otherwise the
        Trainer divides each chunk's mean loss by `current_gradient_accumulation_steps`, set here to b / n_j.
        """
        sizes = list(plan.chunk_sizes)
        chunks = split_inputs(inputs, sizes)
        batch = sum(sizes)
        collect = plan.statistics is Statistics.SPLIT
        weights = [n / batch for n in sizes]
        if collect and num_items_in_batch is not None:
            counts = [float(self._get_num_items_in_batch([c], self.args.device)) for c in chunks]
            weights = [c / sum(counts) for c in counts] if sum(counts) > 0 else None
        if collect and weights is not None:
            self.worker.start_statistics(weights)
        saved = getattr(self, "current_gradient_accumulation_steps", 1)
        total = None
        try:
            for index, (chunk, size) in enumerate(zip(chunks, sizes)):
                if collect and weights is not None:
                    self.worker.begin_chunk(index)
                if num_items_in_batch is None:
                    self.current_gradient_accumulation_steps = batch / size
                last = index == len(sizes) - 1
                with contextlib.nullcontext() if last or not synced else _no_sync(model):
                    loss = super().training_step(model, chunk, num_items_in_batch)
                total = loss if total is None else total + loss
        finally:
            self.current_gradient_accumulation_steps = saved
        return total

    def run_probe_step(self, size: int) -> None:
        """Forward and backward on `size` training samples, gradients cleared after (for max_batch_size='auto')."""
        dataset, collator = self._train_loader.dataset, self._train_loader.collate_fn
        if isinstance(self.train_sampler, AdaptiveStreamSampler):
            examples = self.train_sampler.probe_examples(size)  # from a fresh part: no training data is drawn
        else:
            examples = [dataset[i % len(dataset)] for i in range(size)]
        inputs = self._prepare_inputs(collator(examples))
        model = self.model
        model.train()
        try:
            with self.compute_loss_context_manager():
                loss = self.compute_loss(model, inputs)
            self.accelerator.backward(loss)
        finally:
            model.zero_grad(set_to_none=True)

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
        if isinstance(dataset, str):
            name, dataset = dataset, self.eval_dataset[dataset]
            return evaluate_instances(self, self.worker, dataset, ignore_keys, metric_key_prefix, dataset_name=name)
        if isinstance(dataset, dict):
            metrics = {}
            for name, part in dataset.items():
                prefix = f"{metric_key_prefix}_{name}"
                metrics.update(evaluate_instances(self, self.worker, part, ignore_keys, prefix, dataset_name=name))
            return metrics
        return evaluate_instances(self, self.worker, dataset, ignore_keys, metric_key_prefix)

    # ---- checkpoints: per-worker state, written atomically ----
    def _save_checkpoint(self, model, trial) -> None:
        """Every worker's state, staged and renamed into place once all have written (see `staged_save.py`)."""
        save_staged_checkpoint(self, self.worker, trial)

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
        if checkpoint is not None and os.path.isfile(os.path.join(checkpoint, "scheduler.pt")):
            self.lr_scheduler.load_state_dict(torch.load(os.path.join(checkpoint, "scheduler.pt"), weights_only=True))

    def _load_from_checkpoint(self, resume_from_checkpoint: str, model=None) -> None:
        """Load the weights as the Trainer does, then this worker's AdLoCo state (refusing changed settings that
        define the run: `run_settings.py`). A checkpoint written by another number of workers is an elastic resume
        (`elastic.py`): its refusals come before anything is loaded."""
        written = check_rank_states(resume_from_checkpoint, self.args.world_size)
        if written != self.args.world_size and self.worker.fsdp:
            raise ValueError(
                f"{resume_from_checkpoint} was written by {written} processes, this run has {self.args.world_size}: "
                "an elastic resume is not supported with worker_parallelism='fsdp' yet; resume with "
                f"{written} processes, or train with worker_parallelism='ddp'."
            )
        check_run_settings(resume_from_checkpoint, run_settings(self.args, self.accelerator.unwrap_model(self.model)))
        rank, world_size = self.args.process_index, self.args.world_size
        if written == world_size:
            state = load_rank_state(resume_from_checkpoint, rank)
        else:
            state = elastic_rank_state(resume_from_checkpoint, rank, world_size)
        if self.worker.fsdp:
            self._load_sharded_weights(resume_from_checkpoint)
        else:
            super()._load_from_checkpoint(resume_from_checkpoint, model)
        self.worker.load_state_dict(state)

    def _load_sharded_weights(self, checkpoint: str) -> None:
        """worker_parallelism="fsdp": every process reads the checkpoint's full safetensors and keeps its own rows
        (no communication). AdLoCo's φ and the round's weights, restored next, overwrite the trainables anyway."""
        import glob

        import safetensors.torch

        from ..worker.fsdp import load_full_state_dict

        full = {}
        for path in sorted(glob.glob(os.path.join(checkpoint, "*.safetensors"))):
            full.update(safetensors.torch.load_file(path))
        if not full:
            raise FileNotFoundError(
                f"{checkpoint} holds no *.safetensors model files to resume the sharded model from"
            )
        missing = load_full_state_dict(self.accelerator.unwrap_model(self.model), full)
        tied = set(getattr(self.accelerator.unwrap_model(self.model), "_tied_weights_keys", None) or ())
        missing = [name for name in missing if name not in tied]
        if missing:
            logger.warning(
                "%s lacks %d tensors of the model (kept as built): %s", checkpoint, len(missing), missing[:5]
            )

    def _init_training_state(self, max_steps, *args, **kwargs):
        """On resume the Trainer takes logging/eval/save steps from the checkpoint's trainer_state.json: this run's
        win (validated as multiples of inner_steps). Maintenance note: private in transformers 5.23."""
        trained = super()._init_training_state(max_steps, *args, **kwargs)
        self.state.compute_steps(self.args, max_steps)
        return trained

    def end(self) -> None:
        """Wait for every worker, then finish the trackers and destroy the process groups (call it last).

        A worker that leaves with a live gloo group while another still uses its own can abort ("terminate called
        without an active exception"), so the workers leave together. A script that never calls it still has its
        process groups destroyed at interpreter exit (`destroy_process_groups_at_exit`).
        """
        self.worker.monitor.check("end of training")
        super().end()

    # ---- merges and the merged model ----
    def _save_global_weights(self, folder: str, phi, *, title: str, extra: dict | None = None) -> str:
        """Save flat global weights as a `from_pretrained` folder with a model card (on the writing rank). With
        worker_parallelism="fsdp", `phi` is the full state dict already gathered (`Worker.full_save_state`)."""
        card = self.render_card(folder, title)
        if isinstance(phi, dict):
            return save_model_folder(
                folder,
                self.accelerator.unwrap_model(self.model),
                state_dict=phi,
                processing_class=self.processing_class,
                card=card,
                extra_files=extra,
            )
        return save_global_weights(
            folder,
            self.accelerator.unwrap_model(self.model),
            self.worker.global_model.views_of(phi),
            processing_class=self.processing_class,
            card=card,
            extra_files=extra,
        )

    def _save_merge(self, result: RoundResult) -> None:
        """`merges/outer-N/` on global rank 0, pushed to the Hub with `push_to_hub=True`."""
        merge, round_number = result.merge, result.lines[0].outer_step
        folder = os.path.join(self.args.output_dir, "merges", f"outer-{round_number}")
        info = merge_record(merge.plan, round_number)
        title = f"AdLoCo merge at round {round_number}"
        with save_errors(folder, self.args.output_dir, self.worker.monitor.report):
            self._save_global_weights(folder, merge.phi, title=title, extra={"adloco_merge.json": info})
        if self.args.push_to_hub:
            # A failed upload is retried, then logged at WARNING: training goes on, the merge is on disk.
            self.push_during_training(
                folder, path_in_repo=f"merges/outer-{round_number}", commit_message=f"Merge at round {round_number}"
            )

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
