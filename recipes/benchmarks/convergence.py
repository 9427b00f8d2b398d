"""Convergence per token and per byte: DDP, DiLoCo, AdLoCo and AdLoCo's ablations under one token budget.

Every method trains the same model from the same initial weights on the same workers, data shards and data order
(as long as the batch sizes agree), with the same inner AdamW and learning rate, and stops once its cumulative
training tokens reach the budget. Each method is one `accelerate launch` of the module
`recipes.benchmarks._convergence_worker`.

| method | what it is |
|---|---|
| `ddp` | plain `transformers.Trainer`, real DDP (gloo) over the same workers, global batch = DiLoCo's initial one |
| `diloco` | `AdLoCoTrainer`, 1 instance, fixed batch (`batch_size_test="none"`), Nesterov outer step (lr 0.5, momentum 0.5: the best of a sweep for this run length, see the benchmarks README) |
| `adloco` | 4 instances that merge every `merge_every` rounds, norm-test adaptive batches, switch mode (γ = 2) |
| `adloco_no_adaptive` | `adloco` with a fixed batch (`batch_size_test="none"`) |
| `adloco_no_merge` | `adloco` without merges (`merge_every=0`): 4 instances to the end, merged once at the end |
| `adloco_no_switch` | `adloco` without switch mode's accumulation (`switch_threshold=1e9`): a request above `max_batch_size` is capped there, so the batch never grows past what one forward/backward holds |
| `adloco_paper_outer` | `adloco` with the outer SGD of the paper's table (lr 0.5, no momentum) |
| `adloco_sqrt_lr` | `adloco` with `lr_batch_scaling="sqrt"`: the inner learning rate follows the batch (not in the paper) |
| `diloco_int8`, `diloco_int4` | `diloco` with `pseudo_grad_compression="int8"` / `"int4"` (blocks of `compression_block_size` values with one scale, error feedback) |
| `diloco_overlap` | `diloco` with `outer_overlap=True`: the round's all-reduce runs during the next round's inner steps |
| `diloco_overlap_int4` | `diloco` with both `outer_overlap=True` and `pseudo_grad_compression="int4"` |
| `adloco_int8`, `adloco_int4`, `adloco_overlap` | `adloco` with the same single change |
| `adloco_adam_noise` | `adloco` with `noise_preconditioner="adam"`: the norm test reads the statistics in Adam's metric |
| `diloco_slow1`, `adloco_slow1` | `diloco` / `adloco` with one of the workers (the last rank) in a cgroup with a CPU quota of a quarter of a core (`_slow_workers.py`): equal batches wait for it every round |
| `diloco_balanced`, `adloco_balanced` | the same slow worker with `worker_batch_split="speed"`: each worker's share of the instance's batch follows its measured speed |
| `diloco_streaming`, `diloco_streaming_int4`, `adloco_streaming`, `adloco_streaming_int4` | `diloco` / `adloco` as Streaming DiLoCo (`STREAMING`: 5 fragments, each all-reduce overlapped with H // 5 inner steps, α = 0.5), with bf16 or int4 pseudo-gradients |
| `diloco_b4`, `diloco_b8`, `diloco_b16` | `diloco` at that fixed per-worker batch, learning rate × √(b / 4) (issue 25) |
| `adloco_goodput`, `diloco_goodput` | `adloco` / `diloco` with the goodput rule (`batch_size_target="goodput"`), `lr_batch_scaling="sqrt"`, compact merges, `max_batch_size` 16; 1.5 × the token budget |
| `adloco_norm` | `adloco_goodput` with the norm test's request (`batch_size_target="test"`) instead of the rule: what the rule itself adds |

Without `--methods` the first nine run; the compression, overlap and slow-worker variants run only when named. A
slow worker needs root and a cgroup `cpu` controller (v1 `cpu.cfs_quota_us` or v2 `cpu.max`); without them its
methods are skipped with the reason. Each balanced method is compared with its equal-batch twin on the same slow
worker (`wall_per_round_vs_<twin>`, paired by seed) and with the method without a slow worker (`ppl_vs_<base>`). Each variant is
also compared with the method it changes (`variant_of`: `ppl_vs_adloco`, `bytes_vs_adloco`, ... and one report line).

Measured per method: the eval perplexity curve against training tokens (every `eval_every_rounds` rounds; while
several instances train, the model the final merge would produce then: the AdLoCo methods run with
`eval_merged_model=True`, and `curve_kind` says what a curve follows; the demand-weighted mean of the instances'
losses, the library's own `eval_loss`, which no single model achieves, is kept as `curve_instances_mean`, and the
best instance's curve as `curve_best_instance`) and the final model's perplexity (AdLoCo: the merged model after
the final merge),
the communication rounds, the bytes communicated (modelled: 2 (M − 1) × payload per all-reduce, DDP's fp32 gradients
every step, AdLoCo's pseudo-gradients and merge transfers from its logs; and measured: `bytes_sent` of every worker's
TCP sockets from `ss -tinpH` before and after training, evaluations excluded) and the training wall time
(evaluations excluded).

    # From the repository root. The table of docs/results.md (4 CPU workers, tiny Llama, built-in corpus):
    python -m recipes.benchmarks.convergence
    # A quicker set (< 12 minutes on 2 CPU cores):
    python -m recipes.benchmarks.convergence --quick
    # A subset, and a tuning override:
    python -m recipes.benchmarks.convergence --quick --methods ddp diloco adloco --learning_rate 2e-3
    # The pseudo-gradient's compression and the overlapped all-reduce against bf16 DiLoCo:
    python -m recipes.benchmarks.convergence --quick --methods diloco diloco_int8 diloco_int4 diloco_overlap \\
        diloco_overlap_int4 --output_dir outputs/benchmarks/convergence-compression
    # One of 4 workers at a quarter of a core (sudo: a cgroup with a CPU quota), equal batches against a split by speed:
    sudo .venv/bin/python -m recipes.benchmarks.convergence --quick --methods diloco diloco_slow1 diloco_balanced \
        --output_dir outputs/benchmarks/slow-workers
    # The same seconds for every method (evaluations excluded; each stops at the end of the first round after them),
    # the token budget a ceiling:
    python -m recipes.benchmarks.convergence --methods diloco_b4 adloco_norm adloco_goodput --budget_seconds 120 \
        --budget_tokens 2048000 --inner_steps 5
    # GPU: MicroLlama's architecture, 4 workers sharing one GPU over gloo (NCCL-free), fp16:
    python -m recipes.benchmarks.convergence --device cuda --preset microllama --fp16

Outputs in `--output_dir` (default `outputs/benchmarks/convergence`): `results.json`
(`{"methods": {name: {"final_eval_ppl", "tokens", "comm_rounds", "comm_bytes", "wall_seconds", "curve", ...}}}`),
`table.md`, `convergence.png`, and one folder per method with its spec, launch log and AdLoCo run files.
"""

import argparse
import contextlib
import copy
import json
import math
import os
import statistics
import time

from adloco_hf.testing import launch_command, run_workers
from recipes.benchmarks import _slow_workers as slow_workers
from recipes.benchmarks._common import (
    REPO,
    choose_targets,
    first_reach,
    human_bytes,
    interpolate_curve,
    ratio,
    table,
    write_json,
)


# Launched as a module from the repository root (`accelerate launch --module`): no path edits in the workers.
WORKER_MODULE = "recipes.benchmarks._convergence_worker"

