"""A spec's training arguments: the `TrainingArguments` of DDP's plain Trainer or the `AdLoCoConfig` of an AdLoCo
method, with the same shared part, and a step bound that reaches the token budget."""

import math

from transformers import TrainingArguments

from adloco_hf import AdLoCoConfig


__all__ = ["common_arguments", "make_arguments", "max_steps_for"]


def common_arguments(spec: dict) -> dict:
    train = spec["train"]
    on_cpu = spec["device"] == "cpu"
    return {
        "output_dir": spec["output_dir"],
        "per_device_train_batch_size": train["batch_size"],
        "per_device_eval_batch_size": train["eval_batch_size"],
        "learning_rate": train["learning_rate"],
        "weight_decay": train["weight_decay"],
        "adam_beta2": train["adam_beta2"],
        # Constant after warm-up: the methods run different step counts for the same tokens, so a schedule tied
        # to max_steps would differ between them.
        "lr_scheduler_type": "constant_with_warmup",
        "warmup_steps": train["warmup_steps"],
        "max_grad_norm": train["max_grad_norm"],
        "seed": spec["seed"],
        "data_seed": spec["seed"],
        "use_cpu": on_cpu,
        # gloo by default: several workers may share one GPU, which NCCL refuses (`make gpu-check` runs one worker
        # with `--set backend=nccl`).
        "ddp_backend": spec.get("backend", "gloo"),
        "fp16": bool(spec["fp16"]),
        "bf16": bool(spec.get("bf16", False)),
        "optim": spec.get("optim", "adamw_torch"),
        "torch_compile": bool(spec.get("torch_compile", False)),
        "eval_strategy": "steps",
        "prediction_loss_only": True,  # the Trainer would otherwise gather every eval logit across workers
        "save_strategy": "no",
        "logging_steps": train["inner_steps"],
        "report_to": "none",
        "disable_tqdm": True,
        "dataloader_num_workers": 0,
        "average_tokens_across_devices": False,
    }


def max_steps_for(spec: dict) -> int:
    """Steps that reach the token budget: exactly for DDP's fixed batch; an upper bound, in whole rounds, for AdLoCo.

    AdLoCo's requests only grow, and a step uses at least min(initial request, max_batch_size) samples (switch mode
    caps a request above max_batch_size there), so that batch bounds the run; the budget callback ends it earlier.
    With merges under `merge_batch_rule="preserve_total"` (the default) the instances' total batch can fall to one
    instance's (a merged instance keeps its total, spread over more workers): then one worker's batch bounds it.
    The schedule is constant after warm-up, so this bound changes nothing a run does before its budget.
    """
    train, world = spec["train"], spec["world_size"]
    if spec["kind"] == "ddp":
        return math.ceil(spec["budget_tokens"] / (world * train["batch_size"] * spec["block_size"]))
    adloco = spec["adloco"]
    smallest = train["batch_size"]
    if isinstance(adloco.get("max_batch_size"), int):
        smallest = min(smallest, adloco["max_batch_size"])
    merges = adloco.get("num_instances", 1) > 1 and adloco.get("merge_every", 1) != 0
    if merges and adloco.get("merge_batch_rule", "preserve_total") == "preserve_total":
        world = 1
    h = train["inner_steps"]
    return (math.ceil(spec["budget_tokens"] / (world * smallest * spec["block_size"]) / h) + 1) * h


def make_arguments(spec: dict) -> TrainingArguments:
    train = spec["train"]
    eval_steps = train["inner_steps"] * train["eval_every_rounds"]
    kwargs = common_arguments(spec)
    if spec["kind"] == "ddp":
        return TrainingArguments(
            **kwargs, max_steps=max_steps_for(spec), eval_steps=eval_steps, ddp_find_unused_parameters=False
        )
    adloco = dict(spec["adloco"])
    factor = adloco.pop("max_inner_steps_factor", None)  # a growing H: its cap follows inner_steps
    if adloco.get("fragment_sync_delay") == "max":  # Streaming DiLoCo's longest delay for this H
        adloco["fragment_sync_delay"] = train["inner_steps"] // adloco["num_fragments"]
    if factor is not None:
        adloco["max_inner_steps"] = factor * train["inner_steps"]
        eval_steps = math.lcm(eval_steps, adloco["max_inner_steps"])  # evaluations at round ends only
    return AdLoCoConfig(
        **kwargs,
        max_steps=max_steps_for(spec),
        inner_steps=train["inner_steps"],
        eval_steps=eval_steps,
        save_merges=False,
        **adloco,
    )
