"""One timed run of a variant (`materialised` or `streamed`), the pairs of a repeat, and the report."""

import gc
import os
import statistics

from transformers import default_data_collator

from adloco_hf import AdLoCoConfig, AdLoCoTrainer
from recipes.benchmarks.toolkit.data import make_model
from recipes.benchmarks.toolkit.results import table
from recipes.benchmarks.toolkit.stats import complete_repeats, median_spread
from recipes.benchmarks.toolkit.step_times import StepTimestamps, timestamp_callbacks


__all__ = ["CRITERION", "VARIANTS", "format_report", "run_variant", "summarize"]

VARIANTS = ("materialised", "streamed")
CRITERION = 0.95


def run_variant(variant: str, settings: dict, tokenizer, train_dataset, output_dir: str) -> dict:
    """Train one variant for `rounds` × H steps, the first `warmup` untimed; tokens/s over the timed window."""
    h, batch, warmup = settings["inner_steps"], settings["batch_size"], settings["warmup"]
    total = h * settings["rounds"]
    args = AdLoCoConfig(
        output_dir=os.path.join(output_dir, "runs", variant),
        per_device_train_batch_size=batch,
        learning_rate=settings["learning_rate"],
        lr_scheduler_type="constant",
        optim="adamw_torch",
        max_steps=total,
        seed=settings["seed"],
        use_cpu=True,
        save_strategy="no",
        eval_strategy="no",
        logging_strategy="no",
        report_to="none",
        disable_tqdm=True,
        inner_steps=h,
        num_instances=1,
        batch_size_test="none",
        max_batch_size=batch,
        save_merges=False,
    )
    model = make_model(settings, tokenizer)
    clock = StepTimestamps(lambda: None)
    before, after = timestamp_callbacks(clock, warmup + 1)
    trainer = AdLoCoTrainer(model=model, args=args, train_dataset=train_dataset, data_collator=default_data_collator)
    trainer.callback_handler.callbacks.insert(0, before)
    trainer.add_callback(after)
    trainer.train()
    first, last = warmup + 1, total
    window = clock.post[last] - clock.begin[first]
    tokens = (last - first + 1) * batch * settings["block_size"]
    result = {"variant": variant, "tokens_per_second": tokens / window, "window_seconds": window, "tokens": tokens}
    del trainer, model
    gc.collect()
    return result


def summarize(runs: list[dict]) -> dict:
    """Pair the variants within each repeat: the ratio streamed / materialised of tokens/s, median and spread."""
    complete = complete_repeats(runs, VARIANTS)
    ratios = [r["streamed"]["tokens_per_second"] / r["materialised"]["tokens_per_second"] for r in complete]
    return {
        "throughput_ratio": statistics.median(ratios),
        "throughput_ratio_spread": median_spread(ratios),
        "tokens_per_second": {v: statistics.median(r[v]["tokens_per_second"] for r in complete) for v in VARIANTS},
        "repeats": len(complete),
        "criterion": CRITERION,
        "holds": statistics.median(ratios) >= CRITERION,
    }


def format_report(summary: dict, stream_tokens_per_second: float | None = None) -> str:
    rows = [
        {
            "variant": v,
            "tokens/s (median)": summary["tokens_per_second"][v],
            "ratio": summary["tokens_per_second"][v] / summary["tokens_per_second"]["materialised"],
        }
        for v in VARIANTS
    ]
    spread = summary["throughput_ratio_spread"]
    lines = [table(rows, ["variant", "tokens/s (median)", "ratio"])]
    lines.append(
        f"\nthroughput_ratio (streamed / materialised, paired per repeat): median {summary['throughput_ratio']:.4f}, "
        f"min {spread['min']:.4f}, max {spread['max']:.4f}, IQR/2 {100 * spread['iqr_half_rel']:.2f}% over "
        f"{spread['n']} repeats; criterion >= {summary['criterion']}: {'holds' if summary['holds'] else 'MISSED'}"
    )
    if stream_tokens_per_second is not None:
        lines.append(f"the stream alone (tokenise + pack, no training): {stream_tokens_per_second:,.0f} tokens/s")
    return "\n".join(lines)
