"""Evaluation while several instances train: every instance's own model, on the whole eval set, token-weighted.

Each instance's workers share the eval set (each takes a shard), so every instance is evaluated in the time one
model takes on its workers; one scalar all-gather pools the sums. With one instance (or after the final merge)
all workers share the set.
"""

import math
import time
from typing import Any

import datasets
import torch
from torch.utils.data import DataLoader, Subset
from transformers import Trainer
from transformers.trainer_utils import speed_metrics

from .batches import batch_length
from .distributed import all_gather_rows
from .worker import Worker


__all__ = ["evaluate_instances", "instance_losses", "perplexity"]


def perplexity(loss: float) -> float:
    return math.exp(loss) if loss < 700 else math.inf


def evaluate_instances(
    trainer: Trainer, worker: Worker, dataset, ignore_keys, metric_key_prefix: str = "eval"
) -> dict[str, float]:
    """The metrics of `AdLoCoTrainer.evaluate` for one eval dataset (see its docstring); logs them, fires
    `on_evaluate` and appends to `adloco_eval.jsonl` (collective: every rank)."""
    trainer._memory_tracker.start()
    start = time.time()
    single = worker.final_merged or len(worker.instances) <= 1
    metrics = {}
    if single and trainer.compute_metrics is not None:
        output = trainer.evaluation_loop(
            trainer.get_eval_dataloader(dataset),
            "Evaluation",
            ignore_keys=ignore_keys,
            metric_key_prefix=metric_key_prefix,
        )
        metrics.update({k: v for k, v in output.metrics.items() if k != f"{metric_key_prefix}_loss"})
    losses = instance_losses(trainer, worker, dataset, single)
    label = "merged" if worker.final_merged else None
    if single:
        loss = losses[next(iter(losses))]
        metrics[f"{metric_key_prefix}_loss"] = loss
        metrics[f"{metric_key_prefix}_perplexity"] = perplexity(loss)
        evals = [(label if label is not None else next(iter(losses)), loss)]
    else:
        demand = {inst.id: inst.demand for inst in worker.instances}
        for instance_id, loss in losses.items():
            metrics[f"{metric_key_prefix}_instance_{instance_id}_loss"] = loss
            metrics[f"{metric_key_prefix}_instance_{instance_id}_perplexity"] = perplexity(loss)
        weighted = sum(demand[i] * loss for i, loss in losses.items()) / sum(demand.values())
        metrics[f"{metric_key_prefix}_loss"] = weighted
        metrics[f"{metric_key_prefix}_perplexity"] = perplexity(weighted)
        evals = list(losses.items())
    metrics.update(speed_metrics(metric_key_prefix, start, num_samples=len(dataset)))
    if trainer.is_world_process_zero():
        _write_eval_lines(trainer, worker, evals)
    trainer.log(metrics)
    trainer.control = trainer.callback_handler.on_evaluate(trainer.args, trainer.state, trainer.control, metrics)
    trainer._memory_tracker.stop_and_update_metrics(metrics)
    return metrics


@torch.no_grad()
def instance_losses(trainer: Trainer, worker: Worker, dataset, single: bool) -> dict[int, float]:
    """{instance id: mean loss per token (per sample for models without labels to count)} on the whole set."""
    if isinstance(dataset, datasets.Dataset):
        dataset = trainer._remove_unused_columns(dataset, description="evaluation")
        collator = trainer.data_collator
    else:
        collator = trainer._get_collator_with_removed_columns(trainer.data_collator, description="evaluation")
    args = trainer.args
    rank = args.process_index
    if single:
        group_id, members = (worker.instances[0].id if worker.instances else 0), list(range(args.world_size))
    else:
        group_id, members = worker.instance.id, list(worker.instance.workers)
    shard = Subset(dataset, range(members.index(rank), len(dataset), len(members)))
    loader = DataLoader(shard, batch_size=args.eval_batch_size, collate_fn=collator)
    model = trainer.model
    model.eval()
    loss_sum, count = 0.0, 0.0
    for inputs in loader:
        inputs = trainer._prepare_inputs(inputs)
        items = trainer._get_num_items_in_batch([inputs], args.device)
        items = float(items) if items is not None else float(batch_length(inputs))
        with trainer.compute_loss_context_manager():
            loss = trainer.compute_loss(
                model, inputs, num_items_in_batch=items if trainer.model_accepts_loss_kwargs else None
            )
        # A loss normalised by `items` is a sum over items divided by `items`; a mean loss is multiplied back.
        loss_sum += float(loss) * items
        count += items
    rows = all_gather_rows([group_id, loss_sum, count], args.device)
    totals: dict[int, list[float]] = {}
    for row in rows:
        total = totals.setdefault(int(row[0]), [0.0, 0.0])
        total[0] += row[1]
        total[1] += row[2]
    return {i: s / max(c, 1.0) for i, (s, c) in sorted(totals.items())}


def _write_eval_lines(trainer: Trainer, worker: Worker, evals: list[tuple[Any, float]]) -> None:
    state = worker.state
    worker.run_log.write_eval(
        [
            {
                "global_step": trainer.state.global_step,
                "outer_step": state.rounds,
                "total_tokens": state.tokens,
                "instance": label,
                "eval_loss": loss,
                "eval_perplexity": perplexity(loss),
            }
            for label, loss in evals
        ]
    )
