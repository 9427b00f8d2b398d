"""Evaluation while several instances train: every instance's own model, on the whole eval set.

Each instance's workers share the eval set (each predicts a contiguous shard, `adloco_hf.predictions`), so every
instance is evaluated in the time one model takes on its workers. The loss is exact and token-weighted (one scalar
all-gather pools the sums); `compute_metrics` runs once per instance, on its first worker, over the instance's whole
eval set, and every rank logs every instance's metrics. With one instance (or after the final merge) all workers
share the set and `compute_metrics` runs through the Trainer's own `evaluation_loop`.

Perplexity is reported for causal language models only (`predictions.is_causal_lm`): a classifier's loss is a
cross-entropy over labels, not over tokens.
"""

import math
import time
from typing import Any

from transformers import Trainer
from transformers.trainer_utils import speed_metrics

from .predictions import ShardOutput, is_causal_lm, predict_shard, share_instance_metrics
from .run_log import MERGED
from .worker import Worker


__all__ = ["combine_instance_metrics", "evaluate_instances", "instance_losses", "perplexity"]

_NOT_METRICS = ("runtime", "samples_per_second", "steps_per_second", "model_preparation_time")


def perplexity(loss: float) -> float:
    return math.exp(loss) if loss < 700 else math.inf


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _with_perplexity(values: dict[str, Any], causal_lm: bool) -> dict[str, Any]:
    """An instance's metrics with the perplexity of its loss added, for a causal LM (it replaces any `perplexity` of
    `compute_metrics`; other models keep theirs, if any)."""
    values = dict(values)
    if causal_lm and _is_number(values.get("loss")):
        values["perplexity"] = perplexity(values["loss"])
    return values


def combine_instance_metrics(
    per_instance: dict[int, dict[str, Any]], demand: dict[int, float], prefix: str, causal_lm: bool
) -> dict[str, Any]:
    """The metrics of several instances, as `AdLoCoTrainer.evaluate` returns them.

    Every metric of instance i is `{prefix}_instance_{i}_{name}`. The top-level `{prefix}_{name}` of a numeric metric
    is the demand-weighted mean over the instances that report it: a mean of the instances' values, not the value of
    any one model (the merged model is evaluated at the end as `eval_merged_*`). A causal LM's `{prefix}_perplexity`
    is the perplexity of that mean loss.
    """
    metrics: dict[str, Any] = {}
    names: dict[str, None] = {}
    for instance_id, values in per_instance.items():
        for name, value in _with_perplexity(values, causal_lm).items():
            metrics[f"{prefix}_instance_{instance_id}_{name}"] = value
            names.setdefault(name)
    for name in names:
        if causal_lm and name == "perplexity":
            continue
        pairs = [(demand[i], v[name]) for i, v in per_instance.items() if _is_number(v.get(name))]
        weight = sum(d for d, _ in pairs)
        if pairs and weight > 0:
            metrics[f"{prefix}_{name}"] = sum(d * value for d, value in pairs) / weight
    if causal_lm and _is_number(metrics.get(f"{prefix}_loss")):
        metrics[f"{prefix}_perplexity"] = perplexity(metrics[f"{prefix}_loss"])
    return metrics


def evaluate_instances(
    trainer: Trainer,
    worker: Worker,
    dataset,
    ignore_keys,
    metric_key_prefix: str = "eval",
    dataset_name: str | None = None,
) -> dict[str, Any]:
    """The metrics of `AdLoCoTrainer.evaluate` for one eval dataset (see its docstring); logs them, fires
    `on_evaluate` and appends one line per model to `adloco_eval.jsonl`, naming `dataset_name` (collective: every
    rank)."""
    trainer._memory_tracker.start()
    start = time.time()
    single = worker.final_merged or len(worker.instances) <= 1
    causal_lm = is_causal_lm(trainer.model)
    metrics: dict[str, Any] = {}
    if single:
        custom = {}
        if trainer.compute_metrics is not None:
            output = trainer.evaluation_loop(
                trainer.get_eval_dataloader(dataset),
                "Evaluation",
                ignore_keys=ignore_keys,
                metric_key_prefix=metric_key_prefix,
            )
            metrics.update({k: v for k, v in output.metrics.items() if k != f"{metric_key_prefix}_loss"})
            custom = {
                name: value
                for key, value in output.metrics.items()
                if (name := key.removeprefix(f"{metric_key_prefix}_")) not in ("loss", *_NOT_METRICS)
            }
        progress = trainer.compute_metrics is None  # else evaluation_loop has reported its own steps
        losses = instance_losses(trainer, worker, dataset, ignore_keys=ignore_keys, progress=progress)
        ((instance_id, loss),) = losses.items()
        values = _with_perplexity({**custom, **({} if loss is None else {"loss": loss})}, causal_lm)
        metrics.update(
            {f"{metric_key_prefix}_{name}": values[name] for name in ("loss", "perplexity") if name in values}
        )
        evals = {MERGED if worker.final_merged else instance_id: values}
    else:
        per_instance = _evaluate_each_instance(trainer, worker, dataset, ignore_keys, metric_key_prefix)
        demand = {inst.id: inst.demand for inst in worker.instances}
        metrics.update(combine_instance_metrics(per_instance, demand, metric_key_prefix, causal_lm))
        evals = {i: _with_perplexity(values, causal_lm) for i, values in per_instance.items()}
    metrics.update(speed_metrics(metric_key_prefix, start, num_samples=len(dataset)))
    if trainer.is_world_process_zero():
        _write_eval_lines(trainer, worker, evals, dataset_name)
    trainer.log(metrics)
    trainer.control = trainer.callback_handler.on_evaluate(trainer.args, trainer.state, trainer.control, metrics)
    trainer._memory_tracker.stop_and_update_metrics(metrics)
    return metrics


