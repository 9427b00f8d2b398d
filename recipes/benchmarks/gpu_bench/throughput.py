"""Steps (a) and (b) of `gpu_bench`: one process, no launch.

(a) `throughput-50m`, `throughput-300m`: tokens/s, MFU and peak memory of the plain `Trainer`, of `AdLoCoTrainer`
without statistics (`batch_size_test="none"`), with them (`adloco_stats`: the norm test with `batch_size_cap` =
the batch, so the request stays while the last step of every round is split into two hooked halves) and with its
outer state on the CPU (`adloco_cpu_state`: `outer_state_device="cpu"`); each eager and compiled
(`torch_compile=True`), all in bf16 with the fused AdamW (CUDA) on the same model, batch and Arrow data, read by the
main process (0 loader workers) and by `loader_workers` processes (`dataloader_num_workers`). AdLoCo refused loader
workers before issue 38's point 1: such a run is recorded with the library's message (`refused`) and runs, with no
change here, once `AdLoCoConfig` takes them. A run trains `warmup` steps untimed (compilation, the first round's end
and its recompile) and then `timed_rounds` whole rounds, timed from the first timed step's `on_step_begin` to the
last one's end, AdLoCo's round ends included; each step's time also splits the round's end from an ordinary step
(`round_end_extra_seconds`). Peak memory is the run's own: the device's peak less what was allocated at its start.

(b) `growing-batch`: a compiled AdLoCo worker whose request grows from 4 to 64 under the norm test with the paper's
controller (one round's statistics, a non-positive signal clamped: ×1/η² jumps), every size at once
(`max_batch_size` = 64): the graphs dynamo built, the sizes that ran, and tokens/s at the final size against a
compiled run of AdLoCo that trains at that size from the start (its only graph static).

    python -m recipes.benchmarks.gpu_bench.throughput --step throughput-50m --results_dir DIR [--tiny]
    # torch.compile on a CPU (inductor), the request growing 4 -> 64, as compat.py's warning quotes:
    python -m recipes.benchmarks.gpu_bench.throughput --step growing-batch --tiny --compile_backend inductor \\
        --set start=4 cap=64 rounds=14 inner_steps=5 fixed_steps=30 block_size=64 --results_dir outputs/gpu_bench/cpu-grow
"""

import argparse
import gc
import json
import os
import shutil
import sys
import time

from adloco_hf.inspection import load_rounds
from recipes.benchmarks.gpu_bench.data import load_blocks
from recipes.benchmarks.gpu_bench.device import device_info, flops_per_token, mfu
from recipes.benchmarks.gpu_bench.step_cli import finish_step, step_parser, stop_on_sigterm
from recipes.benchmarks.toolkit.data import make_model
from recipes.benchmarks.toolkit.paths import REPO
from recipes.benchmarks.toolkit.stats import median_spread


DESCRIPTION = "Steps (a) and (b) of `gpu_bench`: one process, no launch."
VARIANTS = ("trainer", "adloco", "adloco_stats", "adloco_cpu_state")
# The variants also run with loader workers (the outer state's place does not change how data is read).
WITH_LOADER_WORKERS = ("trainer", "adloco", "adloco_stats")
FULL = {
    "throughput-50m": {"preset": "llama-50m", "block_size": 512, "batch": 64, "inner_steps": 25, "timed_rounds": 2,
                       "loader_workers": 4},
    "throughput-300m": {"preset": "microllama", "block_size": 512, "batch": 32, "inner_steps": 25, "timed_rounds": 2,
                        "loader_workers": 4},
    "growing-batch": {"preset": "llama-50m", "block_size": 512, "start": 4, "cap": 64, "inner_steps": 10, "rounds": 24,
                      "fixed_steps": 40},
}  # fmt: skip
# --tiny: the same steps with the tiny model, short blocks, small batches and rounds (on a CPU in seconds).
TINY = {
    step: {**FULL[step], "preset": "tiny", **smaller}
    for step, smaller in {
        "throughput-50m": {"block_size": 32, "batch": 4, "inner_steps": 2, "loader_workers": 2},
        "throughput-300m": {"block_size": 64, "batch": 4, "inner_steps": 2, "loader_workers": 2},
        "growing-batch": {"block_size": 32, "start": 2, "cap": 16, "inner_steps": 2, "rounds": 8, "fixed_steps": 6},
    }.items()
}
# Every step packs the corpus into blocks of 512 tokens: one packing (a minute or two) serves the whole benchmark.
STEPS = tuple(FULL)


