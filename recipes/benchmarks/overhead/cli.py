"""`python -m recipes.benchmarks.overhead`: the settings of a comparison, its variants alternated over the repeats,
the summary, the step profile."""

import argparse
import json
import math
import os
import time

import torch
import transformers

from recipes.benchmarks.overhead import loader_processes, streaming, trainer
from recipes.benchmarks.overhead.pairs import alternate
from recipes.benchmarks.overhead.step_profile import measure_step_profile
from recipes.benchmarks.overhead.stream import stream_throughput, streamed_dataset
from recipes.benchmarks.toolkit.data import load_data
from recipes.benchmarks.toolkit.paths import REPO
from recipes.benchmarks.toolkit.results import write_json, write_report


__all__ = ["COMPARISONS", "PROFILES", "main", "parse_args", "settings_from"]

DESCRIPTION = (
    "One worker's training throughput under variants alternated side by side: AdLoCo against the plain Trainer "
    "(and the price of the gradient statistics), streamed against materialised data, 0 against N loader processes."
)
COMPARISONS = {"trainer": trainer, "streaming": streaming, "loader_processes": loader_processes}
SOURCE = {"corpus": "builtin:python-source", "vocab_size": 4096}
TRAINER = {"batch_size": 8, "warmup": 5, "threads": 1, "data": SOURCE}
STREAMING = {**TRAINER, "rounds": 4, "tokenize_documents": 4}
# As issue 38 measured it: torch's threads, PackedStream's default refill, the pydoc corpus.
LOADER = {"batch_size": 16, "inner_steps": 10, "rounds": 6, "warmup": 10, "threads": None, "tokenize_documents": 64,
          "loader_processes": 2, "prefetch_factor": 2, "data": {**SOURCE, "corpus": "builtin:python-docs"}}  # fmt: skip
PROFILES = {
    ("trainer", "quick"): {**TRAINER, "inner_steps": 25, "rounds": 2, "repeats": 9},
    ("trainer", "full"): {**TRAINER, "inner_steps": 50, "rounds": 3, "repeats": 15},
    ("streaming", "quick"): {**STREAMING, "inner_steps": 25, "repeats": 5},
    ("streaming", "full"): {**STREAMING, "inner_steps": 50, "repeats": 9},
    ("loader_processes", "quick"): {**LOADER, "repeats": 2},
    ("loader_processes", "full"): {**LOADER, "repeats": 5},
}
# The profile's settings a command line may override (all integers), with their help.
OVERRIDES = {
    "batch_size": None,
    "inner_steps": "H of the measured runs.",
    "rounds": "Rounds per run (all timed but the warm-up steps).",
    "warmup": "Untimed steps at the start of each run.",
    "repeats": "Alternations of the variants.",
    "threads": "torch CPU threads (trainer, streaming: 1, as convergence's workers; loader_processes: torch's).",
    "tokenize_documents": "Documents tokenised per refill of the stream's carry (streaming: 4; a source file of the "
    "corpus is ~5k tokens, so 4 of them are about as many tokens as PackedStream's default 64 documents of C4).",
    "loader_processes": "The N of --compare loader_processes (2).",
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=DESCRIPTION)
    parser.add_argument("--compare", choices=list(COMPARISONS), default="trainer", help="The variants alternated.")
    parser.add_argument("--quick", action="store_true", help="Fewer repeats and rounds (< 5 minutes on 2 CPU cores).")
    parser.add_argument("--output_dir", help="Default: outputs/benchmarks/overhead, or .../<comparison>.")
    parser.add_argument("--cache_dir", default="outputs/cache")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--preset", default=None, help="Model preset (default: tiny on CPU, microllama on CUDA).")
    parser.add_argument("--fp16", action="store_true")
    parser.add_argument("--block_size", type=int, default=None)
    for name, text in OVERRIDES.items():
        parser.add_argument(f"--{name}", type=int, default=None, help=text)
    parser.add_argument("--plot_only", metavar="RESULTS", help="Draw a loader_processes results file's figure.")
    parser.add_argument(
        "--step_profile",
        type=int,
        nargs="+",
        default=None,
        metavar="B",
        help="Also measure the step profile (the virtual clock's device profile) at these micro-batch sizes.",
    )
    parser.add_argument("--step_profile_processes", type=int, default=1, help="Concurrent processes measuring it.")
    parser.add_argument("--step_profile_repeats", type=int, default=10)
    parser.add_argument("--step_profile_only", action="store_true", help="Measure only the step profile.")
    parser.add_argument(
        "--step_profile_trainer_batch",
        type=int,
        default=None,
        help="Also time the plain Trainer's step at this batch (one of --step_profile): the per-step overhead.",
    )
    args = parser.parse_args(argv)
    if args.step_profile_only and not args.step_profile:
        parser.error("--step_profile_only needs --step_profile B [B ...]")
    if args.step_profile_trainer_batch is not None and args.step_profile_trainer_batch not in (
        args.step_profile or []
    ):
        parser.error("--step_profile_trainer_batch must be one of the --step_profile sizes")
    if args.fp16 and args.device != "cuda":
        parser.error("--fp16 needs --device cuda")
    return args


