"""The methods the training benchmarks compare (`convergence`, `links`, `gpu_bench`): each one's `AdLoCoConfig`
settings over the shared ones (`settings.py`), and how the reports relate them.

A method is `{"kind": "ddp" | "adloco", "adloco": {settings}, ...}`, with optionally `variant_of` (the method it
changes in exactly the settings it names, which the reports compare it with), `matched_to` (its fixed batch is the
reference's mean tokens per round), `equal_batches` (its twin with the same slow worker), `slow_workers` (a worker in
a cgroup with a CPU quota: `cgroups.py`), `batch_size` (a fixed batch of its own, at the square-root rule's learning
rate) and `budget_factor` (× the token budget). The benchmarks' README describes every method.
"""

__all__ = [
    "ADLOCO",
    "DEFAULT_METHODS",
    "DILOCO",
    "FIXED_BATCH",
    "GOODPUT",
    "METHODS",
    "PAPER_RULES",
    "SLOW_ONE",
    "STREAMING",
    "slow_worker_methods",
]

# What changes between methods; everything else is the shared settings (`settings.py`).
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


def slow_worker_methods(base: str, settings: dict) -> dict[str, dict]:
    """`{base}_slow1` (equal batches wait for the slow worker every round) and `{base}_balanced` (each worker's share
    of its instance's batch follows its speed), both with `SLOW_ONE` and compared with `base`."""
    slow = {"kind": "adloco", "adloco": dict(settings), "slow_workers": SLOW_ONE, "variant_of": base}
    balanced = {
        "kind": "adloco",
        "adloco": {**settings, "worker_batch_split": "speed"},
        "slow_workers": SLOW_ONE,
        "variant_of": base,
        "equal_batches": f"{base}_slow1",
    }
    return {f"{base}_slow1": slow, f"{base}_balanced": balanced}


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
    **slow_worker_methods("diloco", DILOCO),
    **slow_worker_methods("adloco", ADLOCO),
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
    # b32 runs as two micro-batches of 16 on the CPU profile; the virtual clock's profile sets its own micro-batch
    # limit for every method (`settings.method_spec`), which runs it whole on an H200.
    "diloco_b32": {"kind": "adloco", "adloco": {**DILOCO, **FIXED_BATCH}, "batch_size": 32},
    # Issue 51's sweep of fixed batches (4 to 64), from which the best is chosen on selection seeds.
    "diloco_b64": {"kind": "adloco", "adloco": {**DILOCO, **FIXED_BATCH}, "batch_size": 64},
    # The same at the initial batch's learning rate (no √ scaling; at b = 4 both are `diloco_b4`): the sweep over
    # batch × {held, √} a user would run, beside the rule with its rate held (`rule_startup_lr_held`, the defaults).
    **{
        f"diloco_b{size}_lr_held": {
            "kind": "adloco",
            "adloco": {**DILOCO, **FIXED_BATCH},
            "batch_size": size,
            "scale_learning_rate": False,
        }
        for size in (8, 16, 32, 64)
    },
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
    # Issue 51's study (run only when named): the batch rule against fixed batches in the same structure, DiLoCo's
    # one instance of 4 workers (the library's default `num_instances=1`), so that the rule is all that differs:
    # the goodput rule from its startup profile (the default `goodput_timing="startup"`), without the profile
    # (`"live"`: the rounds' timings from the initial request, the rule of issue 39; `rule_live_lr_held` with the
    # rate held, the long regime's rule without the profile), and with the inner learning
    # rate held or following Malladi et al.'s whole square-root rule for Adam instead of the square root alone. Each
    # trains 1.25 × the budget: enough to measure a time to the best fixed batch's perplexity up to 1.25 × its own.
    **{
        name: {
            "kind": "adloco",
            "adloco": {**DILOCO, **GOODPUT, "batch_size_test": "norm", **changed},
            "budget_factor": 1.25,
        }  # fmt: skip
        for name, changed in {
            "rule_startup": {"goodput_timing": "startup"},
            "rule_live": {"goodput_timing": "live"},
            "rule_live_lr_held": {"goodput_timing": "live", "lr_batch_scaling": "none"},
            "rule_startup_lr_held": {"goodput_timing": "startup", "lr_batch_scaling": "none"},
            "rule_startup_sqrt_adam": {"goodput_timing": "startup", "lr_batch_scaling": "sqrt_adam"},
            # The defaults whose requests may fall (`batch_size_shrink`: the goodput rule's behaviour until issue 51's
            # selection seeds showed it losing its first rounds to the floor).
            "rule_startup_lr_held_falls": {
                "goodput_timing": "startup",
                "lr_batch_scaling": "none",
                "batch_size_shrink": True,
            },
            # The defaults with the noise scale in Adam's metric (tr P Σ / gᵀ P g, P from AdamW's second moments).
            "rule_startup_lr_held_adam": {
                "goodput_timing": "startup",
                "lr_batch_scaling": "none",
                "noise_preconditioner": "adam",
            },
        }.items()
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
