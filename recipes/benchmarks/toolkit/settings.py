"""The settings every method of a training benchmark shares (`CPU_BASE`, a profile per device and budget, the
command line's overrides), and one launch's spec: the shared settings, the method's own (`methods.py`), the seed.

    settings = shared_settings(parse_run_args(["--quick"]))     # options.py
    spec = method_spec("adloco", settings, "outputs/benchmarks/convergence", seed=43)
"""

import argparse
import copy
import json
import math
import os

from recipes.benchmarks.toolkit.clock.device_profiles import load_profile
from recipes.benchmarks.toolkit.methods import METHODS
from recipes.benchmarks.toolkit.paths import REPO
from recipes.benchmarks.toolkit.testbeds.testbed import parse_rate


__all__ = [
    "ADLOCO_OVERRIDES",
    "CPU_BASE",
    "CUDA",
    "PROFILES",
    "TRAIN_OVERRIDES",
    "VIRTUAL_BUDGET_FACTOR",
    "check_epochs",
    "check_matched",
    "deep_merge",
    "matched_batch_size",
    "matched_for",
    "method_spec",
    "on_links",
    "reads_clock",
    "run_order",
    "shared_settings",
    "virtual_clock_settings",
]

# Shared settings. `train` is identical for every method; `adloco` applies to every AdLoCoTrainer method before
# the method's own overrides (DiLoCo included, where the batch-size and merge settings have no effect).
CPU_BASE = {
    "device": "cpu",
    "preset": "tiny",
    "fp16": False,
    "world_size": 4,
    "backend": "gloo",  # the workers' process group (NCCL refuses several workers on one GPU)
    "threads_per_worker": 1,
    "block_size": 128,
    "seed": 42,
    # The built-in corpus of >= 30 M tokens (no budget here repeats it); eval_blocks: the first 512 of its 898 held-out
    # blocks (65,536 tokens), evaluated every few rounds.
    "data": {"corpus": "builtin:python-source", "vocab_size": 4096, "eval_blocks": 512},
    "train": {
        "batch_size": 4,
        "eval_batch_size": 64,
        "learning_rate": 3e-3,
        "weight_decay": 0.01,
        "adam_beta2": 0.99,
        "warmup_steps": 20,
        "max_grad_norm": 1.0,
        "inner_steps": 25,
        "eval_every_rounds": 2,
    },
    "adloco": {
        # DiLoCo's lr 0.7 / momentum 0.9 are meant for hundreds of rounds; over the ~20-80 rounds here they overshoot
        # (quick budget, DiLoCo: eval perplexity 314 with 0.7/0.9, 237 with 1.0/0.5, 213 with 0.7/0.5, 179 with
        # 0.3/0.7, 180 with plain averaging, 174 with 0.5/0.5). Every AdLoCo method shares the baseline's best.
        "outer_lr": 0.5,
        "outer_momentum": 0.5,
        "outer_nesterov": True,
        "merge_every": 2,
        "eta": 0.8,
        "max_batch_size": 8,
        "switch_threshold": 2.0,
        "batch_size_cap": 64,
        "pseudo_grad_dtype": "bfloat16",
        # AdLoCoConfig's defaults, here so that `--set adloco.compression_block_size=128` reaches every method.
        "pseudo_grad_compression": "none",
        "compression_block_size": 256,
        "outer_overlap": False,
        "outer_overlap_local_weight": 1.0,
        "num_fragments": None,
        "fragment_sync_delay": 0,
        "fragment_update_alpha": 0.0,
        "batch_size_smoothing": 0.5,
        "nonpositive_signal": "keep",
        "batch_size_shrink": False,
        "batch_size_target": "test",
        "noise_scale_multiple": 1.0,
        "merge_batch_rule": "preserve_total",
        "merge_transport": "all_reduce",
        "merge_payload": "float32",
        "goodput_hysteresis": 0.05,
        "lr_batch_scaling": "none",
        "worker_batch_split": "equal",
        "split_hysteresis": 0.05,
        # Off for one instance (it has nothing to merge); the multi-instance methods (ADLOCO) turn it on.
        "eval_merged_model": False,
    },
    "timeout": 1200,
    # Seconds of training per method (evaluations excluded; None: the token budget alone). With it every method
    # stops at the end of the first round after that many seconds, and `budget_tokens` becomes a ceiling.
    "budget_seconds": None,
}


def deep_merge(base: dict, update: dict) -> dict:
    """A copy of `base` with `update`'s values, nested dicts merged key by key."""
    out = copy.deepcopy(base)
    for key, value in update.items():
        out[key] = deep_merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