# What changes between methods; everything else is the shared setting below.
# `eval_merged_model`: while several instances train, the curve is the merged model's, not the instances' mean.
ADLOCO = {"num_instances": 4, "batch_size_test": "norm", "eval_merged_model": True}
DILOCO = {"num_instances": 1, "batch_size_test": "none"}
# The paper's controller and merge rule (today's defaults as well), for `adloco_paper` and the ablations against it.
PAPER_RULES = {
    "batch_size_smoothing": 0.0,
    "nonpositive_signal": "clamp",
    "batch_size_shrink": False,
    "batch_size_target": "test",
    "merge_batch_rule": "paper",
    "merge_transport": "point_to_point",
}
# The slow worker of the `*_slow1` / `*_balanced` methods: the last of the 4 workers, at a quarter of one core.
SLOW_ONE = {"workers": [3], "cores": 0.25}
# Streaming DiLoCo's settings for the `*_streaming` methods: P = 5 fragments (one sent every H / 5 = 5 inner steps of
# the round of 25), each average applied τ = H // P inner steps after its send ("max": the longest overlap that keeps
# one average in flight, resolved per run from the round's H by the worker), mixed with the local weights by α = 0.5.
STREAMING = {"num_fragments": 5, "fragment_sync_delay": "max", "fragment_update_alpha": 0.5}
# Issue 25's methods (below): a micro-batch of 16; the goodput rule with the square-root learning rate and compact
# merges (bf16 weights, int8 momentum blocks).
FIXED_BATCH = {"max_batch_size": 16}
GOODPUT = {
    "max_batch_size": 16,
    "batch_size_target": "goodput",
    "lr_batch_scaling": "sqrt",
    "merge_payload": "compact",
}
METHODS: dict[str, dict] = {
    "ddp": {"kind": "ddp"},
    "diloco": {"kind": "adloco", "adloco": dict(DILOCO)},
    "adloco": {"kind": "adloco", "adloco": dict(ADLOCO)},
    # DiLoCo whose fixed per-worker batch gives AdLoCo's mean tokens per round (same H, same seed): it takes as many
    # rounds as AdLoCo for the same tokens, so what remains between the two is the adaptive batch and the instances.
    "diloco_matched": {
        "kind": "adloco",
        "adloco": {"num_instances": 1, "batch_size_test": "none"},
        "matched_to": "adloco",
    },
    "adloco_no_adaptive": {"kind": "adloco", "adloco": {**ADLOCO, "batch_size_test": "none"}},
    "adloco_no_merge": {"kind": "adloco", "adloco": {**ADLOCO, "merge_every": 0}},
    # "Never accumulate": γ so large that no request reaches γ × max_batch_size; requests above max_batch_size
    # are capped at it (switch mode's middle band). The other reading, γ = 1 (always accumulate), is switch
    # mode itself with a narrower band.
    "adloco_no_switch": {"kind": "adloco", "adloco": {**ADLOCO, "switch_threshold": 1e9}},
    "adloco_paper_outer": {
        "kind": "adloco",
        "adloco": {**ADLOCO, "outer_lr": 0.5, "outer_momentum": 0.0, "outer_nesterov": False},
    },
    # Not in the paper: the inner learning rate follows the batch (× √(b / b₀), the square-root rule for AdamW).
    "adloco_sqrt_lr": {"kind": "adloco", "adloco": {**ADLOCO, "lr_batch_scaling": "sqrt"}},
    # The request's controller and the merge's batch rule (issue 14; run only when named in --methods).
    # `adloco_paper` fixes today's (the paper's) rules whatever the defaults; each other one changes them as named.
    "adloco_paper": {"kind": "adloco", "adloco": {**ADLOCO, **PAPER_RULES}},
    "adloco_keep": {
        "kind": "adloco",
        "adloco": {**ADLOCO, **PAPER_RULES, "nonpositive_signal": "keep"},
        "variant_of": "adloco_paper",
    },
    "adloco_smooth": {
        "kind": "adloco",
        "adloco": {**ADLOCO, **PAPER_RULES, "batch_size_smoothing": 0.5, "nonpositive_signal": "keep"},
        "variant_of": "adloco_paper",
    },
    "adloco_preserve": {
        "kind": "adloco",
        "adloco": {**ADLOCO, **PAPER_RULES, "merge_batch_rule": "preserve_total"},
        "variant_of": "adloco_paper",
    },
    "adloco_noise_scale": {
        "kind": "adloco",
        "adloco": {
            **ADLOCO,
            **PAPER_RULES,
            "batch_size_smoothing": 0.5,
            "nonpositive_signal": "keep",
            "batch_size_target": "noise_scale",
        },
        "variant_of": "adloco_paper",
    },
    "adloco_controller": {
        "kind": "adloco",
        "adloco": {
            **ADLOCO,
            **PAPER_RULES,
            "batch_size_smoothing": 0.5,
            "nonpositive_signal": "keep",
            "merge_batch_rule": "preserve_total",
        },
        "variant_of": "adloco_paper",
    },
    # The statistics in Adam's metric (tr P Σ / gᵀ P g, P = 1 / (√v̂ + ε)) with the default controller.
    "adloco_adam_noise": {
        "kind": "adloco",
        "adloco": {**ADLOCO, "noise_preconditioner": "adam"},
        "variant_of": "adloco",
    },
    # H doubles (up to 4 × inner_steps) at a round's end while the workers' pseudo-gradients agree
    # (`inner_steps_rule="outer_noise"`, outer noise ≤ outer_noise_theta²): fewer rounds for the same tokens. AdLoCo's
    # instances measured an outer noise of 0.43-0.62 in the quick runs, so its variant uses θ = 0.8 (θ² = 0.64; at
    # the default 0.5 it never grew and equalled adloco); DiLoCo's (0.11 early, 0.7 late) grows at the default.
    "adloco_grow_h": {
        "kind": "adloco",
        "adloco": {**ADLOCO, "inner_steps_rule": "outer_noise", "max_inner_steps_factor": 4, "outer_noise_theta": 0.8},
        "variant_of": "adloco",
    },
    "diloco_grow_h": {
        "kind": "adloco",
        "adloco": {**DILOCO, "inner_steps_rule": "outer_noise", "max_inner_steps_factor": 4},
        "variant_of": "diloco",
    },
    # Malladi et al.'s whole square-root rule for Adam (lr, 1 − β₁, 1 − β₂, ε; lr · weight decay kept).
    "adloco_sqrt_adam": {
        "kind": "adloco",
        "adloco": {**ADLOCO, **PAPER_RULES, "lr_batch_scaling": "sqrt_adam"},
        "variant_of": "adloco_paper",
    },
    # How the pseudo-gradient travels (run only when named in --methods): int8 / int4 blocks with error feedback
    # (`pseudo_grad_compression`, one float32 scale per `compression_block_size` values) and the round's all-reduce
    # overlapped with the next round's inner steps (`outer_overlap`, eager updates). `variant_of`: the method each
    # one changes in exactly the settings it names, which the reports compare it with.
    "diloco_int8": {"kind": "adloco", "adloco": {**DILOCO, "pseudo_grad_compression": "int8"}, "variant_of": "diloco"},
    "diloco_int4": {"kind": "adloco", "adloco": {**DILOCO, "pseudo_grad_compression": "int4"}, "variant_of": "diloco"},
    "diloco_overlap": {"kind": "adloco", "adloco": {**DILOCO, "outer_overlap": True}, "variant_of": "diloco"},
    "diloco_overlap_int4": {
        "kind": "adloco",
        "adloco": {**DILOCO, "outer_overlap": True, "pseudo_grad_compression": "int4"},
        "variant_of": "diloco",
    },
    # λ = 1 / M (`outer_overlap_local_weight=None`): Kale et al.'s eager update, against the default λ = 1.
    "diloco_overlap_eager": {
        "kind": "adloco",
        "adloco": {**DILOCO, "outer_overlap": True, "outer_overlap_local_weight": None},
        "variant_of": "diloco",
    },
    "adloco_int8": {"kind": "adloco", "adloco": {**ADLOCO, "pseudo_grad_compression": "int8"}, "variant_of": "adloco"},
    "adloco_int4": {"kind": "adloco", "adloco": {**ADLOCO, "pseudo_grad_compression": "int4"}, "variant_of": "adloco"},
    "adloco_overlap": {"kind": "adloco", "adloco": {**ADLOCO, "outer_overlap": True}, "variant_of": "adloco"},
    # One of the workers (the last rank) at a quarter of a core, in a cgroup with a CPU quota (run only when named):
    # equal batches (`*_slow1`) wait for it every round; `*_balanced` split each instance's batch by speed
    # (`worker_batch_split="speed"`). `equal_batches`: the twin whose wall time per round a balanced method is
    # compared with, at the same tokens per round; `variant_of`: the method without a slow worker, whose perplexity
    # at equal tokens it is compared with.
    "diloco_slow1": {"kind": "adloco", "adloco": dict(DILOCO), "slow_workers": SLOW_ONE, "variant_of": "diloco"},
    "diloco_balanced": {
        "kind": "adloco",
        "adloco": {**DILOCO, "worker_batch_split": "speed"},
        "slow_workers": SLOW_ONE,
        "variant_of": "diloco",
        "equal_batches": "diloco_slow1",
    },
    "adloco_slow1": {"kind": "adloco", "adloco": dict(ADLOCO), "slow_workers": SLOW_ONE, "variant_of": "adloco"},
    "adloco_balanced": {
        "kind": "adloco",
        "adloco": {**ADLOCO, "worker_batch_split": "speed"},
        "slow_workers": SLOW_ONE,
        "variant_of": "adloco",
        "equal_batches": "adloco_slow1",
    },
    # Streaming DiLoCo (`num_fragments`, issue 29; run only when named): the model in `STREAMING`'s fragments, each
    # synced on its own step of the round with its all-reduce overlapped by the inner steps, with bf16 or int4.
    "diloco_streaming": {"kind": "adloco", "adloco": {**DILOCO, **STREAMING}, "variant_of": "diloco"},
    "diloco_streaming_int4": {
        "kind": "adloco",
        "adloco": {**DILOCO, **STREAMING, "pseudo_grad_compression": "int4"},
        "variant_of": "diloco",
    },
    "adloco_streaming": {"kind": "adloco", "adloco": {**ADLOCO, **STREAMING}, "variant_of": "adloco"},
    "adloco_streaming_int4": {
        "kind": "adloco",
        "adloco": {**ADLOCO, **STREAMING, "pseudo_grad_compression": "int4"},
        "variant_of": "adloco",
    },
    # Issue 25 (run only when named): DiLoCo at a fixed per-worker batch `batch_size` of 4, 8 or 16, and AdLoCo (and
    # DiLoCo) with the goodput rule. A micro-batch of 16 fits (max_batch_size 16: the CPU has no memory limit, and
    # b16 then runs whole); a fixed batch b takes the learning rate × √(b / 4) that lr_batch_scaling="sqrt" gives
    # the goodput methods at b. The goodput methods train `budget_factor` × the budget, so that the time they take
    # to reach the fixed batches' final perplexity is measured (ppl@equal still compares at the common tokens).
    "diloco_b4": {"kind": "adloco", "adloco": {**DILOCO, **FIXED_BATCH}, "batch_size": 4},
    "diloco_b8": {"kind": "adloco", "adloco": {**DILOCO, **FIXED_BATCH}, "batch_size": 8},
    "diloco_b16": {"kind": "adloco", "adloco": {**DILOCO, **FIXED_BATCH}, "batch_size": 16},
    "adloco_goodput": {"kind": "adloco", "adloco": {**ADLOCO, **GOODPUT}, "budget_factor": 1.5},
    # adloco_goodput with the norm test's request instead of the goodput rule (everything else the same: instances,
    # merges, micro-batch 16, square-root learning rate, compact merges): what the rule itself adds.
    "adloco_norm": {
        "kind": "adloco",
        "adloco": {**ADLOCO, **GOODPUT, "batch_size_target": "test"},
        "budget_factor": 1.5,
    },
    "diloco_goodput": {
        "kind": "adloco",
        "adloco": {**DILOCO, **GOODPUT, "batch_size_test": "norm"},
        "budget_factor": 1.5,
    },
}
# What runs without --methods: the comparison and its ablations (the 9 methods of docs/results.md's tables).
DEFAULT_METHODS = (
    "ddp",
    "diloco",
    "adloco",
    "diloco_matched",
    "adloco_no_adaptive",
    "adloco_no_merge",
    "adloco_no_switch",
    "adloco_paper_outer",
    "adloco_sqrt_lr",
)

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
PROFILES = {
    ("cpu", "quick"): {"budget_tokens": 1_024_000, "timeout": 600},
    ("cpu", "full"): {"budget_tokens": 4_096_000, "train": {"eval_every_rounds": 4}},
    # One GPU shared by the 4 workers over gloo (NCCL refuses two ranks on one GPU): the default run must fit in 10
    # minutes on an H100. DDP's fp32 gradient all-reduce through gloo (~1 GB per step for MicroLlama's architecture
    # with this 4096-token vocabulary) dominates its time, which bounds the budget.
    ("cuda", "quick"): {
        "budget_tokens": 307_200,
        "block_size": 256,
        "train": {
            "batch_size": 8,
            "inner_steps": 10,
            "eval_every_rounds": 2,
            "learning_rate": 6e-4,
            "warmup_steps": 10,
        },
        "adloco": {"merge_every": 1, "max_batch_size": 16, "batch_size_cap": 64},
        "timeout": 240,
    },
    ("cuda", "full"): {
        "budget_tokens": 614_400,
        "block_size": 256,
        "train": {
            "batch_size": 8,
            "inner_steps": 10,
            "eval_every_rounds": 2,
            "learning_rate": 6e-4,
            "warmup_steps": 10,
        },
        "adloco": {"max_batch_size": 16, "batch_size_cap": 64},
        "timeout": 300,
    },
}
TRAIN_OVERRIDES = ("batch_size", "learning_rate", "inner_steps", "eval_every_rounds", "warmup_steps")
ADLOCO_OVERRIDES = ("eta", "max_batch_size", "batch_size_cap", "merge_every", "outer_lr")


