"""One timed run of a variant: the plain `Trainer` or `AdLoCoTrainer` (statistics on or off), on the materialised or
the streamed data, with or without loader processes; the same model, batch and optimizer, only training steps
timed, around AdLoCo's own callback."""

import gc
import math
import os
import statistics
from typing import NamedTuple

import torch
from transformers import Trainer, TrainingArguments, default_data_collator

from adloco_hf import AdLoCoConfig, AdLoCoTrainer
from adloco_hf.inspection import load_rounds
from recipes.benchmarks.toolkit.data import make_model
from recipes.benchmarks.toolkit.step_times import StepTimestamps, timestamp_callbacks


__all__ = ["Variant", "run_variant"]


class Variant(NamedTuple):
    """What a variant trains with: `trainer` (`"trainer"`, `"adloco"` or `"adloco_stats"`), `data` (`"materialised"`
    or `"streamed"`), and whether `settings["loader_processes"]` DataLoader processes feed it."""

    trainer: str = "adloco"
    data: str = "materialised"
    loader: bool = False


def run_variant(name: str, variant: Variant, settings: dict, tokenizer, train_dataset, output_dir: str) -> dict:
    """Train one variant for `rounds` × H steps, the first `warmup` of them untimed; return its timings.

    The run ends on a round end, so the timed window holds all `rounds` outer steps (the first round is timed from
    step `warmup` + 1 on, which slightly over-weights the outer step: a conservative choice for AdLoCo).
    """
    h, rounds, batch, warmup = settings["inner_steps"], settings["rounds"], settings["batch_size"], settings["warmup"]
    total = h * rounds
    if not 0 <= warmup < total:
        raise ValueError(f"warmup={warmup} must be below rounds × inner_steps = {total}")
    on_cuda = settings["device"] == "cuda"
    loader = {"dataloader_num_workers": settings["loader_processes"] if variant.loader else 0}
    if variant.loader:
        loader.update(dataloader_prefetch_factor=settings["prefetch_factor"], dataloader_persistent_workers=True)
    common = {
        "output_dir": os.path.join(output_dir, "runs", name),
        "per_device_train_batch_size": batch,
        "learning_rate": settings["learning_rate"],
        "lr_scheduler_type": "constant",
        "optim": "adamw_torch",
        "max_grad_norm": 1.0,
        "max_steps": total,
        "seed": settings["seed"],
        "data_seed": settings["seed"],
        "use_cpu": not on_cuda,
        "fp16": settings["fp16"],
        "save_strategy": "no",
        "eval_strategy": "no",
        "logging_strategy": "no",
        "report_to": "none",
        "disable_tqdm": True,
        **loader,
    }
    if variant.trainer == "trainer":
        args = TrainingArguments(**common)
    else:
        stats = variant.trainer == "adloco_stats"
        args = AdLoCoConfig(
            **common,
            inner_steps=h,
            num_instances=1,
            batch_size_test="norm" if stats else "none",
            batch_size_target="test",  # the statistics' cost alone (the goodput rule also times every step)
            batch_size_cap=batch if stats else None,
            max_batch_size=batch,
            save_merges=False,
        )
    model = make_model(settings, tokenizer)
    clock = StepTimestamps(torch.cuda.synchronize if on_cuda else (lambda: None))
    before, after = timestamp_callbacks(clock, warmup + 1)
    trainer_class = Trainer if variant.trainer == "trainer" else AdLoCoTrainer
    trainer = trainer_class(model=model, args=args, train_dataset=train_dataset, data_collator=default_data_collator)
    trainer.callback_handler.callbacks.insert(0, before)  # before AdLoCoCallback: sees the step alone
    trainer.add_callback(after)  # after AdLoCoCallback: the outer step of a round is inside its step's window
    trainer.train()
    first, last = warmup + 1, total
    window = clock.post[last] - clock.begin[first]
    steps = list(range(first, last + 1))
    round_ends = [s for s in steps if s % h == 0]
    ordinary = [s for s in steps if s % h != 0]
    step_time = {s: clock.pre[s] - clock.begin[s] for s in steps}
    tokens = (last - first + 1) * batch * settings["block_size"]
    result = {
        "variant": name,
        "tokens_per_second": tokens / window,
        # CPU seconds of this process over the same window (equal to the wall time when nothing else competes).
        "tokens_per_cpu_second": tokens / (clock.cpu_end - clock.cpu_begin),
        "window_seconds": window,
        "tokens": tokens,
        "ordinary_steps": [step_time[s] for s in ordinary],
        "round_end_steps": [step_time[s] for s in round_ends],
        "end_of_round": [clock.post[s] - clock.pre[s] for s in round_ends],
        "ordinary_step_seconds": statistics.median(step_time[s] for s in ordinary),
        "round_end_step_seconds": statistics.median(step_time[s] for s in round_ends),
        "end_of_round_seconds": statistics.median(clock.post[s] - clock.pre[s] for s in round_ends),
    }
    if variant.trainer == "adloco_stats":
        sizes = {line["batch_size"] for line in load_rounds(args.output_dir)}
        if sizes != {batch}:
            raise RuntimeError(f"adloco_stats changed its batch ({sizes}); batch_size_cap should have fixed it")
        variances = [line["grad_variance"] for line in load_rounds(args.output_dir)]
        if not all(v is not None and math.isfinite(v) for v in variances):
            raise RuntimeError(f"adloco_stats gathered no statistics: grad_variance per round {variances}")
    del trainer, model
    gc.collect()
    if on_cuda:
        torch.cuda.empty_cache()
    return result
