"""`AdLoCoConfig`'s own fields, in four groups: the rounds, the instances, the batch size, the workers and failures.

Each group is a plain dataclass that `AdLoCoConfig` inherits, so the fields stay flat (`--inner_steps`, YAML keys)
for `HfArgumentParser` while each group reads on its own. The fields are documented once, in `AdLoCoConfig`'s
docstring (grouped the same way); each `help` is the short form of it. A field that takes a choice keeps its allowed
values (from `choices.py`) in `metadata["choices"]`: `--help` shows them and `checks.py` refuses anything else.
"""

from dataclasses import dataclass, field

from .choices import (
    BATCH_SIZE_TARGETS,
    BATCH_SIZE_TESTS,
    GOODPUT_TIMINGS,
    INNER_STEPS_RULES,
    INSTANCE_INITS,
    LR_SCALING_RULES,
    MERGE_BATCH_RULES,
    MERGE_PAYLOADS,
    MERGE_POLICIES,
    MERGE_TRANSPORTS,
    NOISE_PRECONDITIONERS,
    NONPOSITIVE_SIGNAL,
    OUTER_STATE_DEVICES,
    PSEUDO_GRAD_COMPRESSIONS,
    PSEUDO_GRAD_DTYPES,
    WORKER_BATCH_SPLITS,
    WORKER_PARALLELISMS,
)


__all__ = ["GROUPS", "BatchFields", "InstanceFields", "RoundFields", "WorkerFields"]


@dataclass
class RoundFields:
    """The rounds (DiLoCo): inner steps, the outer step and what it sends."""

    inner_steps: int = field(default=200, metadata={"help": "H, the inner (optimizer) steps per round."})
    outer_lr: float = field(default=0.7, metadata={"help": "Learning rate of the outer SGD."})
    outer_momentum: float = field(default=0.9, metadata={"help": "Momentum of the outer SGD, in [0, 1)."})
    outer_nesterov: bool = field(default=True, metadata={"help": "Use Nesterov momentum in the outer SGD."})
    pseudo_grad_dtype: str = field(
        default="bfloat16",
        metadata={"help": "Precision of the pseudo-gradient all-reduce.", "choices": list(PSEUDO_GRAD_DTYPES)},
    )
    outer_state_device: str = field(
        default="device",
        metadata={"help": "Where the fp32 global weights and momentum live.", "choices": list(OUTER_STATE_DEVICES)},
    )
    pseudo_grad_compression: str = field(
        default="none",
        metadata={
            "help": "Send the pseudo-gradient as int8 or int4 blocks with error feedback.",
            "choices": list(PSEUDO_GRAD_COMPRESSIONS),
        },
    )
    compression_block_size: int = field(default=256, metadata={"help": "Values per scale of the compression."})
    outer_overlap: bool = field(
        default=False, metadata={"help": "Overlap the round's all-reduce with the next round (eager updates)."}
    )
    outer_overlap_local_weight: float | None = field(
        default=1.0, metadata={"help": "λ of the overlapped outer step (None: 1 / M, Kale et al.'s eager update)."}
    )
    num_fragments: int | None = field(
        default=None,
        metadata={
            "help": "Streaming DiLoCo: sync the model in P fragments, fragment p after inner step p·H/P of each round "
            "(None: the whole model at the round's end)."
        },
    )
    fragment_sync_delay: int = field(
        default=0,
        metadata={"help": "τ: inner steps between sending a fragment's pseudo-gradient and applying its average."},
    )
    fragment_update_alpha: float = field(
        default=0.0,
        metadata={"help": "α: a synced fragment's weights = (1 − α) × its global weights + α × the local ones."},
    )


