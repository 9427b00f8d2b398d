"""`python -m recipes.benchmarks.streaming`: the materialised dataset and the stream built, the variants alternated
over the repeats, the stream's own throughput, the report."""

import argparse
import os
import time

import torch
import transformers

from adloco_hf.data import (
    build_lm_datasets,
    build_lm_stream,
    load_document_stream,
    load_or_train_tokenizer,
    load_text_corpus,
)
from recipes.benchmarks.streaming.shards import EVAL_DOCUMENTS, stream_throughput, write_shards
from recipes.benchmarks.streaming.variants import VARIANTS, format_report, run_variant, summarize
from recipes.benchmarks.toolkit.paths import REPO
from recipes.benchmarks.toolkit.results import write_json, write_report


__all__ = ["PROFILES", "main", "parse_args", "settings_from"]

DESCRIPTION = "Training throughput from a stream against the materialised dataset, on the demo model."
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


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=DESCRIPTION)
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
    """Build both datasets, alternate the variants over the repeats, and write `results.json` and `table.md`."""
    args = parse_args(argv)
    os.chdir(REPO)
    start = time.perf_counter()
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
    write_report(output_dir, format_report(summary, stream_tps))
    print(f"wrote {os.path.join(output_dir, 'results.json')} ({results['total_seconds']:.0f}s in all)")
    return results