def settings_for(step: str, tiny: bool, cache_dir: str, overrides: dict | None = None) -> dict:
    """The step's settings (`FULL` or `TINY`), then `overrides` (`--set`, `--compile_backend`)."""
    import torch

    cuda = torch.cuda.is_available()
    settings = dict((TINY if tiny else FULL)[step])
    settings.update(
        tiny=tiny,
        cuda=cuda,
        cache_dir=cache_dir,
        seed=42,
        learning_rate=3e-4,
        optim="adamw_torch_fused" if cuda else "adamw_torch",
        # On a CPU (--tiny) inductor's C++ compilation would take minutes and AOT autograd's traces most of the
        # test's time: dynamo alone still captures the graphs, counts them and recompiles on a new batch size.
        compile_backend="inductor" if cuda or not tiny else "eager",
    )
    settings.update(overrides or {})
    return settings


class StepClock:
    """Per-step times (device synchronised) from two callbacks: `begin` before AdLoCo's callback, `end` after it."""

    def __init__(self, trainer_of):
        import torch
        from transformers import TrainerCallback

        sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
        self.begin, self.end, self.batch = {}, {}, {}
        clock = self

        class Begin(TrainerCallback):
            def on_step_begin(self, args, state, control, **kwargs):
                sync()
                clock.begin[state.global_step + 1] = time.perf_counter()
                sampler = getattr(trainer_of(), "train_sampler", None)
                clock.batch[state.global_step + 1] = getattr(sampler, "batch_size", None)

        class End(TrainerCallback):
            def on_step_end(self, args, state, control, **kwargs):
                sync()
                clock.end[state.global_step] = time.perf_counter()

        self.callbacks = (Begin(), End())


def _adloco_rules(variant: str, settings: dict, batch: int) -> dict:
    """AdLoCo's settings of a throughput variant (module docstring)."""
    return {
        "batch_size_test": "norm" if variant == "adloco_stats" else "none",
        "batch_size_target": "test",  # the statistics' cost alone (the goodput rule also times every step)
        "batch_size_cap": batch if variant == "adloco_stats" else None,
        # a micro-batch below the batch: switch mode accumulates every step (the statistics' groups are then the
        # micro-batches, of the same shapes as every other step's)
        "max_batch_size": settings.get("max_batch_size") or batch,
        "switch_threshold": settings.get("switch_threshold", 2.0),
        "outer_state_device": "cpu" if variant == "adloco_cpu_state" else "device",
    }


def train_once(
    settings: dict,
    lm,
    tokenizer,
    *,
    variant: str,
    compiled: bool,
    steps: int,
    batch: int,
    out: str,
    adloco: dict | None = None,
    loader_workers: int = 0,
) -> tuple:
    """Train `steps` steps of one variant from fresh weights; returns (clock, trainer facts), or (None, {"refused":
    the library's message}) when AdLoCo refuses the run's settings (loader workers before it took them)."""
    import torch
    from torch._dynamo.utils import counters
    from transformers import Trainer, TrainingArguments, default_data_collator

    from adloco_hf import AdLoCoConfig, AdLoCoTrainer

    torch._dynamo.reset()
    counters.clear()
    gc.collect()
    if settings["cuda"]:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    at_start = torch.cuda.memory_allocated() if settings["cuda"] else None
    common = dict(
        output_dir=out, per_device_train_batch_size=batch, learning_rate=settings["learning_rate"],
        lr_scheduler_type="constant", optim=settings["optim"], max_grad_norm=1.0, max_steps=steps,
        seed=settings["seed"], data_seed=settings["seed"], use_cpu=not settings["cuda"], bf16=True,
        torch_compile=compiled, torch_compile_backend=settings["compile_backend"] if compiled else None,
        save_strategy="no", eval_strategy="no", logging_strategy="no", report_to="none", disable_tqdm=True,
        dataloader_num_workers=loader_workers, dataloader_persistent_workers=loader_workers > 0,
    )  # fmt: skip
    if variant == "trainer":
        args = TrainingArguments(**common)
    else:
        rules = dict(adloco) if adloco else _adloco_rules(variant, settings, batch)
        try:
            args = AdLoCoConfig(**common, inner_steps=settings["inner_steps"], save_merges=False, **rules)
        except ValueError as error:  # the switch: loader workers run here once AdLoCoConfig takes them
            return None, {"refused": str(error).split(". ")[0]}
    model = make_model({"preset": settings["preset"], "block_size": settings["block_size"], "seed": settings["seed"]},
                       tokenizer)  # fmt: skip
    holder: list = []
    clock = StepClock(lambda: holder[0])
    trainer_class = Trainer if variant == "trainer" else AdLoCoTrainer
    trainer = trainer_class(model=model, args=args, train_dataset=lm["train"], data_collator=default_data_collator)
    holder.append(trainer)
    trainer.callback_handler.callbacks.insert(0, clock.callbacks[0])
    trainer.add_callback(clock.callbacks[1])
    trainer.train()
    facts = {
        "graphs": int(counters["stats"]["unique_graphs"]),
        "graph_breaks": int(sum(counters["graph_break"].values())),
        "peak_memory_bytes": torch.cuda.max_memory_allocated() if settings["cuda"] else None,
        "memory_at_start_bytes": at_start,
        "flops": flops_per_token(model.config, settings["block_size"]),
        "parameters_total": sum(p.numel() for p in model.parameters()),
        "compiled_is_used": compiled and type(trainer.model_wrapped).__name__ == "OptimizedModule",
    }
    if variant != "trainer":
        facts["rounds"] = [{k: line.get(k) for k in ("batch_size", "next_batch_size", "grad_variance")}
                           for line in load_rounds(out)]  # fmt: skip
    # The clock outlives the run (the caller reads it during the next one): it must not keep this trainer, its model
    # and optimizer alive, as it did through `holder` until issue 38 (each run's peak memory then held the previous
    # run's weights, AdamW moments and outer state: +24 bytes a parameter for AdLoCo after the Trainer, +36 for the
    # statistics run after AdLoCo, on the H200).
    holder.clear()
    del trainer, model
    gc.collect()
    shutil.rmtree(out, ignore_errors=True)
    return clock, facts


