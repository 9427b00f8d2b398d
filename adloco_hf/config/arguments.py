"""Configuration of AdLoCo training: `TrainingArguments` plus the rounds, instances and batch-size test."""

import os
from dataclasses import dataclass, field

from transformers import TrainingArguments
from transformers.trainer_utils import IntervalStrategy, SaveStrategy

from .choices import (
    BATCH_SIZE_TARGETS,
    BATCH_SIZE_TESTS,
    INNER_STEPS_RULES,
    INSTANCE_INITS,
    LR_SCALING_RULES,
    MERGE_BATCH_RULES,
    MERGE_POLICIES,
    MERGE_TRANSPORTS,
    NOISE_PRECONDITIONERS,
    NONPOSITIVE_SIGNAL,
    OUTER_STATE_DEVICES,
    PSEUDO_GRAD_COMPRESSIONS,
    PSEUDO_GRAD_DTYPES,
    WORKER_PARALLELISMS,
)
from .compat import (
    has_distributed_accelerator,
    refuse_what_adloco_cannot_honour,
    warn_about_what_works_badly,
    warn_once,
)


__all__ = ["AdLoCoConfig"]


@dataclass
class AdLoCoConfig(TrainingArguments):
    r"""
    Configuration for [`AdLoCoTrainer`]: everything of [`~transformers.TrainingArguments`] plus AdLoCo's settings
    (Kutuzov et al., 2025, [arXiv 2508.18182](https://arxiv.org/abs/2508.18182)).

    Each process of `accelerate launch` is a *worker*. Workers are grouped into *instances*; each instance trains its
    own model with DiLoCo: `inner_steps` local AdamW steps per worker, then one *round* ends with an outer step that
    averages the workers' pseudo-gradients and applies an outer SGD. The initial per-worker batch is
    `per_device_train_batch_size`; a batch-size test on the gradient noise grows it between rounds.

    Parameters:
        > Parameters that control the rounds (DiLoCo)

        inner_steps (`int`, *optional*, defaults to `200`):
            H, the inner (optimizer) steps per round. Workers communicate once per round.
        outer_lr (`float`, *optional*, defaults to `0.7`):
            Learning rate of the outer SGD (DiLoCo's value; the AdLoCo paper's table uses 0.5). With `outer_lr=1`
            and `outer_momentum=0` the outer step is plain parameter averaging.
        outer_momentum (`float`, *optional*, defaults to `0.9`):
            Momentum of the outer SGD, in [0, 1).
        outer_nesterov (`bool`, *optional*, defaults to `True`):
            Use Nesterov momentum in the outer SGD (no effect when `outer_momentum=0`).
        pseudo_grad_dtype (`str`, *optional*, defaults to `"bfloat16"`):
            Precision of the pseudo-gradient all-reduce: `"float32"`, `"bfloat16"` (half the bytes) or `"float16"`.
            Global weights and the outer momentum always stay in float32.
        outer_state_device (`str`, *optional*, defaults to `"device"`):
            Where the float32 global weights and outer momentum live: `"device"` (fast) or `"cpu"` (saves 2×
            float32 parameters of accelerator memory).
        pseudo_grad_compression (`str`, *optional*, defaults to `"none"`):
            `"int8"` or `"int4"` send the pseudo-gradient as 8- or 4-bit blocks (one float32 scale per
            `compression_block_size` values) around a ring that re-quantizes partial sums: 0.51× or 0.26× the bytes
            of bfloat16. Each worker keeps what quantization dropped (error feedback) and adds it to its next
            round's pseudo-gradient; the residual is saved in checkpoints. `"none"` all-reduces in
            `pseudo_grad_dtype`, which compression replaces.
        compression_block_size (`int`, *optional*, defaults to `256`):
            Values per scale of `pseudo_grad_compression` (even, >= 2).
        outer_overlap (`bool`, *optional*, defaults to `False`):
            Overlap the pseudo-gradient all-reduce of round r with the inner steps of round r + 1 (eager updates,
            Kale et al., 2025): each worker applies its own fresh pseudo-gradient at once (weighted by
            `outer_overlap_local_weight`) in place of its stale share, and the instance's average one round late.
            Communication is hidden behind a round of compute.
        outer_overlap_local_weight (`float`, *optional*, defaults to `1.0`):
            λ, the weight of a worker's own fresh pseudo-gradient in its overlapped outer step: 1 keeps all of the
            worker's own progress and takes the others' one round late (measured best: see the README's
            communication table); None is 1 / M, the eager update of Kale et al. (2025).

        > Parameters that control the instances (multi-instance training)

        num_instances (`int`, *optional*, defaults to `1`):
            K, the initial number of instances (the paper uses 4). Must not exceed the number of workers.
        merge_every (`int`, *optional*, defaults to `3`):
            Rounds between two merges while more than one instance remains; `0` never merges.
        merge_policy (`str`, *optional*, defaults to `"smallest_pair"`):
            `"smallest_pair"` merges the two instances with the smallest demand (batch × workers, the paper's
            policy); `"largest_smallest"` merges the largest with the smallest.
        merge_transport (`str`, *optional*, defaults to `"all_reduce"`):
            How a merge travels, with P = φ and outer momentum in float32 (8 bytes per trainable parameter):
            `"all_reduce"`: one weighted all-reduce over the workers of both merging instances (each adds its
            instance's merge weight / its number of workers × its φ and momentum), a broadcast of an instance's
            state to each worker that moves into it from elsewhere, every worker keeping its own AdamW state;
            2 (n − 1) P bytes over the n workers of the merge, ≤ 3 P of link time. `"point_to_point"`: blocking
            sends in one order, which also hand the first worker's AdamW state to each worker that joins an
            instance; ≈ n P of link time on the survivor's first worker, plus ≈ P per joining worker.
        instance_init (`str`, *optional*, defaults to `"shared"`):
            `"shared"`: all instances start from the same weights; `"independent"`: instance i is re-initialised
            with seed `seed + i`.
        save_merges (`bool`, *optional*, defaults to `True`):
            Save every merge as a safetensors checkpoint under `{output_dir}/merges/outer-{n}/`.
        save_merged_full (`bool`, *optional*, defaults to `False`):
            For a PEFT model (e.g. LoRA), `{output_dir}/merged/` holds the trained adapter (load it with
            `PeftModel.from_pretrained`); with `True` the adapter fused into its base (`merge_and_unload`, on a CPU
            copy) is also saved to `{output_dir}/merged-full/`, loadable with `AutoModelForCausalLM` alone, and
            pushed to the repo's `merged-full/`. No effect for a model without an adapter.
        eval_merged_model (`bool`, *optional*, defaults to `False`):
            While several instances train, every evaluation also evaluates the model the final merge would produce
            at that point (the instances' global weights averaged with the final merge's weights) and logs it as
            `eval_merged_loss` / `eval_merged_perplexity` (and an `instance: "merged"` line with `final: false` in
            `adloco_eval.jsonl`). The top-level `eval_loss` is only the demand-weighted mean of the instances'
            losses, which no single model achieves. Costs per evaluation: one float32 all-reduce of the trainable
            weights over all workers (not counted in `comm_bytes`), a pass of every worker over 1 / P of the eval
            set, and a float32 copy of the weights plus a copy of the trainable parameters in memory while it runs.
            Training is unaffected: each worker's parameters are restored exactly afterwards.

        > Parameters that control the batch size (adaptive batching and switch mode)

        batch_size_test (`str`, *optional*, defaults to `"norm"`):
            `"norm"`, `"inner_product"`, `"augmented_inner_product"` or `"none"` (fixed batch).
        eta (`float`, *optional*, defaults to `0.8`):
            η of the norm test.
        theta (`float`, *optional*, defaults to `0.3`):
            ϑ of the inner-product tests (the paper's table: 0.01).
        nu (`float`, *optional*, defaults to `0.3`):
            ν of the augmented inner-product test.
        max_batch_size (`int` or `str`, *optional*, defaults to `"auto"`):
            The largest micro-batch a worker can run at once. `"auto"` searches it on CUDA; on CPU it means
            `CPU_AUTO_MAX_BATCH_SIZE` (32).
        batch_size_cap (`int`, *optional*):
            Upper bound on the per-worker request (default: unbounded, but never more than a worker's data shard).
        batch_size_smoothing (`float`, *optional*, defaults to `0.5`):
            β in [0, 1) of the moving averages across rounds of tr Σ̂ and ‖∇F‖² (kept separately; the norm test
            reads their ratio). `0` uses each round's statistics alone (the paper).
        noise_preconditioner (`str`, *optional*, defaults to `"none"`):
            The metric the gradient statistics are measured in: `"none"` (Euclidean, the paper) or `"adam"` (Adam's,
            P = 1 / (√v̂ + ε) from the inner optimizer's second moments: tr P Σ and gᵀ P g, the noise as the optimizer
            sees it). Needs an Adam-like inner optimizer; a statistics step before its first step measures nothing.
        nonpositive_signal (`str`, *optional*, defaults to `"keep"`):
            What the norm test does when the (smoothed) estimate of ‖∇F‖² is ≤ 0: `"keep"` the request, or
            `"clamp"` the estimate at 0 (the paper: a jump to B / η²).
        batch_size_shrink (`bool`, *optional*, defaults to `False`):
            Let a request fall, when the test asks for less than `shrink_hysteresis` × it (never below
            `batch_size_floor`). The paper's requests never shrink.
        shrink_hysteresis (`float`, *optional*, defaults to `0.5`):
            See `batch_size_shrink`; in (0, 1].
        batch_size_floor (`int`, *optional*):
            The smallest request shrinking may reach (default: `per_device_train_batch_size`).
        batch_size_target (`str`, *optional*, defaults to `"test"`):
            `"test"`: the request is the norm test's; `"noise_scale"`: `noise_scale_multiple` × the estimated
            noise scale tr Σ / ‖∇F‖² (the norm test's own fixed point is (1 − η²) / η² of it, 0.56 at η = 0.8).
        noise_scale_multiple (`float`, *optional*, defaults to `1.0`):
            See `batch_size_target`.
        merge_batch_rule (`str`, *optional*, defaults to `"preserve_total"`):
            `"paper"`: a merged instance keeps its per-worker request while gaining workers (its total grows);
            `"preserve_total"`: every instance keeps its total batch across a merge (per-worker ⌈total / workers⌉),
            and demand and merge weights count the samples actually processed in the round.
        inner_steps_rule (`str`, *optional*, defaults to `"fixed"`):
            `"fixed"`: every round has `inner_steps` inner steps; `"outer_noise"`: the next round has twice as many
            (up to `max_inner_steps`) when the workers' pseudo-gradients agreed: their variance over M ‖Δ̄‖² (the
            rounds file's `outer_noise`, averaged over instances by workers) is at most `outer_noise_theta²`. Round
            ends stay at multiples of the round's H, so `save_steps`/`eval_steps` must be multiples of
            `max_inner_steps`. Needs blocking outer steps (not `outer_overlap`).
        max_inner_steps (`int`, *optional*):
            The largest H of `inner_steps_rule="outer_noise"`: `inner_steps` × a power of 2 (e.g. 4 × inner_steps).
        outer_noise_theta (`float`, *optional*, defaults to `0.5`):
            See `inner_steps_rule`.
        switch_threshold (`float`, *optional*, defaults to `2.0`):
            γ ≥ 1 of switch mode: gradient accumulation starts once the request exceeds γ × `max_batch_size`;
            between `max_batch_size` and that, the request is capped at `max_batch_size`.
        lr_batch_scaling (`str`, *optional*, defaults to `"none"`):
            How the inner learning rate follows the batch a worker really uses, relative to
            `per_device_train_batch_size`: `"none"` (the paper), `"sqrt"` (× √(b / b₀), the rule for AdamW: a
            batch that grew then buys as much progress per token as before, in fewer steps and rounds),
            `"sqrt_adam"` (Malladi et al.'s whole square-root rule for Adam/AdamW, κ = b / b₀: lr × √κ,
            1 − β₁ and 1 − β₂ × κ, clipped so that β ≥ 0, with a warning; ε / √κ; weight decay / √κ, so that
            AdamW's decoupled decay of one step, lr × weight decay, stays what it was at b₀; needs an optimizer with
            `betas` and `eps`, SGD is refused) or `"linear"` (× b / b₀, the rule for SGD). Needs a `LambdaLR`
            schedule (every `lr_scheduler_type` but `"reduce_lr_on_plateau"` and `"greedy"`).
        memory_fraction (`float`, *optional*, defaults to `0.9`):
            Share of free accelerator memory that `max_batch_size="auto"` may plan for (divided among the workers
            that share a GPU).

        > Parameters that control failures

        processes_per_worker (`int`, *optional*, defaults to `1`):
            G, the processes of one worker: consecutive ranks of the launch form a worker whose processes train one
            model replica as ordinary data parallel (DDP over the worker's own group, every step); workers talk only
            at a round's end, local rank l of each worker sending 1/G of the pseudo-gradient. With
            `accelerate launch` on N nodes × G GPUs, G per worker makes each node a worker. The requests
            (`batch_size_cap`, `batch_size_floor`, the rounds file's `batch_size`) are per worker and multiples of
            G; each process draws 1/G of its worker's batch (`per_device_train_batch_size` keeps its meaning: the
            initial request is G × it). See `worker_layout.py`.
        worker_parallelism (`str`, *optional*, defaults to `"ddp"`):
            How a worker of `processes_per_worker` > 1 processes trains its replica: `"ddp"` (every process holds
            the whole model, gradients all-reduced inside the worker) or `"fsdp"` (FSDP2 `fully_shard` over the
            worker's processes: each holds 1/G of the weights, inner optimizer, φ and outer momentum, and all-reduces
            only its own shard's pseudo-gradient with the same shard of the other workers). `"fsdp"` needs
            `processes_per_worker` > 1 and, for now, no fp16 (bf16 works); its gradient statistics come from two
            halves of each process's batch (at least 2 samples per process), measured by local rank 0.
        worker_timeout (`float`, *optional*, defaults to `1800`):
            Seconds a worker waits for the others at the end of a round (and for any collective of AdLoCo) before
            stopping with an error that names the missing ranks and the round. Keep it above the slowest round's
            spread between workers.
        max_skipped_rounds (`int`, *optional*, defaults to `3`):
            An instance that skips more than this many rounds in a row (a NaN or inf pseudo-gradient each time)
            stops the run with `SkippedRoundsError`, naming the instance, its workers and those whose loss was not
            finite. `None` never stops (every skipped round and every merge of an instance that made no progress
            are still logged at WARNING).
        preemption_grace_seconds (`float`, *optional*, defaults to `25`):
            On SIGTERM/SIGINT (to any worker or to the launcher) training stops, saves a checkpoint and raises
            `TrainingPreempted` naming it. If the round's end is expected within this many seconds the run stops
            there; otherwise at the next step every worker can reach, inside the round (the checkpoint then holds
            each worker's own weights, so the resumed run continues the round exactly). Keep it under the time the
            scheduler leaves between SIGTERM and SIGKILL (torchrun: 30 s) minus the time a checkpoint takes.

    > [!NOTE]
    > Defaults that differ from [`~transformers.TrainingArguments`]: `save_steps=1000` (a multiple of the default
    > `inner_steps`), `eval_steps` defaults to `inner_steps`, `average_tokens_across_devices=False` (it would
    > all-gather token counts every step and couple the workers) and `ignore_data_skip=True` (the sampler restores
    > its own position). `max_steps` must be set: the data never runs out, so it defines the run's length.
    """

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
    eval_merged_model: bool = field(
        default=False,
        metadata={"help": "While several instances train, also evaluate their final merge at every evaluation."},
    )
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
    batch_size_cap: int | None = field(default=None, metadata={"help": "Upper bound on the per-worker request."})
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
    batch_size_shrink: bool = field(default=False, metadata={"help": "Let requests fall (with hysteresis)."})
    shrink_hysteresis: float = field(default=0.5, metadata={"help": "Shrink only below this fraction of the request."})
    batch_size_floor: int | None = field(default=None, metadata={"help": "Smallest request when shrinking."})
    batch_size_target: str = field(
        default="test",
        metadata={
            "help": "The norm test's request or a multiple of the noise scale.",
            "choices": list(BATCH_SIZE_TARGETS),
        },
    )
    noise_scale_multiple: float = field(default=1.0, metadata={"help": "Target = this × the noise scale."})
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
    switch_threshold: float = field(default=2.0, metadata={"help": "γ of switch mode (≥ 1)."})
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
    processes_per_worker: int = field(
        default=1, metadata={"help": "G, processes per worker (data parallel inside a worker, DiLoCo across)."}
    )
    worker_parallelism: str = field(
        default="ddp",
        metadata={
            "help": "Inside a worker of processes_per_worker > 1: 'ddp' (full replicas) or 'fsdp' (FSDP2 shards)."
        },
    )
    worker_timeout: float = field(
        default=1800.0, metadata={"help": "Seconds to wait for the other workers before stopping with an error."}
    )
    max_skipped_rounds: int | None = field(
        default=3, metadata={"help": "Stop when an instance skips more rounds than this in a row (None: never)."}
    )
    preemption_grace_seconds: float = field(
        default=25.0,
        metadata={"help": "On SIGTERM/SIGINT: stop at the round's end if it is this close, else at the next step."},
    )

    # Defaults that differ from TrainingArguments.
    save_steps: float = field(
        default=1000, metadata={"help": "Save a checkpoint every X steps (a multiple of inner_steps)."}
    )
    eval_steps: float | None = field(
        default=None, metadata={"help": "Evaluate every X steps (a multiple of inner_steps; default inner_steps)."}
    )
    average_tokens_across_devices: bool = field(
        default=False, metadata={"help": "Must stay False: it would synchronise the workers every step."}
    )
    ignore_data_skip: bool = field(
        default=True, metadata={"help": "Must stay True: the adaptive sampler restores its own position."}
    )

    def __post_init__(self):
        if self.eval_steps is None:  # every round (with a growing H, every longest round)
            self.eval_steps = self.max_inner_steps if self.inner_steps_rule == "outer_noise" else self.inner_steps
        if isinstance(self.max_batch_size, str) and self.max_batch_size.strip().isdigit():
            self.max_batch_size = int(self.max_batch_size)
        self._validate_adloco()
        refuse_what_adloco_cannot_honour(self)
        self._form_cpu_world()
        super().__post_init__()
        self._validate_schedule()
        warn_about_what_works_badly(self)

    def _form_cpu_world(self) -> None:
        """`accelerate launch --multi_gpu --num_processes N` on a machine without a GPU: without `use_cpu=True` every
        process would see a world of one and train alone into the same output_dir (DESIGN §6). The device is set up
        by `super().__post_init__()` or later, so setting `use_cpu` here forms the gloo group."""
        world_size = int(os.environ.get("WORLD_SIZE", "1"))
        if self.use_cpu or world_size <= 1 or os.environ.get("ACCELERATE_USE_CPU", "").lower() in ("1", "true"):
            return
        if not has_distributed_accelerator():
            self.use_cpu = True
            warn_once(
                f"WORLD_SIZE={world_size} and no GPU: AdLoCoConfig sets use_cpu=True so that the {world_size} "
                "processes form one gloo group on the CPU (pass use_cpu=True yourself to silence this)."
            )

    def _validate_adloco(self) -> None:
        """Checks that need nothing from TrainingArguments; each message names the field and the fix."""
        choices = {
            "merge_policy": MERGE_POLICIES,
            "merge_transport": MERGE_TRANSPORTS,
            "instance_init": INSTANCE_INITS,
            "batch_size_test": BATCH_SIZE_TESTS,
            "pseudo_grad_dtype": PSEUDO_GRAD_DTYPES,
            "outer_state_device": OUTER_STATE_DEVICES,
            "pseudo_grad_compression": PSEUDO_GRAD_COMPRESSIONS,
            "nonpositive_signal": NONPOSITIVE_SIGNAL,
            "noise_preconditioner": NOISE_PRECONDITIONERS,
            "batch_size_target": BATCH_SIZE_TARGETS,
            "merge_batch_rule": MERGE_BATCH_RULES,
            "lr_batch_scaling": LR_SCALING_RULES,
            "inner_steps_rule": INNER_STEPS_RULES,
        }
        for name, allowed in choices.items():
            if getattr(self, name) not in allowed:
                raise ValueError(f"{name}={getattr(self, name)!r} is not supported; choose one of {list(allowed)}.")
        if self.max_steps is None or self.max_steps <= 0:
            raise ValueError(
                f"max_steps={self.max_steps}: set max_steps > 0. AdLoCo's sampler never runs out of data, so the run "
                f"length is max_steps (e.g. max_steps={20 * self.inner_steps} for 20 rounds of {self.inner_steps})."
            )
        if self.gradient_accumulation_steps != 1:
            raise ValueError(
                f"gradient_accumulation_steps={self.gradient_accumulation_steps}: leave it at 1. Switch mode "
                "accumulates by itself once the requested batch exceeds switch_threshold × max_batch_size."
            )
        if int(self.inner_steps) != self.inner_steps or self.inner_steps < 1:
            raise ValueError(f"inner_steps={self.inner_steps}: set an integer >= 1 (the paper uses 200).")
        for name in ("eta", "theta", "nu"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name}={getattr(self, name)}: the test tolerances must be > 0 (e.g. eta=0.8).")
        if not self.switch_threshold >= 1:
            raise ValueError(f"switch_threshold={self.switch_threshold}: set a value >= 1 (the paper uses 2.0).")
        if not self.outer_lr > 0:
            raise ValueError(f"outer_lr={self.outer_lr}: set a value > 0 (1.0 with momentum 0 is plain averaging).")
        if not 0 <= self.outer_momentum < 1:
            raise ValueError(f"outer_momentum={self.outer_momentum}: set a value in [0, 1) (DiLoCo uses 0.9).")
        block = self.compression_block_size
        if isinstance(block, bool) or int(block) != block or block < 2 or block % 2:
            raise ValueError(
                f"compression_block_size={block}: set an even integer >= 2 (256 is the default; smaller blocks "
                "quantize more finely and send more scales)."
            )
        if self.outer_overlap_local_weight is not None and not 0 < self.outer_overlap_local_weight <= 1:
            raise ValueError(
                f"outer_overlap_local_weight={self.outer_overlap_local_weight}: set a value in (0, 1], or None "
                "(1 / M, the eager update of Kale et al.)."
            )
        if not 0 <= self.batch_size_smoothing < 1:
            raise ValueError(
                f"batch_size_smoothing={self.batch_size_smoothing}: set a value in [0, 1) (0 uses each round alone)."
            )
        if not 0 < self.shrink_hysteresis <= 1:
            raise ValueError(f"shrink_hysteresis={self.shrink_hysteresis}: set a value in (0, 1] (e.g. 0.5).")
        if self.batch_size_floor is not None and self.batch_size_floor < 1:
            raise ValueError(f"batch_size_floor={self.batch_size_floor}: set an integer >= 1, or None.")
        if not self.noise_scale_multiple > 0:
            raise ValueError(f"noise_scale_multiple={self.noise_scale_multiple}: set a value > 0 (e.g. 1.0).")
        self._validate_inner_steps_rule()
        if self.num_instances < 1:
            raise ValueError(f"num_instances={self.num_instances}: set an integer >= 1.")
        if self.merge_every < 0:
            raise ValueError(f"merge_every={self.merge_every}: set 0 (never merge) or a positive number of rounds.")
        if isinstance(self.max_batch_size, str):
            if self.max_batch_size != "auto":
                raise ValueError(f"max_batch_size={self.max_batch_size!r}: set a positive integer or 'auto'.")
        elif self.max_batch_size < 1:
            raise ValueError(f"max_batch_size={self.max_batch_size}: set a positive integer or 'auto'.")
        if self.per_device_train_batch_size < 1:
            raise ValueError(
                f"per_device_train_batch_size={self.per_device_train_batch_size}: the initial request must be >= 1."
            )
        self._validate_processes_per_worker()
        self._validate_worker_parallelism()
        g = self.processes_per_worker
        if self.batch_size_cap is not None and self.batch_size_cap < g * self.per_device_train_batch_size:
            initial = "per_device_train_batch_size=" if g == 1 else f"{g} × per_device_train_batch_size="
            raise ValueError(
                f"batch_size_cap={self.batch_size_cap} is below the initial request {initial}"
                f"{self.per_device_train_batch_size}; raise batch_size_cap or lower the initial batch."
            )
        if not self.worker_timeout > 0:
            raise ValueError(f"worker_timeout={self.worker_timeout}: set a positive number of seconds (e.g. 600).")
        if self.max_skipped_rounds is not None and self.max_skipped_rounds < 0:
            raise ValueError(f"max_skipped_rounds={self.max_skipped_rounds}: set 0 or more, or None (never stop).")
        if not 0 < self.memory_fraction <= 1:
            raise ValueError(f"memory_fraction={self.memory_fraction}: set a value in (0, 1].")
        if self.average_tokens_across_devices:
            raise ValueError(
                "average_tokens_across_devices=True would all-gather token counts every step and couple the workers; "
                "leave it False."
            )
        if not self.ignore_data_skip:
            raise ValueError("ignore_data_skip=False would replay batches on resume; leave it True.")
        if self.dataloader_num_workers != 0:
            raise ValueError(
                f"dataloader_num_workers={self.dataloader_num_workers}: set 0. The batch size changes between rounds "
                "and DataLoader worker processes would prefetch batches of the old size (pre-tokenised, packed "
                "datasets need no loader workers)."
            )
        if self.load_best_model_at_end:
            raise ValueError(
                "load_best_model_at_end=True is not supported: the final model is the merge of the instances. "
                "Set it to False and pick a checkpoint from the eval logs if needed."
            )

    def _validate_inner_steps_rule(self) -> None:
        if self.inner_steps_rule == "fixed":
            if self.max_inner_steps is not None:
                raise ValueError(
                    f"max_inner_steps={self.max_inner_steps} has no effect with inner_steps_rule='fixed': set "
                    "inner_steps_rule='outer_noise' or leave max_inner_steps unset."
                )
            return
        h, largest = self.inner_steps, self.max_inner_steps
        if largest is None or largest <= h or largest % h or (largest // h) & (largest // h - 1):
            example = 4 * h
            raise ValueError(
                f"inner_steps_rule='outer_noise' doubles H from inner_steps={h}: set max_inner_steps to inner_steps "
                f"× a power of 2 above 1 (e.g. max_inner_steps={example}), got {largest}."
            )
        if not self.outer_noise_theta > 0:
            raise ValueError(f"outer_noise_theta={self.outer_noise_theta}: set a value > 0 (e.g. 0.5).")
        if self.outer_overlap:
            raise ValueError(
                "inner_steps_rule='outer_noise' measures the workers' pseudo-gradients against their average, which "
                "outer_overlap=True only has a round later: set outer_overlap=False or inner_steps_rule='fixed'."
            )

    def _validate_worker_parallelism(self) -> None:
        if self.worker_parallelism not in WORKER_PARALLELISMS:
            raise ValueError(
                f"worker_parallelism={self.worker_parallelism!r}: choose one of {list(WORKER_PARALLELISMS)}."
            )
        if self.worker_parallelism == "fsdp" and self.processes_per_worker == 1:
            raise ValueError(
                "worker_parallelism='fsdp' shards a worker's model over its processes, but processes_per_worker=1: "
                "set processes_per_worker to the processes of a worker (e.g. the GPUs per node), or "
                "worker_parallelism='ddp'."
            )

    def _validate_processes_per_worker(self) -> None:
        """`processes_per_worker` (G): an integer >= 1 dividing the launch's processes; the per-worker requests it
        bounds are multiples of G (each process draws 1/G of its worker's batch)."""
        g = self.processes_per_worker
        if isinstance(g, bool) or int(g) != g or g < 1:
            raise ValueError(f"processes_per_worker={g}: set an integer >= 1 (1: one process per worker).")
        self.processes_per_worker = g = int(g)
        if g == 1:
            return
        world_size = int(os.environ.get("WORLD_SIZE", "1"))
        if world_size % g:
            raise ValueError(
                f"processes_per_worker={g} does not divide the {world_size} processes of this launch (WORLD_SIZE): "
                f"launch a multiple of {g} processes (accelerate launch --num_processes), or set processes_per_worker "
                f"to a divisor of {world_size} (e.g. the GPUs per node)."
            )
        for name in ("batch_size_cap", "batch_size_floor"):
            value = getattr(self, name)
            if value is not None and value % g:
                raise ValueError(
                    f"{name}={value} is not a multiple of processes_per_worker={g}: it bounds the per-worker request, "
                    f"which each of the worker's {g} processes draws 1/{g} of. Set {name} to a multiple of {g} "
                    f"(e.g. {g * max(1, round(value / g))})."
                )
        if self.outer_overlap:
            raise ValueError(
                f"outer_overlap=True is not supported with processes_per_worker={g} yet: set outer_overlap=False, or "
                "processes_per_worker=1."
            )
        if self.worker_parallelism == "fsdp":
            if self.fp16:
                raise ValueError(
                    "fp16=True is not supported with worker_parallelism='fsdp' yet (it needs a sharded gradient "
                    "scaler): set bf16=True instead, or worker_parallelism='ddp'."
                )
            # The statistics come from two halves of each process's batch, read from the synced sharded gradients
            # (grad_stats.py): a one-sample batch per process has no halves (its route through the previous step's
            # gradient is not sharded yet).
            floor = self.batch_size_floor
            if self.batch_size_test != "none" and (
                self.per_device_train_batch_size < 2 or (floor is not None and floor < 2 * g)
            ):
                raise ValueError(
                    f"batch_size_test={self.batch_size_test!r} with worker_parallelism='fsdp' measures the gradient "
                    "noise on two halves of every process's batch, which needs at least 2 samples per process: set "
                    f"per_device_train_batch_size >= 2 (it is {self.per_device_train_batch_size})"
                    + ("" if floor is None else f" and batch_size_floor >= {2 * g} (it is {floor})")
                    + ", or batch_size_test='none'."
                )

    def _validate_schedule(self) -> None:
        """Checks on save/eval schedules, after TrainingArguments normalised the strategies."""
        for kind, strategy, steps in (
            ("save", self.save_strategy, self.save_steps),
            ("eval", self.eval_strategy, self.eval_steps),
        ):
            if strategy == IntervalStrategy.EPOCH or strategy == SaveStrategy.EPOCH:
                raise ValueError(
                    f"{kind}_strategy='epoch' has no meaning with an endless sampler; use {kind}_strategy='steps' "
                    f"with {kind}_steps a multiple of inner_steps={self.inner_steps}."
                )
            if strategy != "steps":
                continue
            if steps < 1 or int(steps) != steps or int(steps) % self.inner_steps != 0:
                raise ValueError(
                    f"{kind}_steps={steps} is not a multiple of inner_steps={self.inner_steps}: workers only agree "
                    f"at the end of a round. Set {kind}_steps to k × {self.inner_steps} (e.g. {self.inner_steps})."
                )
            largest = self.max_inner_steps
            if self.inner_steps_rule == "outer_noise" and int(steps) % largest != 0:
                raise ValueError(
                    f"{kind}_steps={steps} is not a multiple of max_inner_steps={largest}: with "
                    f"inner_steps_rule='outer_noise' a round may last up to {largest} steps and workers only agree "
                    f"at its end. Set {kind}_steps to k × {largest} (e.g. {largest})."
                )

    @property
    def adloco_settings(self) -> dict:
        """The AdLoCo fields of this config, for model cards and logs."""
        names = [
            "inner_steps",
            "outer_lr",
            "outer_momentum",
            "outer_nesterov",
            "pseudo_grad_dtype",
            "pseudo_grad_compression",
            "outer_overlap",
            "outer_overlap_local_weight",
            "num_instances",
            "merge_every",
            "merge_policy",
            "merge_transport",
            "instance_init",
            "eval_merged_model",
            "batch_size_test",
            "eta",
            "theta",
            "nu",
            "max_batch_size",
            "batch_size_cap",
            "batch_size_smoothing",
            "noise_preconditioner",
            "nonpositive_signal",
            "batch_size_shrink",
            "shrink_hysteresis",
            "batch_size_floor",
            "batch_size_target",
            "noise_scale_multiple",
            "merge_batch_rule",
            "inner_steps_rule",
            "max_inner_steps",
            "outer_noise_theta",
            "switch_threshold",
            "lr_batch_scaling",
            "per_device_train_batch_size",
            "learning_rate",
            "max_steps",
        ]
        return {name: getattr(self, name) for name in names}
