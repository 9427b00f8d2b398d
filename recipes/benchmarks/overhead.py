"""What AdLoCo costs a worker: throughput against the plain Trainer, and the price of the gradient statistics.

One worker, one process, the same model, data, fixed batch and inner optimizer (`adamw_torch`) for every variant:

| variant | what it is |
|---|---|
| `trainer` | the plain `transformers.Trainer` |
| `adloco` | `AdLoCoTrainer`, one instance, fixed batch (`batch_size_test="none"`): sampler, inner step, outer step every H steps |
| `adloco_stats` | the same with the norm test's statistics on (`batch_size_test="norm"`, `batch_size_cap` = the batch, so it stays fixed): the last step of every round is split in two halves and hooked |

The variants run alternately in one process (the order rotates every repeat, so slow drifts of a shared machine hit
them alike), each from freshly built weights. Only training steps are timed: a callback added after AdLoCo's
measures from `on_step_begin` of the first timed step (after a few warm-up steps) to `on_step_end` of the last, which
ends a round, so every outer step of the run is inside the window; no saving, no evaluation. A second callback, registered before
AdLoCo's, splits each step into the step itself and AdLoCo's end-of-round work (outer step, round bookkeeping).

Reported (`results.json`, and a table):
- `throughput_ratio`: tokens/s of `adloco` / tokens/s of `trainer`, paired per repeat: median and spread;
  `throughput_ratio_with_stats` the same for `adloco_stats`;
- `stats_step_extra_seconds`: (statistics step − ordinary step) with statistics on, minus the same difference with
  them off, from per-step medians pooled over the repeats. It can be negative: on a CPU, two half-batch passes can
  be cheaper than one full pass (smaller logits stay in cache);
- `stats_overhead[H]`: that extra time (0 when negative) per round / the round's time, for H = 50 and 200;
- `outer_step_seconds` and `outer_overhead[H]`: AdLoCo's end-of-round work per round, and its share of a round.

    python -m recipes.benchmarks.overhead --quick          # from the repository root; < 5 minutes on 2 CPU cores
    python -m recipes.benchmarks.overhead                  # more repeats and rounds
    python -m recipes.benchmarks.overhead --device cuda --preset microllama --fp16

Outputs in `--output_dir` (default `outputs/benchmarks/overhead`): `results.json` and `table.md`.
"""

import argparse
import gc
import math
import os
import statistics
import time


# Before anything imports huggingface_hub (which reads them once): the benchmark never needs the network.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from recipes.benchmarks._common import REPO, median_spread, table, write_json  # noqa: E402


VARIANTS = ("trainer", "adloco", "adloco_stats")
REPORT_INNER_STEPS = (50, 200)
PROFILES = {
    ("cpu", "quick"): {"batch_size": 8, "inner_steps": 25, "rounds": 2, "repeats": 9, "warmup": 5},
    ("cpu", "full"): {"batch_size": 8, "inner_steps": 50, "rounds": 3, "repeats": 15, "warmup": 5},
    ("cuda", "quick"): {"batch_size": 8, "inner_steps": 25, "rounds": 2, "repeats": 9, "warmup": 5},
    ("cuda", "full"): {"batch_size": 8, "inner_steps": 50, "rounds": 3, "repeats": 15, "warmup": 5},
}


class StepClock:
    """Per-step timestamps shared by two callbacks: `Before` runs before AdLoCo's callback, `After` after it."""

    def __init__(self, synchronize):
        self.synchronize = synchronize
        self.begin: dict[int, float] = {}
        self.pre: dict[int, float] = {}
        self.post: dict[int, float] = {}
        self.cpu_begin: float | None = None
        self.cpu_end: float | None = None

    def now(self) -> float:
        self.synchronize()
        return time.perf_counter()


