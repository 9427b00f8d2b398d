"""Evaluation while several instances train: every instance's own model, on the whole eval set.

Each instance's workers share the eval set (each predicts a contiguous shard, `adloco_hf.evaluation.predictions`), so every
instance is evaluated in the time one model takes on its workers. The loss is exact and token-weighted (one scalar
all-gather pools the sums); `compute_metrics` runs once per instance, on its first worker, over the instance's whole
eval set, and every rank logs every instance's metrics. With one instance (or after the final merge) all workers
share the set and `compute_metrics` runs through the Trainer's own `evaluation_loop`.

While several instances train, the top-level `eval_loss` is the demand-weighted mean of the instances' losses (also
logged as `eval_instances_mean_loss`): a mean of several models, not the loss of any one of them, and with instances
that drift apart it can be far below what their merge achieves. `eval_merged_model=True` also evaluates the model the
final merge would produce at that point (`merged_model_loaded`) and logs it as `eval_merged_loss`, under the names of
the merged model's evaluation at the end of training.

Perplexity is reported for causal language models only (`predictions.is_causal_lm`): a classifier's loss is a
cross-entropy over labels, not over tokens.
"""

import math
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.distributed as dist
from transformers import Trainer
from transformers.trainer_utils import speed_metrics

from ..common.distributed import comm_device, is_distributed
from ..common.rng import get_rng_state, set_rng_state
from ..common.upstream import trainer_memory_tracker
from ..instances.table import final_merge_weights
from ..reporting.run_log import MERGED
from .predictions import ShardOutput, is_causal_lm, predict_shard, share_instance_metrics
from .view import EvaluationSettings, EvaluationView


__all__ = [
    "evaluate_datasets",
    "combine_instance_metrics",
    "evaluate_instances",
    "instance_losses",
    "merged_model_loaded",
    "merged_weights",
    "perplexity",
]

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
    any one model (the merged model is evaluated at the end as `eval_merged_*`, and at every evaluation with
    `eval_merged_model`). A causal LM's `{prefix}_perplexity` is the perplexity of that mean loss. With several
    instances the mean loss (and that perplexity) is also given under its honest name,
    `{prefix}_instances_mean_loss` (`{prefix}_instances_mean_perplexity`); `{prefix}_loss` stays for compatibility.
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
    if len(per_instance) > 1:
        for name in ("loss", "perplexity"):
            if f"{prefix}_{name}" in metrics:
                metrics[f"{prefix}_instances_mean_{name}"] = metrics[f"{prefix}_{name}"]
    return metrics


def evaluate_datasets(trainer, view: EvaluationView, settings: EvaluationSettings, dataset, ignore_keys, prefix: str):
    """`evaluate_instances` on `dataset`: one dataset, a dict of them (each with the prefix `{prefix}_{name}`), or the
    name of one of `trainer.eval_dataset`'s, as `Trainer.evaluate` takes them; every line of `adloco_eval.jsonl`
    names its `dataset` (None for a single eval dataset)."""
    if isinstance(dataset, str):
        name, dataset = dataset, trainer.eval_dataset[dataset]
        return evaluate_instances(trainer, view, settings, dataset, ignore_keys, prefix, dataset_name=name)
    if isinstance(dataset, dict):
        metrics = {}
        for name, part in dataset.items():
            metrics.update(
                evaluate_instances(trainer, view, settings, part, ignore_keys, f"{prefix}_{name}", dataset_name=name)
            )
        return metrics
    return evaluate_instances(trainer, view, settings, dataset, ignore_keys, prefix)


def evaluate_instances(
    trainer: Trainer,
    view: EvaluationView,
    settings: EvaluationSettings,
    dataset,
    ignore_keys,
    metric_key_prefix: str = "eval",
    dataset_name: str | None = None,
) -> dict[str, Any]:
    """The metrics of `AdLoCoTrainer.evaluate` for one eval dataset (see its docstring); logs them, fires
    `on_evaluate` and appends one line per model to `adloco_eval.jsonl`, naming `dataset_name` (collective: every
    rank). `view` is this process's worker as an evaluation sees it, `settings` the run's evaluation settings."""
    memory = trainer_memory_tracker(trainer)
    memory.start()
    start = time.time()
    single = view.final_merged or len(view.instances) <= 1
    causal_lm = is_causal_lm(trainer.model)
    metrics: dict[str, Any] = {}
    if single:
        instance_id, values, extra = _evaluate_shared_model(
            trainer, view, dataset, ignore_keys, metric_key_prefix, causal_lm
        )
        metrics.update(extra)
        metrics.update(
            {f"{metric_key_prefix}_{name}": values[name] for name in ("loss", "perplexity") if name in values}
        )
        evals = {MERGED if view.final_merged else instance_id: values}
    else:
        per_instance = _evaluate_each_instance(trainer, view, dataset, ignore_keys, metric_key_prefix)
        demand = {inst.id: inst.demand for inst in view.instances}
        metrics.update(combine_instance_metrics(per_instance, demand, metric_key_prefix, causal_lm))
        evals = {i: _with_perplexity(values, causal_lm) for i, values in per_instance.items()}
        if settings.eval_merged_model:
            prefix = f"{metric_key_prefix}_merged"  # the names of the merged model's evaluation at the end
            with merged_model_loaded(view):
                _, values, extra = _evaluate_shared_model(
                    trainer, view, dataset, ignore_keys, prefix, causal_lm, progress=False
                )
            metrics.update(extra)
            metrics.update({f"{prefix}_{name}": values[name] for name in ("loss", "perplexity") if name in values})
            evals[MERGED] = values
    metrics.update(speed_metrics(metric_key_prefix, start, num_samples=len(dataset)))
    if trainer.is_world_process_zero():
        _write_eval_lines(trainer, view, evals, dataset_name)
    trainer.log(metrics)
    trainer.control = trainer.callback_handler.on_evaluate(trainer.args, trainer.state, trainer.control, metrics)
    memory.stop_and_update_metrics(metrics)
    return metrics