# One GPU shared by the 4 workers over gloo (NCCL refuses two ranks on one GPU): the default run must fit in 10
# minutes on an H100. DDP's fp32 gradient all-reduce through gloo (~1 GB per step for MicroLlama's architecture with
# this 4096-token vocabulary) dominates its time, which bounds the budget.
CUDA = {
    "block_size": 256,
    "train": {"batch_size": 8, "inner_steps": 10, "eval_every_rounds": 2, "learning_rate": 6e-4, "warmup_steps": 10},
    "adloco": {"max_batch_size": 16, "batch_size_cap": 64},
}
PROFILES = {
    ("cpu", "quick"): {"budget_tokens": 1_024_000, "timeout": 600},
    ("cpu", "full"): {"budget_tokens": 4_096_000, "train": {"eval_every_rounds": 4}},
    ("cuda", "quick"): deep_merge(CUDA, {"budget_tokens": 307_200, "adloco": {"merge_every": 1}, "timeout": 240}),
    ("cuda", "full"): deep_merge(CUDA, {"budget_tokens": 614_400, "timeout": 300}),
}
# With --clock virtual, how far past the budget a method without a fixed batch trains (`method_spec`).
VIRTUAL_BUDGET_FACTOR = 1.5
TRAIN_OVERRIDES = ("batch_size", "learning_rate", "inner_steps", "eval_every_rounds", "warmup_steps")
ADLOCO_OVERRIDES = ("eta", "max_batch_size", "batch_size_cap", "merge_every", "outer_lr")


def shared_settings(args: argparse.Namespace) -> dict:
    """The settings every method shares, from the profile and the command line."""
    profile = ("cuda" if args.device == "cuda" else "cpu", "quick" if args.quick else "full")
    settings = deep_merge(CPU_BASE, PROFILES[profile])
    settings["device"] = args.device
    settings["cache_dir"] = os.path.abspath(args.cache_dir)
    if args.preset is not None:
        settings["preset"] = args.preset
    elif args.device == "cuda":
        settings["preset"] = "microllama"
    settings["fp16"] = bool(args.fp16)
    if args.budget_tokens is not None:
        settings["budget_tokens"] = args.budget_tokens
    if args.budget_seconds is not None:
        settings["budget_seconds"] = args.budget_seconds
    for name in TRAIN_OVERRIDES:
        if getattr(args, name) is not None:
            settings["train"][name] = getattr(args, name)
    for name in ADLOCO_OVERRIDES:
        if getattr(args, name) is not None:
            settings["adloco"][name] = getattr(args, name)
    if args.timeout is not None:
        settings["timeout"] = args.timeout
    if getattr(args, "clock", "real") == "virtual":
        settings["clock"] = virtual_clock_settings(args)
    for assignment in args.set:
        key, _, raw = assignment.partition("=")
        try:
            value = json.loads(raw)
        except json.JSONDecodeError:
            value = raw
        node = settings
        *path, leaf = key.split(".")
        for part in path:
            node = node[part]
        if leaf not in node:
            raise SystemExit(f"--set {assignment}: {key} is not a shared setting ({sorted(node)})")
        node[leaf] = value
    return settings


def method_spec(
    name: str, settings: dict, output_dir: str, *, seed: int | None = None, matched_batch_size: int | None = None
) -> dict:
    """One launch's spec: the shared settings, the method's own, the seed (model weights and data order) and its
    folder `{output_dir}/{name}/seed-{seed}`. `diloco_matched` needs `matched_batch_size` ([`matched_batch_size`])."""
    method = METHODS[name]
    spec = copy.deepcopy(settings)
    seed = settings["seed"] if seed is None else seed
    spec.update(method=name, kind=method["kind"], seed=seed, output_dir=os.path.join(output_dir, name, f"seed-{seed}"))
    spec["adloco"] = {**settings["adloco"], **method.get("adloco", {})}
    spec["slow_workers"] = method.get("slow_workers")
    if "batch_size" in method:  # a fixed batch of its own, at the square-root rule's learning rate for it (or not)
        batch = method["batch_size"]
        if method.get("scale_learning_rate", True):
            spec["train"]["learning_rate"] *= math.sqrt(batch / settings["train"]["batch_size"])
        spec["train"]["batch_size"] = batch
    if "budget_factor" in method:
        spec["budget_tokens"] = int(settings["budget_tokens"] * method["budget_factor"])
    if "matched_to" in method:
        if matched_batch_size is None:
            raise ValueError(f"{name} takes its batch from {method['matched_to']}'s run of the same seed: run both")
        spec["train"]["batch_size"] = matched_batch_size
    clock = spec.get("clock")
    if clock is not None:
        if clock["profile"].get("max_micro_batch") is not None:
            # Switch mode cuts the steps as the profile's device would: its largest micro-batch, for every method.
            spec["adloco"]["max_batch_size"] = clock["profile"]["max_micro_batch"]
        # A method without a fixed batch trains past the budget, so that its time to the fixed batches' final
        # perplexity is measured (the comparison at the budget itself reads its curve there).
        factor = 1.0 if "batch_size" in method else method.get("budget_factor", VIRTUAL_BUDGET_FACTOR)
        if clock.get("budget_seconds") is not None:
            clock["budget_seconds"] = [factor * b for b in clock["budget_seconds"]]
    return spec