def make_callbacks(clock: StepClock, first_timed_step: int):
    from transformers import TrainerCallback

    class Before(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            clock.begin[state.global_step + 1] = clock.now()
            if state.global_step == first_timed_step - 1:
                clock.cpu_begin = time.process_time()

        def on_step_end(self, args, state, control, **kwargs):
            clock.pre[state.global_step] = clock.now()

    class After(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            clock.post[state.global_step] = clock.now()
            clock.cpu_end = time.process_time()

    return Before(), After()


def settings_from(args: argparse.Namespace) -> dict:
    profile = PROFILES[("cuda" if args.device == "cuda" else "cpu", "quick" if args.quick else "full")]
    settings = dict(profile)
    for name in ("batch_size", "inner_steps", "rounds", "repeats", "warmup"):
        if getattr(args, name) is not None:
            settings[name] = getattr(args, name)
    settings.update(
        device=args.device,
        preset=args.preset or ("microllama" if args.device == "cuda" else "tiny"),
        fp16=bool(args.fp16),
        block_size=args.block_size or (256 if args.device == "cuda" else 128),
        threads=args.threads,
        seed=42,
        learning_rate=1e-3,
        data={"corpus": "builtin:python-docs", "vocab_size": 4096},
        cache_dir=os.path.abspath(args.cache_dir),
    )
    return settings


def run_variant(variant: str, settings: dict, tokenizer, lm, output_dir: str) -> dict:
    """Train one variant for `rounds` × H steps, the first `warmup` of them untimed; return its timings.

    The run ends on a round end, so the timed window holds all `rounds` outer steps (the first round is timed from
    step `warmup` + 1 on, which slightly over-weights the outer step: a conservative choice for AdLoCo).
    """
    import torch
    from transformers import Trainer, TrainingArguments, default_data_collator

    from adloco_hf import AdLoCoConfig, AdLoCoTrainer
    from recipes.benchmarks._convergence_worker import make_model

    h, rounds, batch, warmup = settings["inner_steps"], settings["rounds"], settings["batch_size"], settings["warmup"]
    total = h * rounds
    if not 0 <= warmup < total:
        raise ValueError(f"warmup={warmup} must be below rounds × inner_steps = {total}")
    on_cuda = settings["device"] == "cuda"
    common = {
        "output_dir": os.path.join(output_dir, "runs", variant),
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
        "dataloader_num_workers": 0,
    }
    if variant == "trainer":
        args = TrainingArguments(**common)
    else:
        stats = variant == "adloco_stats"
        args = AdLoCoConfig(
            **common,
            inner_steps=h,
            num_instances=1,
            batch_size_test="norm" if stats else "none",
            batch_size_cap=batch if stats else None,
            max_batch_size=batch,
            save_merges=False,
        )
    model = make_model(settings, tokenizer)
    clock = StepClock(torch.cuda.synchronize if on_cuda else (lambda: None))
    before, after = make_callbacks(clock, warmup + 1)
    trainer_class = Trainer if variant == "trainer" else AdLoCoTrainer
    trainer = trainer_class(model=model, args=args, train_dataset=lm["train"], data_collator=default_data_collator)
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
        "variant": variant,
        "tokens_per_second": tokens / window,
        # CPU seconds of this process over the same window (equal to the wall time when nothing else competes).
        "tokens_per_cpu_second": tokens / (clock.cpu_end - clock.cpu_begin),
        "window_seconds": window,
        "ordinary_steps": [step_time[s] for s in ordinary],
        "round_end_steps": [step_time[s] for s in round_ends],
        "end_of_round": [clock.post[s] - clock.pre[s] for s in round_ends],
        "ordinary_step_seconds": statistics.median(step_time[s] for s in ordinary),
        "round_end_step_seconds": statistics.median(step_time[s] for s in round_ends),
        "end_of_round_seconds": statistics.median(clock.post[s] - clock.pre[s] for s in round_ends),
    }
    if variant == "adloco_stats":
        sizes = {line["batch_size"] for line in _rounds(args.output_dir)}
        if sizes != {batch}:
            raise RuntimeError(f"adloco_stats changed its batch ({sizes}); batch_size_cap should have fixed it")
        variances = [line["grad_variance"] for line in _rounds(args.output_dir)]
        if not all(v is not None and math.isfinite(v) for v in variances):
            raise RuntimeError(f"adloco_stats gathered no statistics: grad_variance per round {variances}")
    del trainer, model
    gc.collect()
    if on_cuda:
        torch.cuda.empty_cache()
    return result


def _rounds(output_dir: str) -> list[dict]:
    from adloco_hf.run_log import load_rounds

    return load_rounds(output_dir)


def _pooled(complete: list[dict], variant: str, key: str) -> float:
    return statistics.median(t for r in complete for t in r[variant][key])


def summarize(runs: list[dict], settings: dict) -> dict:
    """Pair the variants within each repeat for the throughput ratios; pool the per-step times over the repeats."""
    by_repeat: dict[int, dict[str, dict]] = {}
    for run in runs:
        by_repeat.setdefault(run["repeat"], {})[run["variant"]] = run
    complete = [r for r in by_repeat.values() if all(v in r for v in VARIANTS)]
    if not complete:
        raise ValueError("no repeat ran all three variants")
    ratios = [r["adloco"]["tokens_per_second"] / r["trainer"]["tokens_per_second"] for r in complete]
    ratios_stats = [r["adloco_stats"]["tokens_per_second"] / r["trainer"]["tokens_per_second"] for r in complete]
    ratios_cpu = [r["adloco"]["tokens_per_cpu_second"] / r["trainer"]["tokens_per_cpu_second"] for r in complete]
    step = {v: _pooled(complete, v, "ordinary_steps") for v in VARIANTS}
    round_end = {v: _pooled(complete, v, "round_end_steps") for v in VARIANTS}
    outer = _pooled(complete, "adloco", "end_of_round")
    # A statistics step against an ordinary step of the same variant, minus the same difference without statistics
    # (which is 0 up to noise): what the split into two halves and the hooks cost, whatever the step's position.
    extra_with = round_end["adloco_stats"] - step["adloco_stats"]
    extra_without = round_end["adloco"] - step["adloco"]
    extra = extra_with - extra_without
    h_run = settings["inner_steps"]
    adloco_round = (h_run - 1) * step["adloco"] + round_end["adloco"] + outer
    stats_overhead, outer_overhead = {}, {}
    for h in sorted({*REPORT_INNER_STEPS, h_run}):
        round_time = h * step["adloco"] + outer
        stats_overhead[str(h)] = max(extra, 0.0) / round_time
        outer_overhead[str(h)] = outer / round_time
    return {
        "throughput_ratio": statistics.median(ratios),
        "throughput_ratio_spread": median_spread(ratios),
        "throughput_ratio_cpu_time": statistics.median(ratios_cpu),
        "throughput_ratio_cpu_time_spread": median_spread(ratios_cpu),
        "throughput_ratio_with_stats": statistics.median(ratios_stats),
        "throughput_ratio_with_stats_spread": median_spread(ratios_stats),
        # The same ratio from the pooled per-step medians (robust to bursts of a shared machine): H plain steps
        # against H AdLoCo steps plus one end of round.
        "throughput_ratio_from_step_medians": h_run * step["trainer"] / adloco_round,
        "tokens_per_second": {v: statistics.median(r[v]["tokens_per_second"] for r in complete) for v in VARIANTS},
        "step_seconds": step,
        "round_end_step_seconds": round_end,
        "stats_step_extra_seconds": extra,
        "stats_step_extra_within_run_seconds": extra_with,
        "round_end_extra_without_stats_seconds": extra_without,
        "stats_step_relative": extra / step["adloco_stats"],
        "stats_overhead": stats_overhead,
        "outer_step_seconds": outer,
        "outer_overhead": outer_overhead,
        "repeats": len(complete),
    }


def format_report(summary: dict) -> str:
    spread = summary["throughput_ratio_spread"]
    rows = [
        {
            "variant": v,
            "tokens/s (median)": summary["tokens_per_second"][v],
            "ratio to trainer": summary["tokens_per_second"][v] / summary["tokens_per_second"]["trainer"],
            "ordinary step ms": 1000 * summary["step_seconds"][v],
        }
        for v in VARIANTS
    ]
    lines = [table(rows, ["variant", "tokens/s (median)", "ratio to trainer", "ordinary step ms"])]
    lines.append(
        f"\nthroughput_ratio (adloco / trainer, paired per repeat): median {summary['throughput_ratio']:.4f}, "
        f"min {spread['min']:.4f}, max {spread['max']:.4f}, IQR/2 {100 * spread['iqr_half_rel']:.2f}% "
        f"over {spread['n']} repeats; with statistics: {summary['throughput_ratio_with_stats']:.4f}; "
        f"on CPU time instead of wall time: {summary['throughput_ratio_cpu_time']:.4f}; from pooled per-step medians: "
        f"{summary['throughput_ratio_from_step_medians']:.4f}"
    )
    lines.append(
        f"statistics step: +{1000 * summary['stats_step_extra_seconds']:.2f} ms over an ordinary step "
        f"({100 * summary['stats_step_relative']:.1f}% of one step; round-end step minus ordinary step: "
        f"{1000 * summary['stats_step_extra_within_run_seconds']:+.2f} ms with statistics, "
        f"{1000 * summary['round_end_extra_without_stats_seconds']:+.2f} ms without)"
    )
    overhead_rows = [
        {
            "inner_steps H": h,
            "stats_overhead": summary["stats_overhead"][h],
            "outer step share": summary["outer_overhead"][h],
        }
        for h in summary["stats_overhead"]
    ]
    lines.append(f"end of round (outer step + bookkeeping): {1000 * summary['outer_step_seconds']:.2f} ms per round")
    lines.append(table(overhead_rows, ["inner_steps H", "stats_overhead", "outer step share"]))
    lines.append(
        f"target throughput_ratio >= 0.97: {'holds' if summary['throughput_ratio'] >= 0.97 else 'MISSED'}; "
        "target stats_overhead <= 2%: "
        + ", ".join(f"H={h} {'holds' if v <= 0.02 else 'MISSED'}" for h, v in summary["stats_overhead"].items())
    )
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
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
    parser.add_argument(
        "--threads", type=int, default=1, help="torch CPU threads (the workers of convergence.py use 1)."
    )
    args = parser.parse_args(argv)
    if args.fp16 and args.device != "cuda":
        parser.error("--fp16 needs --device cuda")
    return args


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    os.chdir(REPO)
    start = time.perf_counter()
    import torch
    import transformers

    from recipes.benchmarks._convergence_worker import load_data

    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: no CUDA device is visible")
    torch.set_num_threads(args.threads)
    transformers.utils.logging.set_verbosity_error()
    settings = settings_from(args)
    output_dir = os.path.abspath(args.output_dir)
    tokenizer, lm = load_data(settings)
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
    write_json(os.path.join(output_dir, "results.json"), results)
    report = format_report(summary)
    with open(os.path.join(output_dir, "table.md"), "w", encoding="utf-8") as f:
        f.write(report + "\n")
    print(report)
    print(f"wrote {os.path.join(output_dir, 'results.json')} ({results['total_seconds']:.0f}s in all)")
    return results


if __name__ == "__main__":
    main()
