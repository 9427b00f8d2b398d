"""Training throughput from a stream against the materialised dataset, on the demo model.

One worker, one process, the same model (`tiny`, block 128), tokenizer (the 4096-token BPE of the demo), documents,
fixed batch and inner optimizer for both variants:

| variant | what it is |
|---|---|
| `materialised` | `build_lm_datasets` of `builtin:python-source`'s train documents, built before timing (the demo's path) |
| `streamed` | the same documents as 16 JSON-lines shards in C4's schema, read through `pretrain_c4.py --streaming`'s path: `load_document_stream` → `build_lm_stream` (eval documents held out by hash) → `PackedStream`, tokenised and packed while training |

Each worker reads its own part of a stream and tokenises it itself, so one worker measures what the stream costs a
worker. The variants alternate (the order rotates every repeat) and each is timed as in `overhead.py`: from
`on_step_begin` of the first step after the warm-up to `on_step_end` of the last (AdLoCo's end-of-round work
included), tokens = steps × batch × block. The streamed variant tokenises `--tokenize_documents` documents whenever
its carry holds less than a block (4 source files, ~20 k tokens); a timed window holds 95 (quick) or 195 steps of
1024 tokens, so several refills fall inside it and their cost is measured, not left to the warm-up. Also reported:
the stream's own throughput (blocks drawn from a `PackedPart` with no training, tokens/s), which bounds its cost.

    python -m recipes.benchmarks.streaming --quick    # from the repository root; a few minutes on 2 CPU cores
    python -m recipes.benchmarks.streaming

Outputs in `--output_dir` (default `outputs/benchmarks/streaming`): `results.json` and `table.md`. Criterion (issue
16): the median paired ratio streamed / materialised ≥ 0.95.
"""

import argparse
import gc
import json
import os
import statistics
import time


os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from recipes.benchmarks._common import REPO, median_spread, table, write_json  # noqa: E402


VARIANTS = ("materialised", "streamed")
CRITERION = 0.95
NUM_SHARDS = 16
EVAL_DOCUMENTS = 16
PROFILES = {
    "quick": {"batch_size": 8, "inner_steps": 25, "rounds": 4, "repeats": 5, "warmup": 5},
    "full": {"batch_size": 8, "inner_steps": 50, "rounds": 4, "repeats": 9, "warmup": 5},
}


def settings_from(args: argparse.Namespace) -> dict:
    settings = dict(PROFILES["quick" if args.quick else "full"])
    for name in ("batch_size", "inner_steps", "rounds", "repeats", "warmup"):
        if getattr(args, name) is not None:
            settings[name] = getattr(args, name)
    settings.update(
        preset="tiny",
        block_size=128,
        seed=42,
        learning_rate=1e-3,
        tokenize_documents=args.tokenize_documents,
        threads=args.threads,
        data={"corpus": "builtin:python-source", "vocab_size": 4096},
        cache_dir=os.path.abspath(args.cache_dir),
    )
    return settings


def write_shards(texts, cache_dir: str, num_shards: int = NUM_SHARDS) -> list[str]:
    """The train documents of `texts` (corpus order) as `num_shards` JSON-lines files in C4's schema, contiguous
    slices of about equal size; cached under a fingerprint of the corpus."""
    from adloco_hf.data.python_source import SPLIT_COLUMN

    train = texts
    if SPLIT_COLUMN in texts.column_names:
        train = texts.filter(lambda split: split == "train", input_columns=SPLIT_COLUMN)
    folder = os.path.join(cache_dir, f"streaming-shards-{train._fingerprint[:16]}-{num_shards}")
    files = [os.path.join(folder, f"c4-train.{i:05d}-of-{num_shards:05d}.json") for i in range(num_shards)]
    if all(os.path.isfile(f) for f in files):
        return files
    tmp = folder + ".tmp"
    os.makedirs(tmp, exist_ok=True)
    bounds = [round(i * len(train) / num_shards) for i in range(num_shards + 1)]
    for i, path in enumerate(files):
        with open(os.path.join(tmp, os.path.basename(path)), "w", encoding="utf-8") as f:
            for row, text in enumerate(train[bounds[i] : bounds[i + 1]]["text"]):
                f.write(json.dumps({"text": text, "timestamp": "", "url": f"doc-{bounds[i] + row}"}) + "\n")
    os.replace(tmp, folder)
    return files


