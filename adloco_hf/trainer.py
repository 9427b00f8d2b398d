"""`AdLoCoTrainer`: the HF `Trainer` with AdLoCo's inner loop; the rounds themselves live in `AdLoCoCallback`."""

import logging
import math
import os
import shutil
import time
from typing import Any

import datasets
import torch
from torch.utils.data import DataLoader, Subset
from transformers import Trainer
from transformers.trainer_callback import ExportableState
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR, rotate_checkpoints, speed_metrics

from .callback import AdLoCoCallback
from .checkpoint import (
    RANK_STATE_DIR,
    create_hub_repo,
    load_rank_state,
    model_card,
    push_folder,
    save_rank_state,
)
from .config import AdLoCoConfig
from .distributed import all_gather_rows, barrier
from .sampler import AdaptiveBatchSampler
from .switch_mode import split_sizes


__all__ = ["AdLoCoTrainer"]

logger = logging.getLogger(__name__)

TRAINER_STATE_NAME = "trainer_state.json"


def _batch_length(inputs: dict[str, Any]) -> int:
    for value in inputs.values():
        if torch.is_tensor(value) and value.dim() > 0:
            return value.shape[0]
    raise ValueError("could not find a batched tensor in the inputs to split into micro-batches")


def _split_batch(inputs: dict[str, Any], sizes: list[int]) -> list[dict[str, Any]]:
    batch = _batch_length(inputs)
    chunks = [{} for _ in sizes]
    for key, value in inputs.items():
        if torch.is_tensor(value) and value.dim() > 0 and value.shape[0] == batch:
            for chunk, part in zip(chunks, torch.split(value, sizes)):
                chunk[key] = part
        else:
            for chunk in chunks:
                chunk[key] = value
    return chunks


