"""One instance's predictions on the whole eval set, and its `compute_metrics`, without the Trainer's world gathers.

While several instances train, the Trainer's `evaluation_loop` cannot compute an instance's metrics: its gathers span
the world, so they would pool the predictions of different models. Here each of an instance's workers predicts one
contiguous shard of the eval set with the Trainer's own `prediction_step` (so `compute_loss`, `label_names`,
`ignore_keys`, `preprocess_logits_for_metrics`, `include_for_metrics` and subclass overrides apply as in
`evaluation_loop`); the shards go to the instance's first worker inside the instance's process group, which joins
them in the order of the eval set and calls `compute_metrics` once; one object all-gather then gives every rank every
instance's metrics.
"""

import logging
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from accelerate.utils import extract_model_from_parallel
from torch.utils.data import DataLoader, Subset
from transformers import Trainer
from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
from transformers.trainer_pt_utils import EvalLoopContainer, nested_concat
from transformers.trainer_utils import EvalPrediction, denumpify_detensorize, unwrap_peft_model

from ..common.distributed import WorkerMonitor
from ..common.inputs import batch_length
from ..common.upstream import trainer_num_items_in_batch


__all__ = ["ShardOutput", "instance_metrics", "is_causal_lm", "predict_shard", "share_instance_metrics"]

logger = logging.getLogger(__name__)

_CAUSAL_LM_CLASSES = frozenset(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.values())


def is_causal_lm(model: torch.nn.Module) -> bool:
    """Whether `model` (possibly wrapped by accelerate or PEFT) is a causal language model: its loss is then a
    next-token cross-entropy, and its perplexity means something.

    Decided from the class (one of `MODEL_FOR_CAUSAL_LM_MAPPING_NAMES`, or a `...ForCausalLM`) or the loss it was
    built with (`loss_type == "ForCausalLM"`); `BertForSequenceClassification` is not one, `BertLMHeadModel` is.
    """
    model = unwrap_peft_model(extract_model_from_parallel(model))  # DDP, DeepSpeed, torch.compile; then PEFT
    name = type(model).__name__
    return (
        name in _CAUSAL_LM_CLASSES
        or name.endswith("ForCausalLM")
        or getattr(model, "loss_type", None) == ("ForCausalLM")
    )


@dataclass
class ShardOutput:
    """What one worker saw of its shard: the summed loss and its weight, and (when collected) predictions, labels,
    per-sample losses and inputs as numpy arrays (or lists of per-batch arrays with `eval_do_concat_batches=False`)."""

    loss_sum: float = 0.0
    count: float = 0.0
    arrays: dict[str, Any] = field(default_factory=dict)  # predictions, label_ids, losses, inputs


def _eval_dataset_and_collator(trainer: Trainer, dataset):
    """The dataset and collator of the Trainer's own eval loader (`get_eval_dataloader`: the model's unused columns
    removed, from the dataset or by the collator; a subclass's override applies), which `predict_shard` splits."""
    loader = trainer.get_eval_dataloader(dataset)
    return loader.dataset, loader.collate_fn