def stream_throughput(train, settings: dict, blocks: int) -> float:
    """Tokens/s of drawing blocks from a fresh part of the training stream, nothing else."""
    part = train.split_by_node(0, 1)
    part.next_example()  # opens the first file
    start = time.perf_counter()
    for _ in range(blocks):
        part.next_example()
    return blocks * settings["block_size"] / (time.perf_counter() - start)


def run_variant(variant: str, settings: dict, tokenizer, train_dataset, output_dir: str) -> dict:
    """Train one variant for `rounds` × H steps, the first `warmup` untimed; tokens/s over the timed window."""
    from transformers import default_data_collator

    from adloco_hf import AdLoCoConfig, AdLoCoTrainer
    from recipes.benchmarks._convergence_worker import make_model
    from recipes.benchmarks.overhead import StepClock, make_callbacks

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
    clock = StepClock(lambda: None)
    before, after = make_callbacks(clock, warmup + 1)
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
    by_repeat: dict[int, dict[str, dict]] = {}
    for run in runs:
        by_repeat.setdefault(run["repeat"], {})[run["variant"]] = run
    complete = [r for r in by_repeat.values() if all(v in r for v in VARIANTS)]
    if not complete:
        raise ValueError("no repeat ran both variants")
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


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="Fewer repeats (a few minutes on 2 CPU cores).")
    parser.add_argument("--output_dir", default="outputs/benchmarks/streaming")
    parser.add_argument("--cache_dir", default="outputs/cache")
    parser.add_argument("--batch_size", type=int, default=None)
    parser.add_argument("--inner_steps", type=int, default=None)
    parser.add_argument("--rounds", type=int, default=None)
    parser.add_argument("--warmup", type=int, default=None)
    parser.add_argument("--repeats", type=int, default=None)
    parser.add_argument(
        "--tokenize_documents",
        type=int,
        default=4,
        help="Documents tokenised per refill of the stream's carry. A source file of the corpus is ~5k tokens, so "
        "4 of them are about as many tokens as PackedStream's default 64 documents of C4 (~500 tokens each).",
    )
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (a CPU worker of the demo uses 1).")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    os.chdir(REPO)
    start = time.perf_counter()
    import torch
    import transformers

    from adloco_hf.data import (
        build_lm_datasets,
        build_lm_stream,
        load_document_stream,
        load_or_train_tokenizer,
        load_text_corpus,
    )

    torch.set_num_threads(args.threads)
    transformers.utils.logging.set_verbosity_error()
    settings = settings_from(args)
    output_dir = os.path.abspath(args.output_dir)
    texts = load_text_corpus(settings["data"]["corpus"])
    tokenizer = load_or_train_tokenizer(None, texts, vocab_size=4096, cache_dir=settings["cache_dir"])
    materialised = build_lm_datasets(
        texts, tokenizer, block_size=settings["block_size"], cache_dir=settings["cache_dir"]
    )
    files = write_shards(texts, settings["cache_dir"])
    streamed, _ = build_lm_stream(
        load_document_stream("allenai/c4", data_files=files),
        tokenizer,
        block_size=settings["block_size"],
        eval_documents=EVAL_DOCUMENTS,
        tokenize_documents=settings["tokenize_documents"],
    )
    datasets_by_variant = {"materialised": materialised["train"], "streamed": streamed}
    runs = []
    for repeat in range(settings["repeats"]):
        order = VARIANTS[repeat % 2 :] + VARIANTS[: repeat % 2]
        for variant in order:
            run = run_variant(variant, settings, tokenizer, datasets_by_variant[variant], output_dir)
            run["repeat"] = repeat
            runs.append(run)
            print(f"repeat {repeat} {variant:>12}: {run['tokens_per_second']:,.0f} tokens/s", flush=True)
    summary = summarize(runs)
    stream_tps = stream_throughput(streamed, settings, blocks=2000)
    results = {
        **summary,
        "stream_tokens_per_second": stream_tps,
        "settings": settings,
        "runs": runs,
        "total_seconds": time.perf_counter() - start,
    }
    write_json(os.path.join(output_dir, "results.json"), results)
    report = format_report(summary, stream_tps)
    with open(os.path.join(output_dir, "table.md"), "w", encoding="utf-8") as f:
        f.write(report + "\n")
    print(report)
    print(f"wrote {os.path.join(output_dir, 'results.json')} ({results['total_seconds']:.0f}s in all)")
    return results


if __name__ == "__main__":
    main()
