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
- `outer_step_seconds` and `outer_overhead[H]`: AdLoCo's end-of-round work per round, and its share of a round;
- `step_profile` (optional, `--step_profile 1 2 4 8 16`): seconds of one forward/backward of b sequences per
  micro-batch size b, of one optimizer step (gradient clipping, AdamW, zero_grad) and of an outer step's local work,
  measured in a bare loop (no Trainer) by `--step_profile_processes` concurrent processes (the median over them), so
  that 4 workers sharing 2 cores can be measured under the same contention. `recipes.benchmarks.wallclock` reads it as its device
  profile.

    python -m recipes.benchmarks.overhead --quick          # from the repository root; < 5 minutes on 2 CPU cores
    python -m recipes.benchmarks.overhead                  # more repeats and rounds
    python -m recipes.benchmarks.overhead --device cuda --preset microllama --fp16
    # only the step profile, 4 processes on the cores as convergence.py's 4 workers (seconds):
    python -m recipes.benchmarks.overhead --step_profile 1 2 4 8 16 --step_profile_processes 4 --step_profile_only

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
        data={"corpus": "builtin:python-source", "vocab_size": 4096},
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


def _profile_process(job: dict) -> dict:
    """One process of the step profile: forward/backward per micro-batch size, optimizer step, outer step."""
    import torch

    from adloco_hf.presets import build_model

    torch.set_num_threads(job["threads"])
    device = torch.device(job["device"])
    overrides = {"max_position_embeddings": max(256, job["block_size"])}
    model = build_model(job["preset"], vocab_size=job["vocab_size"], seed=0, config_overrides=overrides).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    params = [p for p in model.parameters() if p.requires_grad]
    numel = sum(p.numel() for p in params)
    phi = torch.zeros(numel, device=device)
    momentum = torch.zeros(numel, device=device)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    generator = torch.Generator().manual_seed(0)
    inputs = {
        b: torch.randint(0, job["vocab_size"], (b, job["block_size"]), generator=generator).to(device)
        for b in job["sizes"]
    }
    fb: dict[int, list[float]] = {b: [] for b in job["sizes"]}
    opt, outer = [], []
    for rep in range(job["warmup"] + job["repeats"]):
        for b in job["sizes"]:  # interleaved, so a slow spell of the machine hits every size alike
            sync()
            start = time.perf_counter()
            with torch.autocast(device.type, dtype=torch.float16, enabled=job["fp16"]):
                loss = model(input_ids=inputs[b], labels=inputs[b]).loss
            loss.backward()
            sync()
            middle = time.perf_counter()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            sync()
            end = time.perf_counter()
            # An outer step's local work: Δ = φ − θ, momentum SGD on φ, θ ← φ (no communication).
            with torch.no_grad():
                offset, delta = 0, torch.empty_like(phi)
                for p in params:
                    delta[offset : offset + p.numel()].copy_(p.reshape(-1)).neg_().add_(
                        phi[offset : offset + p.numel()]
                    )
                    offset += p.numel()
                momentum.mul_(0.5).add_(delta)
                phi.add_(momentum, alpha=-0.5)
                offset = 0
                for p in params:
                    p.copy_(phi[offset : offset + p.numel()].view_as(p))
                    offset += p.numel()
            sync()
            if rep >= job["warmup"]:
                fb[b].append(middle - start)
                opt.append(end - middle)
                outer.append(time.perf_counter() - end)
    result = {
        "micro_batch_seconds": {str(b): statistics.median(v) for b, v in fb.items()},
        "optimizer_seconds": statistics.median(opt),
        "outer_seconds": statistics.median(outer),
        "parameters": numel,
    }
    b = job.get("trainer_batch")
    if b:  # the plain Trainer's step at batch b: what a real step adds to the bare loop (data, bookkeeping)
        import tempfile

        from recipes.benchmarks._convergence_worker import load_data

        settings = {**job["settings"], "batch_size": b, "inner_steps": 20, "rounds": 1, "warmup": 5}
        tokenizer, lm = load_data(settings)
        with tempfile.TemporaryDirectory() as tmp:
            step = run_variant("trainer", settings, tokenizer, lm, tmp)["ordinary_step_seconds"]
        bare = statistics.median(fb[b]) if b in fb else None
        result["trainer_step_seconds"] = {str(b): step}
        if bare is not None:
            result["step_overhead_seconds"] = max(0.0, step - bare - result["optimizer_seconds"])
    return result


def measure_step_profile(
    settings: dict, vocab_size: int, sizes: list[int], processes: int, repeats: int, trainer_batch: int | None = None
) -> dict:
    """The device profile `recipes.benchmarks.wallclock` replays runs with, from `processes` concurrent processes (median over them).

    Each process runs `settings["threads"]` torch threads; the processes start together and interleave the sizes, so
    they contend for the cores as the workers of one launch do. With `trainer_batch` (one of `sizes`), each process
    then times the plain Trainer's steps at that batch: `step_overhead_seconds` is what such a step takes beyond the
    bare forward/backward and optimizer step.
    """
    import multiprocessing

    job = {
        "preset": settings["preset"],
        "vocab_size": vocab_size,
        "block_size": settings["block_size"],
        "device": settings["device"],
        "fp16": settings["fp16"],
        "threads": settings["threads"],
        "sizes": sorted(set(sizes)),
        "repeats": repeats,
        "warmup": 2,
        "trainer_batch": trainer_batch,
        "settings": settings,
    }
    if processes == 1:
        per_process = [_profile_process(job)]
    else:
        with multiprocessing.get_context("spawn").Pool(processes) as pool:
            per_process = pool.map(_profile_process, [job] * processes)
    return {
        "micro_batch_seconds": {
            str(b): statistics.median(p["micro_batch_seconds"][str(b)] for p in per_process) for b in job["sizes"]
        },
        "optimizer_seconds": statistics.median(p["optimizer_seconds"] for p in per_process),
        "outer_seconds": statistics.median(p["outer_seconds"] for p in per_process),
        **(
            {"step_overhead_seconds": statistics.median(p["step_overhead_seconds"] for p in per_process)}
            if trainer_batch
            else {}
        ),
        "parameters": per_process[0]["parameters"],
        "processes": processes,
        "threads_per_process": settings["threads"],
        "repeats": repeats,
        **{k: settings[k] for k in ("preset", "block_size", "device", "fp16")},
        "per_process": per_process,
    }


def _rounds(output_dir: str) -> list[dict]:
    from adloco_hf.reporting.run_log import load_rounds

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
    parser.add_argument(
        "--step_profile",
        type=int,
        nargs="+",
        default=None,
        metavar="B",
        help="Also measure the step profile (wallclock.py's device profile) at these micro-batch sizes.",
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
    report = format_report(summary)
    with open(os.path.join(output_dir, "table.md"), "w", encoding="utf-8") as f:
        f.write(report + "\n")
    print(report)
    print(f"wrote {os.path.join(output_dir, 'results.json')} ({results['total_seconds']:.0f}s in all)")
    return results


if __name__ == "__main__":
    main()