@dataclass
class InstanceFields:
    """The instances (multi-instance training): how many, when and how they merge, what is saved."""

    num_instances: int = field(default=1, metadata={"help": "K, the initial number of instances."})
    merge_every: int = field(default=3, metadata={"help": "Rounds between merges; 0 never merges."})
    merge_policy: str = field(
        default="smallest_pair",
        metadata={"help": "Which instances merge.", "choices": list(MERGE_POLICIES)},
    )
    merge_transport: str = field(
        default="all_reduce",
        metadata={
            "help": "How a merge travels: a weighted all-reduce, or point-to-point sends.",
            "choices": list(MERGE_TRANSPORTS),
        },
    )
    merge_payload: str = field(
        default="float32",
        metadata={
            "help": "What an all-reduce merge sends: float32 weights and outer momentum, or compact (bfloat16 weights, "
            "int8 blocks of the momentum: about 3 bytes a parameter instead of 8).",
            "choices": list(MERGE_PAYLOADS),
        },
    )
    instance_init: str = field(
        default="shared",
        metadata={
            "help": "Start instances from the same weights or re-initialise each.",
            "choices": list(INSTANCE_INITS),
        },
    )
    save_merges: bool = field(default=True, metadata={"help": "Save every merge under {output_dir}/merges/."})
    save_merged_full: bool = field(
        default=False,
        metadata={"help": "For a PEFT adapter, also save it fused into its base under {output_dir}/merged-full/."},
    )
    plot_run: bool = field(
        default=True,
        metadata={
            "help": "At the end of training, draw {output_dir}/adloco_run.png from the rounds file (global rank 0, "
            "about a second with matplotlib's import) and show it in the merged model's card."
        },
    )
    eval_merged_model: bool = field(
        default=False,
        metadata={"help": "While several instances train, also evaluate their final merge at every evaluation."},
    )