def _evaluate_shared_model(
    trainer: Trainer, view: EvaluationView, dataset, ignore_keys, prefix: str, causal_lm: bool, progress: bool = True
) -> tuple[int, dict[str, Any], dict[str, Any]]:
    """The model every worker holds (one instance, the final merge, or `merged_model_loaded`), every worker taking a
    shard of the eval set: (the instance id of `instance_losses`, {"loss", "perplexity", **compute_metrics}, the
    `evaluation_loop` metrics named `{prefix}_*` without the loss). `progress=False` reports no prediction steps."""
    extra: dict[str, Any] = {}
    custom: dict[str, Any] = {}
    if trainer.compute_metrics is not None:
        output = trainer.evaluation_loop(
            trainer.get_eval_dataloader(dataset),
            "Evaluation",
            ignore_keys=ignore_keys,
            metric_key_prefix=prefix,
        )
        extra = {k: v for k, v in output.metrics.items() if k != f"{prefix}_loss"}
        custom = {
            name: value
            for key, value in output.metrics.items()
            if (name := key.removeprefix(f"{prefix}_")) not in ("loss", *_NOT_METRICS)
        }
    progress = progress and trainer.compute_metrics is None  # else evaluation_loop has reported its own steps
    losses = instance_losses(trainer, view, dataset, ignore_keys=ignore_keys, progress=progress)
    ((instance_id, loss),) = losses.items()
    values = _with_perplexity({**custom, **({} if loss is None else {"loss": loss})}, causal_lm)
    return instance_id, values, extra


@torch.no_grad()
def merged_weights(view: EvaluationView) -> torch.Tensor:
    """The global weights the final merge would produce now: Σ_i w_i φ_i over the instances, with the final merge's
    weights (`instances.final_merge_weights`: demand-weighted over the instances that trained), flat float32 on the
    communication device (`distributed.comm_device`: the GPU with NCCL, the CPU with gloo), on every rank.

    Collective: one all-reduce (a sum) over the world, to which each worker of instance i adds w_i / n_i × its φ
    (n_i: the instance's workers; zeros for a weight of 0, so that nothing non-finite leaks in). It costs a float32
    copy of the trainable weights in memory and 4 bytes per trainable parameter all-reduced over all P workers
    (2 (P − 1) / P of that per worker on a ring): evaluation traffic, not counted in `comm_bytes`. With
    `outer_overlap`, φ is the instances' consensus without the average still in flight.
    """
    global_model = view.global_model
    phi = global_model.phi.detach()
    device = comm_device(phi.device)
    inst = view.instance
    share = final_merge_weights(view.instances)[inst.id] / len(inst.workers)
    if share == 0:
        total = torch.zeros(phi.shape, dtype=torch.float32, device=device)
    else:
        total = phi.to(device, torch.float32).mul(share)  # a new tensor: φ itself is never touched
    if is_distributed() and view.num_workers > 1:
        # This local rank of every worker (the world with one process per worker): the worker's processes hold the
        # same φ, so each local rank sums the same terms and all of them get the same model.
        group = view.all_workers_group()
        with view.monitor.watch("evaluation (merged model)", view.resume_hint):
            dist.all_reduce(total, op=dist.ReduceOp.SUM, group=group)
    return total


@contextmanager
def merged_model_loaded(view: EvaluationView) -> Iterator[None]:
    """Inside, every worker's trainable parameters hold the model the final merge would produce now
    (`merged_weights`, cast to the parameters' dtype as the final merge casts it); on leaving (also on an error)
    each worker's own parameters are put back bit for bit, and its random generators (the eval loaders draw from
    torch's), so that training goes on exactly as without it. Collective (every rank); keeps a copy of the trainable
    parameters while inside."""
    global_model = view.global_model
    params = global_model.params
    view.reshard()  # FSDP: the shards are written below, no unsharded copy may stay in use
    with torch.no_grad():
        saved = [p.detach().clone() for p in params]
    rng = get_rng_state()
    try:
        merged = merged_weights(view)
        with torch.no_grad():
            for value, p in zip(global_model.views_of(merged), params):
                p.copy_(value)
        del merged
        yield
    finally:
        view.reshard()
        with torch.no_grad():
            for p, own in zip(params, saved):
                p.copy_(own)
        set_rng_state(rng)