def _evaluate_each_instance(trainer: Trainer, worker: Worker, dataset, ignore_keys, prefix: str) -> dict[int, dict]:
    """{instance id: {"loss": ..., **compute_metrics}} for every instance, the same on every rank."""
    args = trainer.args
    collect = trainer.compute_metrics is not None and not args.prediction_loss_only
    inst = worker.instance
    members = list(inst.workers)
    shard = predict_shard(trainer, dataset, members, args.process_index, ignore_keys=ignore_keys, collect=collect)
    losses = _pool_losses(worker, inst.id, shard)
    per_instance = {i: {} for i in losses}
    if collect:
        group = worker.groups.get(members)
        rank = args.process_index
        shared = share_instance_metrics(trainer, shard, members, inst.id, rank, group, prefix, worker.monitor)
        for instance_id, values in shared.items():
            per_instance.setdefault(instance_id, {}).update({k: v for k, v in values.items() if k != "loss"})
    for instance_id, loss in losses.items():
        if loss is not None:
            per_instance[instance_id]["loss"] = loss
    return dict(sorted(per_instance.items()))


def instance_losses(
    trainer: Trainer, worker: Worker, dataset, ignore_keys=None, progress: bool = True
) -> dict[int, float | None]:
    """{id: mean loss per token (per sample for models without labels to count)} of the single model (one instance,
    or the merged one) on the whole set, every worker taking a shard; None when the model gave no loss (no labels).
    Several instances are evaluated by `_evaluate_each_instance`."""
    rank = trainer.args.process_index
    group_id, members = (worker.instances[0].id if worker.instances else 0), list(range(trainer.args.world_size))
    shard = predict_shard(trainer, dataset, members, rank, ignore_keys=ignore_keys, progress=progress)
    return _pool_losses(worker, group_id, shard)


def _pool_losses(worker: Worker, group_id: int, shard: ShardOutput) -> dict[int, float | None]:
    """Every rank's loss sum and weight, pooled per instance (one all-gather over the world, within worker_timeout)."""
    totals: dict[int, list[float]] = {}
    mine = [group_id, shard.loss_sum, shard.count]
    for row in worker.monitor.gather_rows(mine, "evaluation (losses)", worker.resume_hint):
        total = totals.setdefault(int(row[0]), [0.0, 0.0])
        total[0] += row[1]
        total[1] += row[2]
    return {i: (s / c if c > 0 else None) for i, (s, c) in sorted(totals.items())}


def _write_eval_lines(trainer: Trainer, worker: Worker, evals: dict[Any, dict[str, Any]], dataset_name) -> None:
    """One line per evaluated model: where the run stands, the model (`instance`), the dataset's name (None for a
    single eval dataset) and every metric as `eval_{name}`, whatever the dataset's metric prefix."""
    state = worker.state
    lines = []
    for label, values in evals.items():
        line = {
            "global_step": trainer.state.global_step,
            "outer_step": state.rounds,
            "total_tokens": state.tokens,
            "instance": label,
            "dataset": dataset_name,
        }
        # The exact loss (and perplexity) first, then the custom metrics, which never replace them.
        ordered = {name: values[name] for name in ("loss", "perplexity") if name in values}
        ordered.update({name: value for name, value in values.items() if name not in ordered})
        line.update({f"eval_{name}": value for name, value in ordered.items()})
        lines.append(line)
    worker.run_log.write_eval(lines)