@dataclass
class BatchFields:
    """The batch size (adaptive batching and switch mode) and the learning rate that follows it."""

    batch_size_test: str = field(
        default="norm",
        metadata={"help": "The adaptive batch-size test.", "choices": list(BATCH_SIZE_TESTS)},
    )
    eta: float = field(default=0.8, metadata={"help": "η of the norm test."})
    theta: float = field(default=0.3, metadata={"help": "ϑ of the inner-product tests."})
    nu: float = field(default=0.3, metadata={"help": "ν of the augmented inner-product test."})
    max_batch_size: str = field(
        default="auto", metadata={"help": "Largest micro-batch per worker: an integer or 'auto'."}
    )
    batch_size_cap: int | None = field(
        default=None,
        metadata={
            "help": "Upper bound on the per-worker request (set it for the norm test; above switch_threshold × "
            "max_batch_size for switch mode to accumulate). The goodput rule bounds itself without it."
        },
    )
    batch_size_smoothing: float = field(
        default=0.5, metadata={"help": "β of the moving averages of the gradient statistics (0: one round)."}
    )
    noise_preconditioner: str = field(
        default="none",
        metadata={
            "help": "Metric of the gradient statistics: none (Euclidean) or adam (Adam's second moments).",
            "choices": list(NOISE_PRECONDITIONERS),
        },
    )
    nonpositive_signal: str = field(
        default="keep",
        metadata={
            "help": "When the ‖∇F‖² estimate is <= 0: keep the request or clamp.",
            "choices": list(NONPOSITIVE_SIGNAL),
        },
    )
    batch_size_shrink: bool = field(
        default=False,
        metadata={"help": "Let requests fall (the norm test's and the goodput rule's; with hysteresis)."},
    )
    shrink_hysteresis: float = field(default=0.5, metadata={"help": "Shrink only below this fraction of the request."})
    batch_size_floor: int | None = field(
        default=None,
        metadata={"help": "Smallest request when shrinking, and of the goodput rule (default: the initial one)."},
    )
    batch_size_target: str = field(
        default="auto",
        metadata={
            "help": "The request of the highest goodput (throughput measured on the run, the round's communication "
            "included, × statistical efficiency), the norm test's ('test'), or a multiple of the noise scale; "
            "'auto': goodput with the norm test, the test's own request with any other test.",
            "choices": list(BATCH_SIZE_TARGETS),
        },
    )
    noise_scale_multiple: float = field(default=1.0, metadata={"help": "Target = this × the noise scale."})
    goodput_hysteresis: float = field(
        default=0.05,
        metadata={"help": "batch_size_target='goodput' changes a request only when its predicted goodput gains this."},
    )
    goodput_timing: str = field(
        default="startup",
        metadata={
            "help": "Where the goodput rule's step and round costs come from: a profile measured once before the "
            "first round and cached (startup: a run is repeatable from its seed), that profile then every round's "
            "timings (startup_live), or the rounds' timings alone (live). Both live modes trade repeatability away.",
            "choices": list(GOODPUT_TIMINGS),
        },
    )
    merge_batch_rule: str = field(
        default="preserve_total",
        metadata={"help": "Per-worker request after a merge.", "choices": list(MERGE_BATCH_RULES)},
    )
    inner_steps_rule: str = field(
        default="fixed",
        metadata={
            "help": "fixed, or outer_noise (double H up to max_inner_steps while the workers' pseudo-gradients agree).",
            "choices": list(INNER_STEPS_RULES),
        },
    )
    max_inner_steps: int | None = field(
        default=None, metadata={"help": "Largest H of inner_steps_rule='outer_noise' (inner_steps × 2^k)."}
    )
    outer_noise_theta: float = field(
        default=0.5, metadata={"help": "H doubles while the outer noise is at most this squared."}
    )
    switch_threshold: float = field(
        default=2.0,
        metadata={
            "help": "γ ≥ 1 of switch mode: a request above max_batch_size but at most γ × it runs as max_batch_size "
            "samples, a larger one whole as accumulated micro-batches."
        },
    )
    lr_batch_scaling: str = field(
        default="none",
        metadata={
            "help": "How the inner learning rate follows the batch size: none, sqrt (for AdamW), sqrt_adam (lr, "
            "betas, eps and weight decay of AdamW) or linear.",
            "choices": list(LR_SCALING_RULES),
        },
    )
    memory_fraction: float = field(
        default=0.9, metadata={"help": "Share of free GPU memory that max_batch_size='auto' plans for."}
    )
    worker_batch_split: str = field(
        default="equal",
        metadata={
            "help": "How an instance's batch is split among its workers: equal, or by their measured speed (speed).",
            "choices": list(WORKER_BATCH_SPLITS),
        },
    )
    split_hysteresis: float = field(
        default=0.05,
        metadata={"help": "worker_batch_split='speed': re-split when a round would end this much sooner."},
    )


@dataclass
class WorkerFields:
    """The processes of a worker, and what happens when something fails."""

    processes_per_worker: int = field(
        default=1, metadata={"help": "G, processes per worker (data parallel inside a worker, DiLoCo across)."}
    )
    worker_parallelism: str = field(
        default="ddp",
        metadata={
            "help": "Inside a worker of processes_per_worker > 1: 'ddp' (full replicas) or 'fsdp' (FSDP2 shards).",
            "choices": list(WORKER_PARALLELISMS),
        },
    )
    worker_timeout: float = field(
        default=1800.0, metadata={"help": "Seconds to wait for the other workers before stopping with an error."}
    )
    peer_timeout: float | None = field(
        default=None,
        metadata={
            "help": "Seconds a worker's pulse may stand still before the others name it dead and end (exit 75) for "
            "their launcher to restart them. None: 45 where worker_timeout is above 60, else 0 (off)."
        },
    )
    max_skipped_rounds: int | None = field(
        default=3, metadata={"help": "Stop when an instance skips more rounds than this in a row (None: never)."}
    )
    preemption_grace_seconds: float = field(
        default=25.0,
        metadata={"help": "On SIGTERM/SIGINT: stop at the round's end if it is this close, else at the next step."},
    )


# In the order of `AdLoCoConfig`'s docstring and `--help`.
GROUPS = (RoundFields, InstanceFields, BatchFields, WorkerFields)