@torch.no_grad()
def predict_shard(
    trainer: Trainer,
    dataset,
    members: list[int],
    rank: int,
    *,
    ignore_keys=None,
    collect: bool = False,
    progress: bool = True,
) -> ShardOutput:
    """Run `prediction_step` over `rank`'s contiguous shard of `dataset` split among `members` (sorted ranks).

    The loss is exact and token-weighted: a loss normalised by the batch's items (tokens that count) is multiplied
    back by them, a mean loss by the number of samples when the model has no labels to count. `collect` keeps the
    predictions for `compute_metrics` (after `preprocess_logits_for_metrics`, batch by batch, as `evaluation_loop`).
    `progress` fires `on_prediction_step` for every batch (progress bars), unless `evaluation_loop` already did.
    """
    dataset, collator = _eval_dataset_and_collator(trainer, dataset)
    args = trainer.args
    position, size, total = members.index(rank), len(members), len(dataset)
    shard = Subset(dataset, range(position * total // size, (position + 1) * total // size))
    loader = DataLoader(shard, batch_size=args.eval_batch_size, collate_fn=collator)
    model = trainer.model
    model.eval()
    if progress:
        trainer.callback_handler.eval_dataloader = loader
    containers = {
        name: EvalLoopContainer(args.eval_do_concat_batches, padding_index=-100)
        for name in ("predictions", "label_ids", "losses", "inputs")
    }
    main_input = getattr(model, "main_input_name", "input_ids")
    out = ShardOutput()
    for step, inputs in enumerate(loader):
        # `prediction_step` moves the inputs to the device; the count is the one it divides the loss by.
        items = trainer_num_items_in_batch(trainer, inputs, args.device)
        items = float(items) if items is not None else float(batch_length(inputs))
        loss, logits, labels = trainer.prediction_step(model, inputs, not collect, ignore_keys=ignore_keys)
        if loss is not None:
            # A loss normalised by `items` is a sum over items divided by `items`; a mean loss is multiplied back.
            out.loss_sum += float(loss) * items
            out.count += items
        if collect:
            if loss is not None and "loss" in args.include_for_metrics:
                containers["losses"].add(loss.detach().reshape(1).repeat(batch_length(inputs)))
            if "inputs" in args.include_for_metrics:
                containers["inputs"].add(inputs[main_input])
            if logits is not None:
                if trainer.preprocess_logits_for_metrics is not None:
                    logits = trainer.preprocess_logits_for_metrics(logits, labels)
                containers["predictions"].add(logits)
            if labels is not None:
                containers["label_ids"].add(labels)
            if args.eval_accumulation_steps is not None and (step + 1) % args.eval_accumulation_steps == 0:
                for container in containers.values():
                    container.to_cpu_and_numpy()
        if progress:
            trainer.control = trainer.callback_handler.on_prediction_step(args, trainer.state, trainer.control)
    if collect:
        out.arrays = {name: container.get_arrays() for name, container in containers.items()}
    return out


def _join(parts: list[Any], concat: bool) -> Any:
    """The shards' arrays one after the other (padded with -100 where lengths differ), skipping empty shards."""
    joined = None
    for part in parts:
        if part is None:
            continue
        if joined is None:
            joined = part
        else:
            joined = nested_concat(joined, part, padding_index=-100) if concat else list(joined) + list(part)
    return joined


def instance_metrics(
    trainer: Trainer, shard: ShardOutput, members: list[int], rank: int, group, metric_key_prefix: str
) -> dict[str, Any] | None:
    """`compute_metrics` on the instance's whole eval set, on its first worker (None on the others).

    Collective inside the instance's group (`group`, None for a one-worker instance). Metric names come back without
    `metric_key_prefix` (a `compute_metrics` that already returns `eval_accuracy` gives `accuracy`).
    """
    leader = members[0]
    if group is None or len(members) == 1:
        parts = [shard.arrays]
    else:
        parts = [None] * len(members) if rank == leader else None
        dist.gather_object(shard.arrays, parts, dst=leader, group=group)
    if rank != leader:
        return None
    concat = trainer.args.eval_do_concat_batches
    joined = {name: _join([part.get(name) for part in parts], concat) for name in parts[0]}
    if joined.get("predictions") is None or joined.get("label_ids") is None:
        return {}
    prediction = EvalPrediction(
        predictions=joined["predictions"],
        label_ids=joined["label_ids"],
        losses=joined["losses"] if "loss" in trainer.args.include_for_metrics else None,
        inputs=joined["inputs"] if "inputs" in trainer.args.include_for_metrics else None,
    )
    if trainer.args.batch_eval_metrics:
        metrics = trainer.compute_metrics(prediction, compute_result=True)  # the whole set as one last batch
    else:
        metrics = trainer.compute_metrics(prediction)
    metrics = denumpify_detensorize(dict(metrics or {}))
    return {str(key).removeprefix(f"{metric_key_prefix}_"): value for key, value in metrics.items()}


def share_instance_metrics(
    trainer: Trainer,
    shard: ShardOutput,
    members: list[int],
    instance_id: int,
    rank: int,
    group,
    prefix: str,
    monitor: WorkerMonitor,
) -> dict[int, dict[str, Any]]:
    """{instance id: its `compute_metrics` result} on every rank (collective over the world).

    An error in a first worker's `compute_metrics` is raised on that worker and, as a `RuntimeError` naming it, on
    every other rank, instead of leaving them waiting. The results travel on the `monitor`'s group: a worker that does
    not come within its timeout is named (`WorkerTimeoutError`).
    """
    failure, payload = None, None
    try:
        metrics = instance_metrics(trainer, shard, members, rank, group, prefix)
        if metrics is not None:
            payload = (instance_id, metrics, None)
    except Exception as error:  # noqa: BLE001 - re-raised below, after the other ranks have been told
        failure, payload = error, (instance_id, None, f"{type(error).__name__}: {error}")
    gathered = monitor.gather_objects(payload, "evaluation (compute_metrics)")
    if failure is not None:
        raise failure
    for who, entry in enumerate(gathered):
        if entry is not None and entry[2] is not None:
            raise RuntimeError(f"compute_metrics failed for instance {entry[0]} on rank {who}: {entry[2]}")
    return {entry[0]: entry[1] for entry in gathered if entry is not None}
