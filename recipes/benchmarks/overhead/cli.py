"""`python -m recipes.benchmarks.overhead`: the variants alternated over the repeats, the summary, the step profile."""

import argparse
import math
import os
import time

import torch
import transformers

from recipes.benchmarks.overhead.step_profile import measure_step_profile
from recipes.benchmarks.overhead.summary import format_report, summarize
from recipes.benchmarks.overhead.variants import VARIANTS, run_variant, settings_from
from recipes.benchmarks.toolkit.data import load_data
from recipes.benchmarks.toolkit.paths import REPO
from recipes.benchmarks.toolkit.results import write_json, write_report


__all__ = ["main", "parse_args"]

DESCRIPTION = (
    "What AdLoCo costs a worker: throughput against the plain Trainer, and the price of the gradient statistics."
)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=DESCRIPTION)
    parser.add_argument("--quick", action="store_true", help="Fewer repeats and rounds (< 5 minutes on 2 CPU cores).")
    parser.add_argument("--output_dir", default="outputs/benchmarks/overhead")
    parser.add_argument("--cache_dir", default="outputs/cache")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--preset", default=None, help="Model preset (default: tiny on CPU, microllama on CUDA).")
    parser.add_argument("--fp16", action="store_true")
    parser.add_argument("--batch_size", type=int, default=None)
    parser.add_argument("--block_size", type=int, default=None)
    parser.add_argument("--inner_steps", type=int, default=None, help="H of the measured runs.")
    parser.add_argument("--rounds", type=int, default=None, help="Rounds per run (all timed but the warm-up steps).")
    parser.add_argument("--warmup", type=int, default=None, help="Untimed steps at the start of each run.")
    parser.add_argument("--repeats", type=int, default=None, help="Alternations of the three variants.")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (the workers of convergence use 1).")
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


def main(argv: list[str] | None = None) -> dict:
    """Measure the variants (or only the step profile) and write `results.json` and `table.md`."""
    args = parse_args(argv)
    os.chdir(REPO)
    start = time.perf_counter()
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: no CUDA device is visible")
    torch.set_num_threads(args.threads)
    transformers.utils.logging.set_verbosity_error()
    settings = settings_from(args)
    output_dir = os.path.abspath(args.output_dir)
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
        print(
            "step profile: "
            + ", ".join(f"b={b} {1000 * s:.1f} ms" for b, s in step_profile["micro_batch_seconds"].items())
            + f"; optimizer {1000 * step_profile['optimizer_seconds']:.1f} ms"
            + f"; outer step {1000 * step_profile['outer_seconds']:.1f} ms"
            + f"; other per-step work {1000 * step_profile.get('step_overhead_seconds', math.nan):.1f} ms",
            flush=True,
        )
        if args.step_profile_only:
            results = {
                "step_profile": step_profile,
                "settings": settings,
                "total_seconds": time.perf_counter() - start,
            }
            write_json(os.path.join(output_dir, "results.json"), results)
            print(f"wrote {os.path.join(output_dir, 'results.json')}")
            return results
    runs = []
    for repeat in range(settings["repeats"]):
        order = VARIANTS[repeat % len(VARIANTS) :] + VARIANTS[: repeat % len(VARIANTS)]
        for variant in order:
            run = run_variant(variant, settings, tokenizer, lm, output_dir)
            run["repeat"] = repeat
            runs.append(run)
            print(
                f"repeat {repeat} {variant:>12}: {run['tokens_per_second']:,.0f} tokens/s, "
                f"step {1000 * run['ordinary_step_seconds']:.1f} ms, round end {1000 * run['round_end_step_seconds']:.1f}"
                f" + {1000 * run['end_of_round_seconds']:.1f} ms",
                flush=True,
            )
    summary = summarize(runs, settings)
    results = {**summary, "settings": settings, "runs": runs, "total_seconds": time.perf_counter() - start}
    if step_profile is not None:
        results["step_profile"] = step_profile
    write_json(os.path.join(output_dir, "results.json"), results)
    write_report(output_dir, format_report(summary))
    print(f"wrote {os.path.join(output_dir, 'results.json')} ({results['total_seconds']:.0f}s in all)")
    return results