def _merge(base: dict, update: dict) -> dict:
    out = copy.deepcopy(base)
    for key, value in update.items():
        out[key] = _merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def shared_settings(args: argparse.Namespace) -> dict:
    """The settings every method shares, from the profile and the command line."""
    profile = ("cuda" if args.device == "cuda" else "cpu", "quick" if args.quick else "full")
    settings = _merge(CPU_BASE, PROFILES[profile])
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
    if "batch_size" in method:  # a fixed batch of its own, at the square-root rule's learning rate for it
        batch = method["batch_size"]
        spec["train"]["learning_rate"] *= math.sqrt(batch / settings["train"]["batch_size"])
        spec["train"]["batch_size"] = batch
    if "budget_factor" in method:
        spec["budget_tokens"] = int(settings["budget_tokens"] * method["budget_factor"])
    if "matched_to" in method:
        if matched_batch_size is None:
            raise ValueError(f"{name} takes its batch from {method['matched_to']}'s run of the same seed: run both")
        spec["train"]["batch_size"] = matched_batch_size
    return spec


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


# ---- before the launches: data built once, initial perplexity ----
def prepare(settings: dict, seed: int) -> tuple[float, int]:
    """Build the tokenizer and packed data into the cache (the workers then only load them); return the initial
    model's eval perplexity for `seed`'s weights (the curves' first point: every method starts from them) and the
    tokens of the train split."""
    import torch
    from transformers import default_data_collator

    from recipes.benchmarks._convergence_worker import load_data, make_model

    tokenizer, lm = load_data(settings)
    train_tokens = len(lm["train"]) * settings["block_size"]
    model = make_model({**settings, "seed": seed}, tokenizer).to(settings["device"]).eval()
    total, count = 0.0, 0
    eval_set = lm["eval"]
    batch = settings["train"]["eval_batch_size"]
    with torch.no_grad():
        for start in range(0, len(eval_set), batch):
            inputs = default_data_collator([eval_set[i] for i in range(start, min(start + batch, len(eval_set)))])
            ids = inputs["input_ids"].to(settings["device"])
            logits = model(input_ids=ids).logits[:, :-1].float()
            labels = ids[:, 1:]
            total += torch.nn.functional.cross_entropy(
                logits.reshape(-1, logits.shape[-1]), labels.reshape(-1), reduction="sum"
            ).item()
            count += labels.numel()
    del model
    if settings["device"] == "cuda":
        torch.cuda.empty_cache()  # the workers need the memory; this process keeps only its CUDA context
    return math.exp(total / count), train_tokens