def settings_from(args: argparse.Namespace) -> dict:
    settings = dict(PROFILES[(args.compare, "quick" if args.quick else "full")])
    settings.update({name: getattr(args, name) for name in OVERRIDES if getattr(args, name) is not None})
    settings.update(
        compare=args.compare,
        threads=settings["threads"] or torch.get_num_threads(),
        device=args.device,
        preset=args.preset or ("microllama" if args.device == "cuda" else "tiny"),
        fp16=bool(args.fp16),
        block_size=args.block_size or (256 if args.device == "cuda" else 128),
        seed=42,
        learning_rate=1e-3,
        cache_dir=os.path.abspath(args.cache_dir),
    )
    return settings


def print_step_profile(step_profile: dict) -> None:
    print(
        "step profile: "
        + ", ".join(f"b={b} {1000 * s:.1f} ms" for b, s in step_profile["micro_batch_seconds"].items())
        + f"; optimizer {1000 * step_profile['optimizer_seconds']:.1f} ms"
        + f"; outer step {1000 * step_profile['outer_seconds']:.1f} ms"
        + f"; other per-step work {1000 * step_profile.get('step_overhead_seconds', math.nan):.1f} ms",
        flush=True,
    )


def main(argv: list[str] | None = None) -> dict:
    """Measure the comparison's variants (or only the step profile) and write `results.json` and `table.md` (and,
    for `loader_processes`, `results.png`)."""
    args = parse_args(argv)
    if args.plot_only:
        with open(args.plot_only, encoding="utf-8") as f:
            print(loader_processes.plot(json.load(f), os.path.splitext(args.plot_only)[0] + ".png"))
        return {}
    os.chdir(REPO)
    start = time.perf_counter()
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: no CUDA device is visible")
    if args.compare == "loader_processes":  # the tokenizer's threads would not survive the loader processes' fork
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    settings = settings_from(args)
    torch.set_num_threads(settings["threads"])
    transformers.utils.logging.set_verbosity_error()
    default_dir = "outputs/benchmarks/overhead" if args.compare == "trainer" else f"outputs/benchmarks/{args.compare}"
    output_dir = os.path.abspath(args.output_dir or default_dir)
    results_path = os.path.join(output_dir, "results.json")
    tokenizer, lm = load_data(settings)
    step_profile = None
    if args.step_profile:
        step_profile = measure_step_profile(
            settings,
            len(tokenizer),
            args.step_profile,
            args.step_profile_processes,
            args.step_profile_repeats,
            args.step_profile_trainer_batch,
        )
        print_step_profile(step_profile)
        if args.step_profile_only:
            results = {
                "step_profile": step_profile,
                "settings": settings,
                "total_seconds": time.perf_counter() - start,
            }
            write_json(results_path, results)
            print(f"wrote {results_path}")
            return results
    comparison = COMPARISONS[args.compare]
    datasets = {"materialised": lm["train"]}
    if any(variant.data == "streamed" for variant in comparison.VARIANTS.values()):
        datasets["streamed"] = streamed_dataset(settings, tokenizer)
    runs = alternate(comparison.VARIANTS, settings, tokenizer, datasets, output_dir)
    summary = comparison.summarize(runs, settings)
    if args.compare == "streaming":  # the stream alone, which bounds its cost
        summary["stream_tokens_per_second"] = stream_throughput(datasets["streamed"], settings, blocks=2000)
    results = {**summary, "settings": settings, "runs": runs, "total_seconds": time.perf_counter() - start}
    if step_profile is not None:
        results["step_profile"] = step_profile
    write_json(results_path, results)
    write_report(output_dir, comparison.format_report(summary))
    if args.compare == "loader_processes":
        print(loader_processes.plot(results, os.path.splitext(results_path)[0] + ".png"))
    print(f"wrote {results_path} ({results['total_seconds']:.0f}s in all)")
    return results