def window(clock: StepClock, first: int, last: int, tokens_per_step: int, inner_steps: int) -> dict:
    """Tokens/s over steps `first`..`last`, the steps' spread, and where the time went: an ordinary step (its
    passes and optimizer step), what a round's last step costs above it (AdLoCo's round end: the statistics'
    halves and the outer step), and the mean gap between two steps (the Trainer fetching and collating the next
    batch: the data path)."""
    seconds = {s: clock.end[s] - clock.begin[s] for s in range(first, last + 1)}
    total = clock.end[last] - clock.begin[first]
    ordinary = median_spread([t for s, t in seconds.items() if s % inner_steps])
    ends = [t for s, t in seconds.items() if s % inner_steps == 0]
    return {"tokens_per_second": tokens_per_step * (last - first + 1) / total, "window_seconds": total,
            "step_seconds": median_spread(list(seconds.values())), "ordinary_step_seconds": ordinary,
            "round_end_extra_seconds": sum(ends) / len(ends) - ordinary["median"] if ends else None,
            "between_steps_seconds": (total - sum(seconds.values())) / max(last - first, 1),
            "warmup_seconds": clock.begin[first] - clock.begin[1]}  # fmt: skip


def throughput(step: str, settings: dict, tokenizer, lm, work: str, peak: float | None) -> dict:
    h, batch = settings["inner_steps"], settings["batch"]
    warmup = h + 2  # the first round's end (and the statistics halves' recompile) stays out of the timed window
    steps = warmup + settings["timed_rounds"] * h
    rows = []
    for compiled in (False, True):
        for variant in VARIANTS:
            loaders = (0, settings["loader_workers"]) if variant in WITH_LOADER_WORKERS else (0,)
            for workers in loaders:
                row = {"variant": variant, "compiled": compiled, "loader_workers": workers, "batch": batch,
                       "block_size": settings["block_size"]}  # fmt: skip
                clock, facts = train_once(settings, lm, tokenizer, variant=variant, compiled=compiled, steps=steps,
                                          batch=batch, out=os.path.join(work, variant), loader_workers=workers)  # fmt: skip
                row.update(facts)
                if clock is None:
                    print(f"[{step}] {variant:>16} compiled={compiled} loader workers {workers}: refused "
                          f"({facts['refused']})", flush=True)  # fmt: skip
                    rows.append(row)
                    continue
                row.update(window(clock, warmup + 1, steps, batch * settings["block_size"], h))
                row["mfu"] = mfu(row["tokens_per_second"], facts["flops"]["flops"], peak)
                rows.append(row)
                print(f"[{step}] {variant:>16} compiled={compiled} loader workers {workers}: "
                      f"{row['tokens_per_second']:,.0f} tokens/s, graphs {row['graphs']}", flush=True)  # fmt: skip
    for row in rows:
        plain = next(r for r in rows if r["variant"] == "trainer" and r["compiled"] == row["compiled"]
                     and r["loader_workers"] == row["loader_workers"])  # fmt: skip
        if "refused" not in row:
            row["ratio_to_trainer"] = row["tokens_per_second"] / plain["tokens_per_second"]
    measured = next(r for r in rows if "flops" in r)
    return {"rows": rows, "parameters": measured["flops"]["matmul_parameters"],
            "parameters_total": measured["parameters_total"]}  # fmt: skip