def _evaluate_each_instance(
    trainer: Trainer, view: EvaluationView, dataset, ignore_keys, prefix: str
) -> dict[int, dict]:
    """{instance id: {"loss": ..., **compute_metrics}} for every instance, the same on every rank."""
    args = trainer.args
    collect = trainer.compute_metrics is not None and not args.prediction_loss_only
    inst = view.instance
    members = list(view.layout.ranks_of_workers(inst.workers))  # every process of the instance takes a shard
    shard = _predict(trainer, view, dataset, members, ignore_keys=ignore_keys, collect=collect)
    losses = _pool_losses(view, inst.id, shard)
    per_instance = {i: {} for i in losses}
    if collect:
        group = view.group(members)
        rank = args.process_index
        shared = share_instance_metrics(trainer, shard, members, inst.id, rank, group, prefix, view.monitor)
        for instance_id, values in shared.items():
            per_instance.setdefault(instance_id, {}).update({k: v for k, v in values.items() if k != "loss"})
    for instance_id, loss in losses.items():
        if loss is not None:
            per_instance[instance_id]["loss"] = loss
    return dict(sorted(per_instance.items()))


def instance_losses(
    trainer: Trainer, view: EvaluationView, dataset, ignore_keys=None, progress: bool = True
) -> dict[int, float | None]:
    """{id: mean loss per token (per sample for models without labels to count)} of the single model (one instance,
    or the merged one) on the whole set, every worker taking a shard; None when the model gave no loss (no labels).
    Several instances are evaluated by `_evaluate_each_instance`."""
    group_id, members = (view.instances[0].id if view.instances else 0), list(range(trainer.args.world_size))
    shard = _predict(trainer, view, dataset, members, ignore_keys=ignore_keys, progress=progress)
    return _pool_losses(view, group_id, shard)


def _predict(trainer: Trainer, view: EvaluationView, dataset, members: list[int], **kwargs) -> ShardOutput:
    """This process's shard of `dataset` split among `members` (`predict_shard`). With worker_parallelism="fsdp"
    a forward is collective inside a worker, so its processes run the same batches: the set is split among the
    workers of `members` instead, and only local rank 0 counts its loss (the others' are the same numbers)."""
    rank = trainer.args.process_index
    if not view.sharded:
        return predict_shard(trainer, dataset, members, rank, **kwargs)
    layout = view.layout
    leaders = sorted({layout.rank(layout.worker_of(r), 0) for r in members})
    shard = predict_shard(trainer, dataset, leaders, layout.rank(view.worker_id, 0), **kwargs)
    view.reshard()
    if view.local_rank > 0:
        shard.loss_sum, shard.count = 0.0, 0.0
    return shard


def _pool_losses(view: EvaluationView, group_id: int, shard: ShardOutput) -> dict[int, float | None]:
    """Every rank's loss sum and weight, pooled per instance (one all-gather over the world, within worker_timeout)."""
    totals: dict[int, list[float]] = {}
    mine = [group_id, shard.loss_sum, shard.count]
    for row in view.monitor.gather_rows(mine, "evaluation (losses)", view.resume_hint):
        total = totals.setdefault(int(row[0]), [0.0, 0.0])
        total[0] += row[1]
        total[1] += row[2]
    return {i: (s / c if c > 0 else None) for i, (s, c) in sorted(totals.items())}


def _write_eval_lines(trainer: Trainer, view: EvaluationView, evals: dict[Any, dict[str, Any]], dataset_name) -> None:
    """One line per evaluated model: where the run stands, the model (`instance`: an instance id, or `MERGED` with
    `final`: true for the model of the final merge, false for the merge evaluated while training by
    `eval_merged_model`), the dataset's name (None for a single eval dataset) and every metric as `eval_{name}`,
    whatever the dataset's metric prefix."""
    state = view.state
    lines = []
    for label, values in evals.items():
        line = {
            "global_step": trainer.state.global_step,
            "outer_step": state.rounds,
            "total_tokens": state.tokens,
            "instance": label,
            "dataset": dataset_name,
        }
        if label == MERGED:
            line["final"] = view.final_merged
        # The exact loss (and perplexity) first, then the custom metrics, which never replace them.
        ordered = {name: values[name] for name in ("loss", "perplexity") if name in values}
        ordered.update({name: value for name, value in values.items() if name not in ordered})
        line.update({f"eval_{name}": value for name, value in ordered.items()})
        lines.append(line)
    view.run_log.write_eval(lines)