def virtual_clock_settings(args: argparse.Namespace) -> dict:
    """The shared `clock` of `--clock virtual`: the device profile (its JSON, source included), the links' rates
    (bits/s, in `--bandwidth`'s order, with their labels), latency and payload efficiency, and the budget in virtual
    seconds per link."""
    bandwidths = list(args.bandwidth or ())
    budgets = args.budget_virtual_seconds
    if budgets is not None and len(budgets) == 1:
        budgets = budgets * len(bandwidths)
    # The provenance of each priced figure stays in the file: a run's spec holds what the clock prices (so that runs
    # made before a profile said what it measured are still reused by `--reuse`).
    profile = {k: v for k, v in load_profile(args.device_profile).items() if k not in ("measured_sizes", "sources")}
    return {
        "profile": profile,
        "profile_file": os.path.relpath(os.path.abspath(args.device_profile), REPO),
        "labels": bandwidths,
        "bandwidths": [parse_rate(b) for b in bandwidths],
        "latency": args.latency,
        "efficiency": args.link_efficiency,
        "budget_seconds": budgets,
    }


def reads_clock(spec: dict) -> bool:
    """Whether a method's decisions read the step timings (the goodput rule, a split by speed): its run then
    depends on the link its clock prices, and a virtual study runs it once per bandwidth. Any other method trains
    alike over every link, and one run prices them all."""
    adloco = spec.get("adloco", {})
    return adloco.get("batch_size_target") == "goodput" or adloco.get("worker_batch_split") == "speed"


def on_links(spec: dict, indices: list[int], output_dir: str) -> dict:
    """`spec` with its virtual clock on the links `indices` of the shared ones only (the first one is the link its
    decisions follow), training in `output_dir`."""
    out = copy.deepcopy(spec)
    clock = out["clock"]
    for key in ("labels", "bandwidths", "budget_seconds"):
        if clock.get(key) is not None:
            clock[key] = [clock[key][i] for i in indices]
    out["output_dir"] = output_dir
    return out


def check_matched(names: list[str]) -> str | None:
    """Why the methods `names` cannot run together (a matched method without its reference), or None."""
    for name in names:
        reference = METHODS[name].get("matched_to")
        if reference is not None and reference not in names:
            return f"--methods {name} takes its batch from {reference}'s run: add {reference} to --methods"
    return None


def matched_for(name: str, results: dict[str, dict], settings: dict) -> int | None:
    """The batch of method `name` given the results of the same seed so far (`{method: result}`): None for a
    method that is not matched; raises ValueError when its reference has not run or failed."""
    reference = METHODS[name].get("matched_to")
    if reference is None:
        return None
    result = results.get(reference)
    if result is None or "error" in result:
        raise ValueError(
            f"{name} takes its batch from {reference}'s run, which {'failed' if result else 'did not run'}"
        )
    return matched_batch_size(result, settings)


def matched_batch_size(reference: dict, spec: dict) -> int:
    """The fixed per-worker batch whose rounds carry `reference`'s mean tokens per round (same H, workers, blocks)."""
    tokens_per_round = reference["tokens"] / reference["rounds"]
    per_worker_step = spec["world_size"] * spec["train"]["inner_steps"] * spec["block_size"]
    return max(1, round(tokens_per_round / per_worker_step))


def run_order(names: list[str]) -> list[str]:
    """The methods in the order asked, each matched method after the one it is matched to."""
    plain = [n for n in names if "matched_to" not in METHODS[n]]
    return plain + [n for n in names if "matched_to" in METHODS[n]]


def check_epochs(settings: dict, train_tokens: int, allow_repeats: bool) -> None:
    """Refuse a budget above one epoch of the train split unless repeats are asked for."""
    epochs = settings["budget_tokens"] / train_tokens
    if epochs > 1 and not allow_repeats:
        raise SystemExit(
            f"--budget_tokens {settings['budget_tokens']:,} is {epochs:.2f} epochs of {settings['data']['corpus']}'s "
            f"train split ({train_tokens:,} tokens): samples would be seen more than once. Lower the budget, use a "
            "larger corpus (--set data.corpus=...), or pass --allow_repeats."
        )