def _perplexity(loss: float) -> float:
    return math.exp(loss) if loss < 700 else math.inf


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
            `processing_class`, `callbacks`, ...). `train_dataset` must have a length (map-style).

    Example:
    ```python
    from adloco_hf import AdLoCoConfig, AdLoCoTrainer

    args = AdLoCoConfig(output_dir="out", max_steps=2000, inner_steps=100, num_instances=4,
                        per_device_train_batch_size=4, learning_rate=3e-4)
    trainer = AdLoCoTrainer(model=model, args=args, train_dataset=train, eval_dataset=valid)
    trainer.train()                  # accelerate launch --num_processes 4 train.py
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
        if args.num_instances > args.world_size:
            raise ValueError(
                f"num_instances={args.num_instances} exceeds the {args.world_size} worker(s) of this launch; lower "
                f"num_instances or launch at least {args.num_instances} processes (accelerate launch --num_processes)"
            )
        if args.eval_strategy != "no" and self.eval_dataset is None:
            raise ValueError(
                f"eval_strategy={args.eval_strategy.value!r} asks for evaluation but no eval_dataset was given; pass "
                "eval_dataset=... or set eval_strategy='no'"
            )
        self.train_sampler: AdaptiveBatchSampler | None = None
        self._train_loader: DataLoader | None = None
        self.adloco = AdLoCoCallback(self)
        # Right after DefaultFlowCallback, before reporting and user callbacks: at a round's end they then see the
        # synchronised weights and the round's totals.
        self.callback_handler.callbacks.insert(1, self.adloco)

    # ---- data: a plain DataLoader over the adaptive sampler ----
    def get_train_dataloader(self) -> DataLoader:
        """Not prepared by accelerate: `BatchSamplerShard` would freeze the batch size; `_prepare_inputs` moves data."""
        if self.train_dataset is None:
            raise ValueError("AdLoCoTrainer: training requires a train_dataset.")
        dataset, collator = self.train_dataset, self.data_collator
        if isinstance(dataset, datasets.Dataset):
            dataset = self._remove_unused_columns(dataset, description="training")
        else:
            collator = self._get_collator_with_removed_columns(collator, description="training")
        if isinstance(dataset, torch.utils.data.IterableDataset) or not hasattr(dataset, "__len__"):
            raise ValueError(
                "train_dataset must be map-style (with a length): each worker takes a disjoint shard of its indices; "
                "materialise a streamed dataset first (e.g. Dataset.from_generator or .take(n))"
            )
        world, initial = self.args.world_size, self.args.per_device_train_batch_size
        if len(dataset) // world < initial:
            raise ValueError(
                f"train_dataset has {len(dataset)} samples: {len(dataset) // world} per worker for {world} worker(s), "
                f"fewer than per_device_train_batch_size={initial}; use more data or a smaller initial batch"
            )
        self.train_sampler = AdaptiveBatchSampler(
            len(dataset),
            batch_size=initial,
            num_workers=world,
            rank=self.args.process_index,
            seed=self.args.data_seed if self.args.data_seed is not None else self.args.seed,
        )
        self._train_loader = DataLoader(
            dataset,
            batch_sampler=self.train_sampler,
            collate_fn=collator,
            num_workers=0,
            pin_memory=self.args.dataloader_pin_memory,
        )
        return self._train_loader

    # ---- no DDP ----
    def _wrap_model(self, model, training: bool = True, dataloader=None):
        """Skip DDP: workers synchronise once per round. `prepare_model(evaluation_mode=True)` still applies device
        placement and autocast, and marks the model prepared so the later `accelerator.prepare(model, optimizer)`
        only wraps the optimizer (GradScaler)."""
        if self.accelerator.unwrap_model(model, keep_torch_compile=False) is not model:
            return model
        if training:
            return self.accelerator.prepare_model(model, evaluation_mode=True)
        return model

    def _track_num_input_tokens(self, inputs):
        """Counted locally and summed once per round by the callback: the Trainer's per-step all-gather would
        synchronise the workers every step."""

    # ---- one inner step: switch mode and gradient statistics ----
    def training_step(self, model, inputs, num_items_in_batch=None) -> torch.Tensor:
        engine = self.adloco
        batch = _batch_length(inputs)
        mode, remember = engine.statistics_plan(self.state.global_step)
        if mode == "split" and batch < 2:
            mode = None
        parts = engine.plan.accumulation_steps if engine.plan.accumulates else (2 if mode == "split" else 1)
        parts = min(parts, batch)
        if parts == 1:
            loss = super().training_step(model, inputs, num_items_in_batch)
        else:
            loss = self._accumulate(model, inputs, split_sizes(batch, parts), num_items_in_batch, mode == "split")
        if mode is not None or remember:
            scale = self._loss_scale()
            if mode == "split" and engine.collector.active:
                engine.record_statistics(engine.collector.finish(samples=batch, loss_scale=scale))
            elif mode == "previous":
                engine.record_statistics(engine.collector.finish_with_previous(loss_scale=scale))
            if remember:
                engine.collector.remember(loss_scale=scale)
        engine.record_step(loss, batch, self._count_tokens(inputs))
        return loss

    def _accumulate(self, model, inputs, sizes, num_items_in_batch, collect: bool) -> torch.Tensor:
        """Forward/backward each chunk inside one optimizer step; the gradient equals the whole batch's.

        With `num_items_in_batch` the model normalises every chunk by the whole batch's token count; otherwise the
        Trainer divides each chunk's mean loss by `current_gradient_accumulation_steps`, set here to b / n_j.
        """
        chunks = _split_batch(inputs, sizes)
        batch = sum(sizes)
        weights = [n / batch for n in sizes]
        if collect and num_items_in_batch is not None:
            counts = [float(self._get_num_items_in_batch([c], self.args.device)) for c in chunks]
            weights = [c / sum(counts) for c in counts] if sum(counts) > 0 else None
        if collect and weights is not None:
            self.adloco.collector.start(weights)
        saved = getattr(self, "current_gradient_accumulation_steps", 1)
        total = None
        try:
            for index, (chunk, size) in enumerate(zip(chunks, sizes)):
                if collect and weights is not None:
                    self.adloco.collector.begin_chunk(index)
                if num_items_in_batch is None:
                    self.current_gradient_accumulation_steps = batch / size
                loss = super().training_step(model, chunk, num_items_in_batch)
                total = loss if total is None else total + loss
        finally:
            self.current_gradient_accumulation_steps = saved
        return total

    def _loss_scale(self) -> float:
        scaler = self.accelerator.scaler
        return float(scaler.get_scale()) if scaler is not None and scaler.is_enabled() else 1.0

    def _count_tokens(self, inputs) -> torch.Tensor | int:
        if "attention_mask" in inputs and torch.is_tensor(inputs["attention_mask"]):
            return inputs["attention_mask"].sum()
        name = getattr(self.model, "main_input_name", "input_ids")
        value = inputs.get(name)
        return value.numel() if torch.is_tensor(value) else 0

    def run_probe_step(self, size: int) -> None:
        """Forward and backward on `size` training samples, gradients cleared after (for max_batch_size='auto')."""
        dataset, collator = self._train_loader.dataset, self._train_loader.collate_fn
        inputs = self._prepare_inputs(collator([dataset[i % len(dataset)] for i in range(size)]))
        model = self.model
        model.train()
        try:
            with self.compute_loss_context_manager():
                loss = self.compute_loss(model, inputs)
            self.accelerator.backward(loss)
        finally:
            model.zero_grad(set_to_none=True)

    # ---- evaluation: one perplexity per instance ----
    def evaluate(self, eval_dataset=None, ignore_keys=None, metric_key_prefix: str = "eval") -> dict[str, float]:
        """Exact token-weighted loss and perplexity of every model being trained.

        While several instances train, each instance's global model is evaluated on the whole eval set by its own
        workers (each takes a shard) and logged as `{prefix}_instance_{i}_loss` / `_perplexity`; `{prefix}_loss` is
        their demand-weighted mean. With one instance (or after the final merge) all workers share the eval set.
        `compute_metrics` runs through the Trainer's `evaluation_loop` whenever a single model is evaluated.
        """
        dataset = eval_dataset if eval_dataset is not None else self.eval_dataset
        if dataset is None:
            raise ValueError("AdLoCoTrainer.evaluate needs an eval_dataset.")
        if isinstance(dataset, dict):
            metrics = {}
            for name, part in dataset.items():
                metrics.update(self.evaluate(part, ignore_keys, f"{metric_key_prefix}_{name}"))
            return metrics
        self._memory_tracker.start()
        start = time.time()
        engine = self.adloco
        single = engine.final_merged or len(engine.instances) <= 1
        metrics = {}
        if single and self.compute_metrics is not None:
            output = self.evaluation_loop(
                self.get_eval_dataloader(dataset),
                "Evaluation",
                ignore_keys=ignore_keys,
                metric_key_prefix=metric_key_prefix,
            )
            metrics.update({k: v for k, v in output.metrics.items() if k != f"{metric_key_prefix}_loss"})
        losses = self._evaluation_losses(dataset, single)
        label = "merged" if engine.final_merged else None
        if single:
            loss = losses[next(iter(losses))]
            metrics[f"{metric_key_prefix}_loss"] = loss
            metrics[f"{metric_key_prefix}_perplexity"] = _perplexity(loss)
            evals = [(label if label is not None else next(iter(losses)), loss)]
        else:
            demand = {inst.id: inst.demand for inst in engine.instances}
            for instance_id, loss in losses.items():
                metrics[f"{metric_key_prefix}_instance_{instance_id}_loss"] = loss
                metrics[f"{metric_key_prefix}_instance_{instance_id}_perplexity"] = _perplexity(loss)
            weighted = sum(demand[i] * loss for i, loss in losses.items()) / sum(demand.values())
            metrics[f"{metric_key_prefix}_loss"] = weighted
            metrics[f"{metric_key_prefix}_perplexity"] = _perplexity(weighted)
            evals = list(losses.items())
        metrics.update(speed_metrics(metric_key_prefix, start, num_samples=len(dataset)))
        self._write_eval_lines(evals)
        self.log(metrics)
        self.control = self.callback_handler.on_evaluate(self.args, self.state, self.control, metrics)
        self._memory_tracker.stop_and_update_metrics(metrics)
        return metrics

    @torch.no_grad()
    def _evaluation_losses(self, dataset, single: bool) -> dict[int, float]:
        """{instance id: mean loss per token (per sample for models without labels to count)} on the whole set."""
        engine = self.adloco
        if isinstance(dataset, datasets.Dataset):
            dataset = self._remove_unused_columns(dataset, description="evaluation")
            collator = self.data_collator
        else:
            collator = self._get_collator_with_removed_columns(self.data_collator, description="evaluation")
        rank = self.args.process_index
        if single:
            group_id, members = (engine.instances[0].id if engine.instances else 0), list(range(self.args.world_size))
        else:
            group_id, members = engine.instance.id, list(engine.instance.workers)
        shard = Subset(dataset, range(members.index(rank), len(dataset), len(members)))
        loader = DataLoader(shard, batch_size=self.args.eval_batch_size, collate_fn=collator)
        model = self.model
        model.eval()
        loss_sum, count = 0.0, 0.0
        for inputs in loader:
            inputs = self._prepare_inputs(inputs)
            items = self._get_num_items_in_batch([inputs], self.args.device)
            items = float(items) if items is not None else float(_batch_length(inputs))
            with self.compute_loss_context_manager():
                loss = self.compute_loss(
                    model, inputs, num_items_in_batch=items if self.model_accepts_loss_kwargs else None
                )
            # A loss normalised by `items` is a sum over items divided by `items`; a mean loss is multiplied back.
            loss_sum += float(loss) * items
            count += items
        rows = all_gather_rows([group_id, loss_sum, count], self.args.device)
        totals: dict[int, list[float]] = {}
        for row in rows:
            total = totals.setdefault(int(row[0]), [0.0, 0.0])
            total[0] += row[1]
            total[1] += row[2]
        return {i: s / max(c, 1.0) for i, (s, c) in sorted(totals.items())}

    def _write_eval_lines(self, evals: list[tuple[Any, float]]) -> None:
        if not self.is_world_process_zero():
            return
        engine = self.adloco
        self.adloco.run_log.write_eval(
            [
                {
                    "global_step": self.state.global_step,
                    "outer_step": engine.outer_step,
                    "total_tokens": engine.totals["tokens"],
                    "instance": label,
                    "eval_loss": loss,
                    "eval_perplexity": _perplexity(loss),
                }
                for label, loss in evals
            ]
        )

    # ---- checkpoints: per-worker state, written atomically ----
    def _save_checkpoint(self, model, trial) -> None:
        """Maintenance note: follows `Trainer._save_checkpoint` (5.23) but writes into a staging folder renamed into
        place once every worker has written, and adds `checkpoint-N/adloco/rank-R.pt` (inner optimizer, sampler,
        scaler, instance state) for each worker, since the Trainer saves rank 0's optimizer only."""
        step = self.state.global_step
        run_dir = self._get_output_dir(trial=trial)
        final_dir = os.path.join(run_dir, f"{PREFIX_CHECKPOINT_DIR}-{step}")
        staging = os.path.join(run_dir, f".tmp-{PREFIX_CHECKPOINT_DIR}-{step}")
        if self.args.should_save:
            shutil.rmtree(staging, ignore_errors=True)
            os.makedirs(staging, exist_ok=True)
        barrier()
        if self.hp_search_backend is None and trial is None:
            self.store_flos()
        self.save_model(staging, _internal_call=True)
        if not self.args.save_only_model:
            self._save_optimizer_and_scheduler(staging)
            self._save_scaler(staging)
            self._save_rng_state(staging)
            save_rank_state(staging, self.args.process_index, self.adloco.state_dict())
        barrier()
        if self.args.should_save:
            if self.state.best_global_step:
                best = os.path.join(run_dir, f"{PREFIX_CHECKPOINT_DIR}-{self.state.best_global_step}")
                if os.path.exists(best) or self.state.best_global_step == step:
                    self.state.best_model_checkpoint = best
            for cb in [c for c in self.callback_handler.callbacks + [self.control] if isinstance(c, ExportableState)]:
                name = cb.__class__.__name__
                if isinstance(self.state.stateful_callbacks.get(name), list):
                    self.state.stateful_callbacks[name].append(cb.state())
                else:
                    self.state.stateful_callbacks[name] = cb.state()
            self.state.save_to_json(os.path.join(staging, TRAINER_STATE_NAME))
            aside = None
            if os.path.exists(final_dir):
                aside = os.path.join(run_dir, f".old-{PREFIX_CHECKPOINT_DIR}-{step}")
                shutil.rmtree(aside, ignore_errors=True)
                os.replace(final_dir, aside)
            os.replace(staging, final_dir)
            if aside is not None:
                shutil.rmtree(aside, ignore_errors=True)
            rotate_checkpoints(
                output_dir=run_dir,
                save_total_limit=self.args.save_total_limit,
                best_model_checkpoint=self.state.best_model_checkpoint,
                use_mtime=True,
            )
        barrier()

    def _load_from_checkpoint(self, resume_from_checkpoint: str, model=None) -> None:
        """Load the weights as the Trainer does, then this worker's AdLoCo state (refusing another world size)."""
        state_dir = os.path.join(resume_from_checkpoint, RANK_STATE_DIR)
        if not os.path.isdir(state_dir):
            raise ValueError(
                f"{resume_from_checkpoint} has no {RANK_STATE_DIR}/ folder: it was not written by AdLoCoTrainer "
                "(or was saved with save_only_model=True); start a new run from its weights instead"
            )
        saved = sorted(f for f in os.listdir(state_dir) if f.startswith("rank-") and f.endswith(".pt"))
        if len(saved) != self.args.world_size:
            raise ValueError(
                f"{resume_from_checkpoint} was written by {len(saved)} workers but this run has "
                f"{self.args.world_size}; resume with {len(saved)} processes (per-worker optimizer, data and "
                "instance state cannot be split or joined)"
            )
        super()._load_from_checkpoint(resume_from_checkpoint, model)
        self.adloco.load_resume_state(load_rank_state(resume_from_checkpoint, self.args.process_index))

    def end(self) -> None:
        """Wait for every worker, then finish the trackers and destroy the process groups (call it last).

        A worker that leaves with a live gloo group while another still uses its own can abort ("terminate called
        without an active exception"), so the workers leave together. A script that never calls it still has its
        process groups destroyed at interpreter exit (`destroy_process_groups_at_exit`).
        """
        barrier()
        super().end()

    # ---- the merged model ----
    def save_merged_model(self, output_dir: str | None = None) -> str:
        """Merge the surviving instances (demand-weighted) into every worker's model and save it on rank 0.

        Collective: call it on every worker. Training calls it at the end and writes `{output_dir}/merged/`.
        Returns the folder.
        """
        engine = self.adloco
        folder = output_dir or os.path.join(self.args.output_dir, "merged")
        engine.merge_instances()
        if self.is_world_process_zero():
            engine.save_weights(folder, engine.global_model.phi.detach(), title="AdLoCo merged model")
            logger.info("saved the merged model to %s", folder)
        barrier()
        return folder

    def push_merged_to_hub(
        self,
        repo_id: str | None = None,
        *,
        commit_message: str = "AdLoCo merged model",
        token: str | None = None,
        private: bool | None = None,
        revision: str | None = None,
    ):
        """Upload `{output_dir}/merged/` (saved first if missing) to the Hub from global rank 0 (collective)."""
        folder = os.path.join(self.args.output_dir, "merged")
        if not os.path.isdir(folder) or not self.adloco.final_merged:
            self.save_merged_model(folder)
        result = None
        if self.is_world_process_zero():
            result = push_folder(
                folder,
                repo_id=repo_id
                or self.hub_model_id
                or self.args.hub_model_id
                or os.path.basename(os.path.abspath(self.args.output_dir)),
                commit_message=commit_message,
                token=token if token is not None else self.args.hub_token,
                private=private if private is not None else self.args.hub_private_repo,
                revision=revision if revision is not None else self.args.hub_revision,
            )
        barrier()
        return result

    def push_folder_to_hub(self, folder: str, *, path_in_repo: str | None, message: str):
        """Upload a folder to `hub_model_id` (global rank 0 only; used for merges when `push_to_hub=True`)."""
        if not self.is_world_process_zero():
            return None
        return push_folder(
            folder,
            repo_id=self.hub_model_id
            or self.args.hub_model_id
            or os.path.basename(os.path.abspath(self.args.output_dir)),
            path_in_repo=path_in_repo,
            commit_message=message,
            token=self.args.hub_token,
            private=self.args.hub_private_repo,
            revision=self.args.hub_revision,
        )

    def push_to_hub(
        self,
        commit_message: str | None = "End of training",
        blocking: bool = True,
        token=None,
        revision=None,
        private=None,
        **kwargs,
    ):
        """The model worth sharing is the merged one: same as `push_merged_to_hub`."""
        return self.push_merged_to_hub(
            commit_message=commit_message or "AdLoCo merged model", token=token, revision=revision, private=private
        )

    def init_hf_repo(self, token: str | None = None, private: bool | None = None) -> None:
        """Create the repo through the same Hub client as every other upload of this trainer."""
        if not self.is_world_process_zero():
            return
        repo_name = self.args.hub_model_id or os.path.basename(os.path.abspath(self.args.output_dir))
        self.hub_model_id = create_hub_repo(
            repo_name,
            token=token if token is not None else self.args.hub_token,
            private=private if private is not None else self.args.hub_private_repo,
        )
        self.push_in_progress = None

    def _push_from_checkpoint(self, checkpoint_folder: str) -> None:
        """Checkpoints hold per-worker resume state and stay local; merges and the merged model go to the Hub."""

    def create_model_card(self, *args, **kwargs) -> None:
        """The merged model's card is written by `save_merged_model`."""
        card = model_card(
            title="AdLoCo merged model", settings=self.args.adloco_settings, summary=self.adloco.summary()
        )
        if self.is_world_process_zero():
            with open(os.path.join(self.args.output_dir, "README.md"), "w", encoding="utf-8") as f:
                f.write(card)