def growing_batch(step: str, settings: dict, tokenizer, lm, work: str, peak: float | None) -> dict:
    """A compiled run whose request grows, then a compiled run at its final size from the start."""
    h = settings["inner_steps"]
    rules = {"batch_size_test": "norm", "batch_size_target": "test", "batch_size_cap": settings["cap"], "max_batch_size": settings["cap"],
             "eta": 0.8, "batch_size_smoothing": 0.0, "nonpositive_signal": "clamp"}  # fmt: skip
    steps = settings["rounds"] * h
    clock, grow = train_once(settings, lm, tokenizer, variant="adloco", compiled=True, steps=steps,
                             batch=settings["start"], out=os.path.join(work, "grow"), adloco=rules)  # fmt: skip
    final = clock.batch[steps]
    # Steps at the final size, after its first round (recompiles), without the statistics steps (halves).
    at_final = [s for s in range(1, steps + 1) if clock.batch[s] == final and s % h != 0]
    first_round_end = -(-min(at_final) // h) * h if at_final else None
    timed = [s for s in at_final if s > first_round_end] if at_final else []
    tokens = final * settings["block_size"]
    grown = {"final_batch": final, "sizes": sorted({b for b in clock.batch.values() if b}), **grow}
    # The slowest steps: compilations show there (the first step, and the step whose new shape recompiled).
    slowest = sorted(range(1, steps + 1), key=lambda s: clock.begin[s] - clock.end[s])[:3]
    grown["slowest_steps"] = [{"step": s, "batch": clock.batch[s], "seconds": clock.end[s] - clock.begin[s]}
                              for s in sorted(slowest)]  # fmt: skip
    if timed:
        grown["step_seconds"] = median_spread([clock.end[s] - clock.begin[s] for s in timed])
        grown["tokens_per_second"] = tokens / grown["step_seconds"]["median"]
    fixed_steps = settings["fixed_steps"]
    clock, fixed = train_once(settings, lm, tokenizer, variant="adloco", compiled=True, steps=fixed_steps,
                              batch=final, out=os.path.join(work, "fixed"))  # fmt: skip
    ordinary = [s for s in range(3, fixed_steps + 1) if s % h != 0]
    fixed["step_seconds"] = median_spread([clock.end[s] - clock.begin[s] for s in ordinary])
    fixed["tokens_per_second"] = tokens / fixed["step_seconds"]["median"]
    ratio = grown.get("tokens_per_second", 0) / fixed["tokens_per_second"] if timed else None
    for run in (grown, fixed):
        run["mfu"] = mfu(run.get("tokens_per_second"), run["flops"]["flops"], peak)
    print(f"[{step}] sizes {grown['sizes']}, graphs {grown['graphs']}, ratio to fixed {ratio}", flush=True)
    return {"grown": grown, "fixed": fixed, "ratio_to_fixed": ratio, "timed_steps": len(timed)}


def run(step: str, results_dir: str, cache_dir: str, tiny: bool, overrides: dict | None = None) -> str:
    started = time.perf_counter()
    import torch
    import transformers

    transformers.utils.logging.set_verbosity_error()
    if not torch.cuda.is_available():
        torch.set_num_threads(1)
    settings = settings_for(step, tiny, cache_dir, overrides)
    tokenizer, lm, data_seconds = load_blocks(settings)
    device = device_info()
    work = os.path.join(REPO, "outputs", "gpu_bench", "runs", step)
    measure = growing_batch if step == "growing-batch" else throughput
    result = {**measure(step, settings, tokenizer, lm, work, device["peak_bf16_flops"]), "data_seconds": data_seconds}
    return finish_step(step, results_dir, settings, result, started, device)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = step_parser(STEPS, DESCRIPTION)
    parser.add_argument("--compile_backend", default=None, help="e.g. inductor on a CPU (--tiny's default: eager)")
    parser.add_argument("--set", nargs="*", default=[], metavar="KEY=JSON", help="Override a setting, e.g. start=4.")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    stop_on_sigterm()
    overrides = {key: json.loads(value) for key, _, value in (item.partition("=") for item in args.set)}
    if args.compile_backend:
        overrides["compile_backend"] = args.compile_backend
    path = run(args.step, os.path.abspath(args.results_dir), os.path.abspath(args.cache_dir), args.tiny, overrides)
    print(f"wrote {path}")


if __name__ == "__main__":
    sys.exit(main())