# ---- one method ----
def launch(spec: dict, log_path: str) -> tuple[int, float]:
    """Run the workers of one method; returns (exit code, seconds). Kills the whole launch on timeout (exit 124).
    A method with `slow_workers` runs inside a cgroup with a CPU quota, made for this launch and removed after it
    (`_slow_workers.py`); its ranks join it themselves."""
    command = launch_command(
        WORKER_MODULE, os.path.join(spec["output_dir"], "spec.json"), num_processes=spec["world_size"], module=True
    )
    env = {"TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    with slow_group(spec) as slow_env:
        result = run_workers(
            command,
            timeout=spec["timeout"],
            env={**env, **slow_env},
            cwd=REPO,
            pythonpath=[REPO],
            threads=spec["threads_per_worker"],
            log_path=log_path,
            check=False,
        )
    return result.returncode, result.seconds


@contextlib.contextmanager
def slow_group(spec: dict):
    """For a method with `slow_workers`: a cgroup with its CPU quota for the launch (removed however the block is
    left), and the environment that tells the slow workers' processes to join it; nothing otherwise."""
    slow = spec.get("slow_workers")
    if not slow:
        yield {}
        return
    g = spec.get("processes_per_worker", 1)
    ranks = [w * g + local for w in slow["workers"] for local in range(g)]
    with slow_workers.cpu_quota_group(slow["cores"]) as procs:
        yield {slow_workers.ENV_PROCS: procs, slow_workers.ENV_RANKS: ",".join(map(str, ranks))}


def runnable(names: list[str]) -> tuple[list[str], str | None]:
    """The methods that can run here, and why the others cannot: a slow worker needs a cgroup with a CPU quota."""
    if not any(METHODS[n].get("slow_workers") for n in names):
        return names, None
    try:
        slow_workers.cpu_controller()
    except slow_workers.CgroupUnavailable as error:
        return [n for n in names if not METHODS[n].get("slow_workers")], str(error)
    return names, None


def run_method(name: str, spec: dict, reuse: bool) -> dict:
    folder = spec["output_dir"]
    name = f"{name} seed {spec['seed']}"
    result_path = os.path.join(folder, "result.json")
    spec_path = os.path.join(folder, "spec.json")
    if reuse and os.path.exists(result_path) and os.path.exists(spec_path):
        with open(spec_path, encoding="utf-8") as f:
            if json.load(f) == spec:
                with open(result_path, encoding="utf-8") as f:
                    print(f"[{name}] reusing {result_path}", flush=True)
                    return json.load(f)
    os.makedirs(folder, exist_ok=True)
    if os.path.exists(result_path):
        os.remove(result_path)
    write_json(spec_path, spec)
    log_path = os.path.join(folder, "launch.log")
    print(f"[{name}] launching {spec['world_size']} workers (log: {log_path})", flush=True)
    code, seconds = launch(spec, log_path)
    if not os.path.exists(result_path):
        with open(log_path, encoding="utf-8", errors="replace") as f:
            tail = f.read()[-3000:]
        print(f"[{name}] FAILED (exit {code}) after {seconds:.0f}s; end of {log_path}:\n{tail}", flush=True)
        return {"error": f"exit {code}", "launch_seconds": seconds}
    # result.json is written once every worker has finished training and reported; a failure after that (at
    # teardown) does not touch the measurements, but is kept in the record.
    with open(result_path, encoding="utf-8") as f:
        result = json.load(f)
    result["launch_seconds"] = seconds
    result["exit_code"] = code
    if result.get("stopped_by_time_at") is not None:
        print(f"[{name}] stopped by the seconds budget at step {result['stopped_by_time_at']}", flush=True)
    elif not result.get("budget_reached", True):
        print(f"[{name}] WARNING: stopped at {result['tokens']:,} tokens, below the budget", flush=True)
    if code != 0:
        print(f"[{name}] workers exited with {code} after writing their result (see {log_path})", flush=True)
    print(
        f"[{name}] done in {seconds:.0f}s: ppl {result['final_eval_ppl']:.2f}, {result['tokens']:,} tokens, "
        f"{human_bytes(result['comm_bytes'])} modelled, {human_bytes(result['measured_bytes_sent'])} measured",
        flush=True,
    )
    return result


# ---- several seeds of one method ----
# A run's curves `[[x, ppl], ...]`: `curve` (tokens; the merged model's perplexity where a point has one, see
# `curve_kind`), `curve_bytes`, the instances' demand-weighted mean and the best instance (tokens).
CURVES = ("curve", "curve_bytes", "curve_instances_mean", "curve_best_instance")
TOTALS = ("tokens", "epochs", "steps", "comm_rounds", "comm_bytes", "measured_bytes_sent", "wall_seconds")


def mean_sd(values: list[float], geometric: bool = False) -> tuple[float | None, float | None]:
    """Mean and sample standard deviation (None with fewer than 2 values) of the finite values. `geometric`: the
    mean of perplexities and of their ratios is geometric (the mean of log-perplexities, as the curves average), so a
    method's mean final perplexity is its mean curve's last point; the spread stays in the values' own units."""
    values = [float(v) for v in values if v is not None and math.isfinite(v) and (v > 0 or not geometric)]
    if not values:
        return None, None
    mean = math.exp(statistics.fmean(math.log(v) for v in values)) if geometric else statistics.fmean(values)
    return mean, (statistics.stdev(values) if len(values) > 1 else None)


def mean_curve(curves: list[list[list[float]]]) -> list[list[float]]:
    """The seeds' curves `[[x, ppl], ...]` averaged in log-perplexity at every x of any of them, over the x range
    that all of them cover (a seed that stops earlier ends the mean curve there)."""
    if len(curves) == 1:
        return [list(p) for p in curves[0]]
    end = min(max(x for x, _ in c) for c in curves)
    grid = sorted({float(x) for c in curves for x, _ in c if x <= end})
    out = []
    for x in grid:
        values = [interpolate_curve(c, x) for c in curves]
        if all(v is not None for v in values):
            out.append([x, math.exp(statistics.fmean(math.log(v) for v in values))])
    return out


def mean_curve_by_index(curves: list[list[list[float]]]) -> list[list[float]]:
    """The seeds' curves averaged point by point: the i-th evaluation of every seed (the same round count), its x
    averaged and its perplexity averaged in log, over the points all seeds have. For curves whose x repeats (bytes:
    rounds that send nothing), where averaging at equal x is undefined."""
    count = min(len(c) for c in curves)
    return [
        [statistics.fmean(c[i][0] for c in curves), math.exp(statistics.fmean(math.log(c[i][1]) for c in curves))]
        for i in range(count)
    ]


def run_curve_kind(result: dict) -> str:
    """A run's `curve_kind`; for a result written before it existed, what its curve was then: the instances' mean
    where an evaluation saw several instances, else one model."""
    if "curve_kind" in result:
        return result["curve_kind"]
    several = any(len(point.get("instance_losses") or {}) > 1 for point in result.get("evals", []))
    return "instances_mean" if several else "model"


def aggregate(per_seed: dict[int, dict]) -> dict:
    """One method over its seeds: the means (`final_eval_ppl`, `tokens`, `epochs`, `inner_steps`, `comm_rounds`,
    `comm_bytes`, `wall_seconds`, ...), the per-seed values (`*_seeds`), the mean curves and every seed's result
    under `seed_results`. A method whose every seed failed keeps the first error."""
    done = {seed: r for seed, r in per_seed.items() if "error" not in r}
    if not done:
        return {"error": next(iter(per_seed.values()))["error"], "seed_results": per_seed}
    out: dict = {"seeds": sorted(done), "failed_seeds": sorted(set(per_seed) - set(done))}
    finals = [r["final_eval_ppl"] for r in done.values()]
    out["final_eval_ppl"], out["final_eval_ppl_sd"] = mean_sd(finals, geometric=True)
    out["final_eval_ppl_seeds"] = finals
    for key in TOTALS:
        values = [r.get(key) for r in done.values()]
        out[key] = mean_sd(values)[0]
        out[f"{key}_seeds"] = values
    out["inner_steps"] = out["steps"]
    out["max_worker_epochs"] = max((r.get("max_worker_epochs") or 0.0) for r in done.values())
    for key in CURVES:
        if all(key in r for r in done.values()):
            average = mean_curve_by_index if key == "curve_bytes" else mean_curve
            out[key] = average([r[key] for r in done.values()])
    kinds = sorted({run_curve_kind(r) for r in done.values()})
    out["curve_kind"] = kinds[0] if len(kinds) == 1 else "mixed: " + ", ".join(kinds)
    first = next(iter(done.values()))
    out["batch_sizes"] = first.get("batch_sizes")
    out["rounds"] = mean_sd([r.get("rounds") for r in done.values()])[0]
    per_round = [wall_per_round(r) for r in done.values()]
    out["wall_per_round"], out["wall_per_round_sd"] = mean_sd(per_round)
    out["wall_per_round_seeds"] = per_round
    out["seed_results"] = per_seed
    return out


def wall_per_round(result: dict) -> float | None:
    """A run's training seconds (evaluations excluded) per round; None for DDP (no rounds)."""
    rounds = result.get("rounds")
    return result["wall_seconds"] / rounds if rounds else None


# ---- to-target ----
TARGET_FIELDS = {"tokens": "tokens", "inner_steps": "inner_steps", "rounds": "rounds", "bytes": "comm_bytes",
                 "seconds": "seconds"}  # fmt: skip


def reach(points: list[dict], target: float) -> dict | None:
    """Tokens, inner steps, rounds, bytes and training seconds at which a run's eval curve first reaches perplexity
    `target` ([`first_reach`]); `points` are the run's evaluations in order, from the initial model's."""
    return first_reach(points, target, TARGET_FIELDS)


def eval_points(result: dict, initial_ppl: float | None) -> list[dict]:
    """A run's evaluations in order, from the initial model's (0 tokens, seconds, steps, rounds, bytes)."""
    start = [] if initial_ppl is None else [{"eval_ppl": initial_ppl, **{k: 0 for k in TARGET_FIELDS.values()}}]
    return start + list(result.get("evals", []))


def to_target(methods: dict[str, dict], initial_ppl: dict[int, float]) -> list[float]:
    """Choose the targets over every seed of every method and add `to_target` to each method in place:
    `{"<ppl>": {"tokens", "inner_steps", "rounds", "bytes", "seconds"}}` (means over seeds, and `<field>_seeds`)."""
    runs = {
        (name, seed): eval_points(r, initial_ppl.get(seed))
        for name, m in methods.items()
        if "error" not in m
        for seed, r in m["seed_results"].items()
        if "error" not in r
    }
    if not runs:
        return []
    targets = choose_targets([min(p["eval_ppl"] for p in points) for points in runs.values()])
    for name, m in methods.items():
        if "error" in m:
            continue
        m["to_target"] = {}
        for target in targets:
            reached = [reach(runs[(name, seed)], target) for seed in m["seeds"]]
            entry = {}
            for field in TARGET_FIELDS:
                values = [r[field] if r else None for r in reached]
                # A seed that never reached the target (or lacks the field) leaves the mean undefined.
                entry[field] = None if any(v is None for v in values) else mean_sd(values)[0]
                entry[f"{field}_seeds"] = values
            m["to_target"][f"{target:g}"] = entry
    return targets


# ---- the comparison ----
def seed_curves(m: dict) -> dict:
    """`{seed: curve}` of a method (a method without per-seed results counts as one seed)."""
    runs = m.get("seed_results")
    if not runs:
        return {None: m["curve"]}
    return {seed: r["curve"] for seed, r in runs.items() if "error" not in r}


def verdict(ratios: list[float]) -> str:
    """`better` / `worse` when the mean of the paired ratios differs from 1 by more than their spread (sample
    standard deviation over seeds), else `tie`; with one seed there is no spread to judge by."""
    mean, sd = mean_sd(ratios, geometric=True)
    if mean is None:
        return "-"
    if sd is None:
        return "1 seed"
    if abs(mean - 1.0) <= sd:
        return "tie"
    return "better" if mean < 1.0 else "worse"


def compare(methods: dict[str, dict]) -> dict:
    """Perplexity at equal tokens (the smallest final token count of any seed of any method) and the ratios
    against ddp and diloco (and a variant's `variant_of`, e.g. adloco for adloco_int8), paired by seed (same initial
    weights and data order); adds keys to each method (`ppl_vs_<ref>`, `bytes_vs_<ref>`, `wall_vs_<ref>` ...)."""
    done = {name: m for name, m in methods.items() if "error" not in m}
    if not done:
        return {}
    curves = {name: seed_curves(m) for name, m in done.items()}
    equal_tokens = min(max(x for x, _ in c) for by_seed in curves.values() for c in by_seed.values())
    at_equal = {
        name: {s: interpolate_curve(c, equal_tokens) for s, c in by_seed.items()} for name, by_seed in curves.items()
    }
    for name, m in done.items():
        m["ppl_at_equal_tokens_seeds"] = list(at_equal[name].values())
        m["ppl_at_equal_tokens"], m["ppl_at_equal_tokens_sd"] = mean_sd(m["ppl_at_equal_tokens_seeds"], geometric=True)
    for name, m in done.items():
        base = METHODS.get(name, {}).get("variant_of")  # a variant is compared with its base method too
        for ref in ("ddp", "diloco", *([base] if base not in (None, "ddp", "diloco") else [])):
            other = None if ref == name else done.get(ref)
            paired = []
            if other is not None:
                paired = [ratio(at_equal[name][s], at_equal[ref][s]) for s in at_equal[name] if s in at_equal[ref]]
            m[f"ppl_vs_{ref}_seeds"] = paired
            m[f"ppl_vs_{ref}"], m[f"ppl_vs_{ref}_sd"] = mean_sd(paired, geometric=True) if paired else (None, None)
            m[f"ppl_vs_{ref}_verdict"] = verdict(paired) if paired else "-"
            m[f"bytes_vs_{ref}"] = ratio(m["comm_bytes"], other and other["comm_bytes"])
            m[f"measured_bytes_vs_{ref}"] = ratio(m["measured_bytes_sent"], other and other["measured_bytes_sent"])
            m[f"wall_vs_{ref}"] = ratio(m["wall_seconds"], other and other["wall_seconds"])
        twin = METHODS.get(name, {}).get("equal_batches")
        if twin in done:  # a split by speed against equal batches on the same slow worker, paired by seed
            mine, theirs = m["seed_results"], done[twin]["seed_results"]
            paired = [
                ratio(wall_per_round(mine[s]), wall_per_round(theirs[s]))
                for s in mine
                if s in theirs and "error" not in mine[s] and "error" not in theirs[s]
            ]
            paired = [p for p in paired if p is not None]
            m[f"wall_per_round_vs_{twin}_seeds"] = paired
            m[f"wall_per_round_vs_{twin}"], m[f"wall_per_round_vs_{twin}_sd"] = mean_sd(paired)
    return {"equal_tokens": equal_tokens, "targets": check_targets(done)}


def check_targets(done: dict[str, dict]) -> dict[str, dict]:
    """The goals AdLoCo is measured against (not assertions): each with the value, the bound and whether it holds."""
    targets = {}

    def add(name, value, bound, low=None):
        holds = None if value is None else value <= bound and (low is None or value >= low)
        targets[name] = {"value": value, "bound": bound, "low": low, "holds": holds}

    # Workers of different speeds: one of 4 at a quarter of a core, a split by speed against equal batches.
    for name, m in done.items():
        twin, base = METHODS.get(name, {}).get("equal_batches"), METHODS.get(name, {}).get("variant_of")
        if twin in done:
            add(f"{name} wall per round / {twin}", m.get(f"wall_per_round_vs_{twin}"), 0.6)
        if twin is not None and base in done:
            add(f"{name} ppl / {base} ppl at equal tokens (within 2 %)", m.get(f"ppl_vs_{base}"), 1.02, 0.98)
    adloco = done.get("adloco")
    if adloco is None:
        return targets

    if "diloco" in done:
        add("adloco ppl / diloco ppl at equal tokens", adloco["ppl_vs_diloco"], 1.0)
        add("adloco bytes / diloco bytes", adloco["bytes_vs_diloco"], 0.7)
    if "ddp" in done:
        add("adloco ppl / ddp ppl at equal tokens", adloco["ppl_vs_ddp"], 1.05)
        add("adloco bytes / ddp bytes", adloco["bytes_vs_ddp"], 0.02)
    return targets


COLUMNS = [
    "method",
    "seeds",
    "tokens",
    "epochs",
    "ppl@equal",
    "ppl/ddp",
    "ppl/diloco",
    "final ppl",
    "comm rounds",
    "bytes (model)",
    "bytes/diloco",
    "bytes (measured)",
    "wall s",
    "wall/ddp",
    "final batch",
]


def plus_minus(mean: float | None, sd: float | None, digits: int = 1) -> str | None:
    if mean is None:
        return None
    return f"{mean:.{digits}f}" if sd is None else f"{mean:.{digits}f} ± {sd:.{digits}f}"


def table_rows(methods: dict[str, dict]) -> list[dict]:
    rows = []
    for name, m in methods.items():
        if "error" in m:
            rows.append({"method": name, "tokens": m["error"]})
            continue
        rows.append(
            {
                "method": name,
                "seeds": len(m.get("seeds", [None])),
                "tokens": f"{m['tokens']:,.0f}",
                "epochs": None
                if m.get("epochs") is None
                else f"{m['epochs']:.2f} ({m.get('max_worker_epochs', 0):.2f})",
                "ppl@equal": plus_minus(m.get("ppl_at_equal_tokens"), m.get("ppl_at_equal_tokens_sd")),
                "ppl/ddp": _ratio_cell(m, "ddp"),
                "ppl/diloco": _ratio_cell(m, "diloco"),
                "final ppl": plus_minus(m["final_eval_ppl"], m.get("final_eval_ppl_sd")),
                "comm rounds": m["comm_rounds"],
                "bytes (model)": human_bytes(m["comm_bytes"]),
                "bytes/diloco": m.get("bytes_vs_diloco"),
                "bytes (measured)": human_bytes(m.get("measured_bytes_sent")),
                "wall s": m["wall_seconds"],
                "wall/ddp": m.get("wall_vs_ddp"),
                "final batch": m["batch_sizes"][-1][1] if m.get("batch_sizes") else None,
            }
        )
    return rows


def _ratio_cell(m: dict, ref: str) -> str | None:
    cell = plus_minus(m.get(f"ppl_vs_{ref}"), m.get(f"ppl_vs_{ref}_sd"), digits=3)
    if cell is None:
        return None
    pairs, seeds = len(m.get(f"ppl_vs_{ref}_seeds", [])), len(m.get("seeds", []))
    if seeds and pairs < seeds:  # a seed of either method failed: fewer pairs than seeds
        cell += f" [n={pairs}/{seeds}]"
    return f"{cell} ({m[f'ppl_vs_{ref}_verdict']})" if m.get(f"ppl_vs_{ref}_verdict") not in (None, "-") else cell


def _ratio_text(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}x"


def to_target_table(methods: dict[str, dict], targets: list[float]) -> str:
    """Per method and target: mean tokens, inner steps, rounds, bytes (modelled) and training seconds to reach it."""
    columns = ["method", "target ppl", "tokens", "inner steps", "rounds", "bytes (model)", "seconds"]
    rows = []
    for target in targets:
        for name, m in methods.items():
            entry = m.get("to_target", {}).get(f"{target:g}")
            if entry is None:
                continue
            missing = sum(v is None for v in entry["tokens_seeds"])
            rows.append(
                {
                    "method": name,
                    "target ppl": f"{target:g}",
                    "tokens": None
                    if entry["tokens"] is None
                    else f"{entry['tokens']:,.0f}" + (f" ({missing} seed(s) never)" if missing else ""),
                    "inner steps": entry["inner_steps"],
                    "rounds": entry["rounds"],
                    "bytes (model)": human_bytes(entry["bytes"]),
                    "seconds": entry["seconds"],
                }
            )
    return table(rows, columns)


# What a method's curve follows while several instances train (`curve_kind`; "model": one model throughout).
CURVE_KINDS = {
    "merged": "its curve is the merged model's (the instances averaged as the final merge would, at every "
    "evaluation); the instances' demand-weighted mean is kept as curve_instances_mean",
    "instances_mean": "while several instances train its curve is the demand-weighted mean of their losses "
    "(eval_merged_model off), which no single model achieves",
}


def format_report(results: dict) -> str:
    lines = [table(table_rows(results["methods"]), COLUMNS)]
    equal = results.get("equal_tokens")
    if equal is not None:
        lines.append(
            f"\nppl@equal: eval perplexity interpolated at {equal:,} tokens (the smallest final token count of any "
            "seed), geometric mean ± sample standard deviation over seeds. ppl/ddp, ppl/diloco: ratios paired by "
            "seed, geometric mean ± sd; a mean within one sd of 1 is a tie. epochs: tokens / train-split tokens "
            "(most passes of any worker over its own shard)."
        )
    for name, m in results["methods"].items():
        if "error" in m:
            continue
        if m.get("failed_seeds"):
            lines.append(f"{name}: seed(s) {m['failed_seeds']} failed and are left out of its means")
        kind = m.get("curve_kind", "model")
        if kind != "model":
            lines.append(f"{name}: {CURVE_KINDS.get(kind, f'curve points of several kinds ({kind})')}")
        if (m.get("epochs") or 0) > 1 or (m.get("max_worker_epochs") or 0) > 1:
            lines.append(
                f"WARNING {name}: {m['epochs']:.2f} epochs, a worker made {m['max_worker_epochs']:.2f} passes over "
                "its shard: some samples were trained on twice"
            )
        matched = [r.get("tokens_per_round_vs_reference") for r in m.get("seed_results", {}).values()]
        matched = [v for v in matched if v is not None]
        if matched:
            batches = sorted({r.get("matched_batch_size") for r in m["seed_results"].values()} - {None})
            lines.append(
                f"{name}: fixed batch {batches} per worker, tokens per round {min(matched):.3f}-{max(matched):.3f} x "
                f"{METHODS[name]['matched_to']}'s (the batch is a whole number)"
            )
        twin = METHODS.get(name, {}).get("equal_batches")
        if m.get(f"wall_per_round_vs_{twin}") is not None:
            cell = plus_minus(m[f"wall_per_round_vs_{twin}"], m.get(f"wall_per_round_vs_{twin}_sd"), digits=3)
            lines.append(
                f"{name} vs {twin} (equal batches, the same slow worker): wall per round {cell} "
                f"({m['wall_per_round']:.2f} s against {results['methods'][twin]['wall_per_round']:.2f} s), "
                f"paired by seed"
            )
        base = METHODS.get(name, {}).get("variant_of")
        if base is not None and m.get(f"ppl_vs_{base}") is not None:
            lines.append(
                f"{name} vs {base}: ppl at equal tokens {_ratio_cell(m, base)}, bytes (model) "
                f"{_ratio_text(m.get(f'bytes_vs_{base}'))}, bytes (measured) "
                f"{_ratio_text(m.get(f'measured_bytes_vs_{base}'))}, wall {_ratio_text(m.get(f'wall_vs_{base}'))}"
            )
    for name, target in results.get("targets", {}).items():
        value = "-" if target["value"] is None else f"{target['value']:.3f}"
        verdict_text = {True: "holds", False: "MISSED", None: "n/a"}[target["holds"]]
        low = "" if target.get("low") is None else f"{target['low']} <= "
        lines.append(f"target {low}{name} <= {target['bound']}: {value} ({verdict_text})")
    if results.get("ppl_targets"):
        lines.append("\nTo target (means over seeds; seconds: training time on this machine, evaluations excluded):\n")
        lines.append(to_target_table(results["methods"], results["ppl_targets"]))
    return "\n".join(lines)


# A method's figures that `summary.json` keeps (means, sds and per-seed values), with every ratio and wall per round.
SUMMARY_KEYS = ("seeds", "tokens", "rounds", "wall_seconds", "wall_seconds_seeds", "wall_per_round",
                "wall_per_round_sd", "wall_per_round_seeds", "ppl_at_equal_tokens", "ppl_at_equal_tokens_sd",
                "ppl_at_equal_tokens_seeds", "final_eval_ppl", "final_eval_ppl_seeds", "comm_bytes")  # fmt: skip


def summary(results: dict) -> dict:
    """The compact record of a run (`summary.json`, small enough to keep beside the docs that quote it): per method
    the figures of `SUMMARY_KEYS`, its ratios (`ppl_vs_*`, `wall_per_round_vs_*`, ...) and, per seed, the slowed
    ranks and every round's per-worker batches and seconds per sample (instance id → one list per round); the
    targets, the equal-token point, the seeds and the settings. Everything else stays in `results.json`."""
    methods = {}
    for name, m in results["methods"].items():
        if "error" in m:
            methods[name] = {"error": m["error"]}
            continue
        entry = {key: m.get(key) for key in SUMMARY_KEYS}
        entry.update({k: v for k, v in m.items() if k.startswith(("ppl_vs_", "wall_per_round_vs_", "wall_vs_"))})
        entry["per_seed"] = {
            seed: {
                "slowed_ranks": r.get("slowed_ranks", []),
                "worker_batch_sizes": _per_round(r, "worker_batch_sizes"),
                "worker_sample_seconds": _per_round(r, "worker_sample_seconds"),
            }
            for seed, r in m["seed_results"].items()
            if "error" not in r
        }
        methods[name] = entry
    keep = ("equal_tokens", "targets", "seeds", "settings", "profile", "total_seconds")
    return {"methods": methods, **{key: results.get(key) for key in keep}}


def _per_round(result: dict, key: str) -> dict[str, list]:
    """instance id → [that instance's `key` in each round it trained] from a run's round log."""
    out: dict[str, list] = {}
    for entry in result.get("round_log") or []:
        for instance, value in (entry.get(key) or {}).items():
            out.setdefault(instance, []).append(value)
    return out


def plot(results: dict, path: str) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (by_tokens, by_bytes) = plt.subplots(1, 2, figsize=(13, 5))
    for name, m in results["methods"].items():
        if "error" in m:
            continue
        style = {"linestyle": "--"} if name.startswith("adloco_") else {"linewidth": 2.2}
        tokens, ppl = zip(*m["curve"])
        (line,) = by_tokens.plot(tokens, ppl, marker="o", markersize=3, label=name, **style)
        seeds = [c for c in seed_curves(m).values()]
        if len(seeds) > 1:  # the band: lowest and highest seed at each of the mean curve's points
            band = [[interpolate_curve(c, x) for c in seeds] for x in tokens]
            low = [min(v for v in b if v is not None) for b in band]
            high = [max(v for v in b if v is not None) for b in band]
            by_tokens.fill_between(tokens, low, high, color=line.get_color(), alpha=0.15)
        comm, ppl_b = zip(*m["curve_bytes"])
        by_bytes.plot(comm, ppl_b, marker="o", markersize=3, label=name, **style)
    for target in results.get("ppl_targets", []):
        by_tokens.axhline(target, color="grey", linewidth=0.8, linestyle=":")
    by_tokens.set_xlabel("training tokens (all workers); band: lowest to highest seed")
    by_bytes.set_xlabel("bytes communicated (ring all-reduce model; log axis, linear below 1 MB so 0 shows)")
    # Logarithmic above 1 MB; the linear stretch below keeps the points of rounds that sent nothing (0 bytes).
    by_bytes.set_xscale("symlog", linthresh=1e6)
    for ax in (by_tokens, by_bytes):
        ax.set_ylabel("eval perplexity (mean over seeds, geometric)")
        ax.set_yscale("log")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    settings = results["settings"]
    seeds = results.get("seeds", [settings["seed"]])
    fig.suptitle(
        f"{settings['preset']} on {settings['data']['corpus']}, {settings['world_size']} workers ({settings['device']}), "
        f"budget {settings['budget_tokens']:,} tokens, H={settings['train']['inner_steps']}, seeds {seeds}"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="The smaller budget (< 12 minutes on 2 CPU cores).")
    parser.add_argument(
        "--methods",
        nargs="+",
        choices=list(METHODS),
        default=list(DEFAULT_METHODS),
        help=f"Methods to run (default: {' '.join(DEFAULT_METHODS)}).",
    )
    parser.add_argument("--output_dir", default="outputs/benchmarks/convergence")
    parser.add_argument("--cache_dir", default="outputs/cache", help="Tokenizer and packed data cache.")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--preset", default=None, help="Model preset (default: tiny on CPU, microllama on CUDA).")
    parser.add_argument("--fp16", action="store_true", help="Mixed precision (CUDA only).")
    parser.add_argument("--budget_tokens", type=int, default=None, help="Training tokens per method.")
    parser.add_argument(
        "--budget_seconds",
        type=float,
        default=None,
        help="Training seconds per method (evaluations excluded): every method stops at the end of the first round "
        "after them, the same for all, and --budget_tokens (x each method's budget factor) becomes a ceiling.",
    )
    parser.add_argument("--batch_size", type=int, default=None, help="Initial per-worker batch (DDP: fixed).")
    parser.add_argument("--learning_rate", type=float, default=None, help="Inner AdamW learning rate (all methods).")
    parser.add_argument("--inner_steps", type=int, default=None, help="H, inner steps per round.")
    parser.add_argument("--eval_every_rounds", type=int, default=None)
    parser.add_argument("--warmup_steps", type=int, default=None)
    parser.add_argument("--eta", type=float, default=None, help="η of the norm test.")
    parser.add_argument("--max_batch_size", type=int, default=None)
    parser.add_argument("--batch_size_cap", type=int, default=None)
    parser.add_argument("--merge_every", type=int, default=None)
    parser.add_argument("--outer_lr", type=float, default=None, help="Outer lr of the methods that use the default.")
    parser.add_argument("--timeout", type=int, default=None, help="Seconds before one method's launch is killed.")
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="SECTION.KEY=JSON",
        help="Override any shared setting, e.g. --set adloco.outer_momentum=0 --set train.adam_beta2=0.95.",
    )
    parser.add_argument("--reuse", action="store_true", help="Keep a method's result when its spec is unchanged.")
    parser.add_argument(
        "--seeds", type=int, default=3, help="Seeds per method (model weights and data order): seed, seed + 1, ..."
    )
    parser.add_argument(
        "--allow_repeats",
        action="store_true",
        help="Allow a budget above one epoch of the train split (samples are then seen more than once).",
    )
    args = parser.parse_args(argv)
    if args.fp16 and args.device != "cuda":
        parser.error("--fp16 needs --device cuda")
    if args.seeds < 1:
        parser.error("--seeds must be at least 1")
    if args.budget_seconds is not None and not args.budget_seconds > 0:
        parser.error(f"--budget_seconds must be positive, got {args.budget_seconds}")
    problem = check_matched(args.methods)
    if problem:
        parser.error(problem)
    return args


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


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    os.chdir(REPO)
    start = time.perf_counter()
    settings = shared_settings(args)
    if settings["device"] == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise SystemExit("--device cuda: no CUDA device is visible")
    output_dir = os.path.abspath(args.output_dir)
    os.makedirs(output_dir, exist_ok=True)
    seeds = [settings["seed"] + i for i in range(args.seeds)]
    names, unavailable = runnable(run_order(args.methods))
    if unavailable is not None:
        skipped = [n for n in args.methods if n not in names]
        print(f"skipping {', '.join(skipped)}: a slow worker needs a cgroup with a CPU quota ({unavailable})")
    print("preparing data and the initial perplexities ...", flush=True)
    initial_ppl = {}
    for seed in seeds:
        initial_ppl[seed], train_tokens = prepare(settings, seed)
    check_epochs(settings, train_tokens, args.allow_repeats)
    per_seed: dict[str, dict[int, dict]] = {name: {} for name in names}
    runs, done = len(seeds) * len(names), 0
    for seed in seeds:
        for name in names:
            done += 1
            print(
                f"--- run {done}/{runs}: {name}, seed {seed} ({time.perf_counter() - start:.0f}s so far)", flush=True
            )
            try:
                matched = matched_for(
                    name, {n: runs_of[seed] for n, runs_of in per_seed.items() if seed in runs_of}, settings
                )
            except ValueError as error:
                per_seed[name][seed] = {"error": str(error)}
                continue
            spec = method_spec(name, settings, output_dir, seed=seed, matched_batch_size=matched)
            result = run_method(name, spec, args.reuse)
            if "curve" in result:
                for key in CURVES:
                    if key in result:  # a reused result may predate curve_instances_mean
                        result[key].insert(0, [0, initial_ppl[seed]])
                result["matched_batch_size"] = matched
                reference = METHODS[name].get("matched_to")
                if reference is not None:  # how close the integer batch came to the reference's tokens per round
                    ours, theirs = result, per_seed[reference][seed]
                    result["tokens_per_round_vs_reference"] = (ours["tokens"] / ours["rounds"]) / (
                        theirs["tokens"] / theirs["rounds"]
                    )
            per_seed[name][seed] = result
    methods = {name: aggregate(per_seed[name]) for name in args.methods if name in names}
    results = {
        "methods": methods,
        "settings": settings,
        "seeds": seeds,
        "initial_eval_ppl": initial_ppl,
        "train_tokens_available": train_tokens,
        "profile": "quick" if args.quick else "full",
    }
    results["ppl_targets"] = to_target(methods, initial_ppl)
    results.update(compare(methods))
    results["total_seconds"] = time.perf_counter() - start
    write_json(os.path.join(output_dir, "results.json"), results)
    write_json(os.path.join(output_dir, "summary.json"), summary(results))
    report = format_report(results)
    with open(os.path.join(output_dir, "table.md"), "w", encoding="utf-8") as f:
        f.write(report + "\n")
    print(report)
    if any("curve" in m for m in methods.values()):
        print(f"wrote {plot(results, os.path.join(output_dir, 'convergence.png'))}")
    print(f"wrote {os.path.join(output_dir, 'results.json')} ({results['total_seconds']:.0f}s in all)")
    return results


if __name__ == "__main__":
    main()
