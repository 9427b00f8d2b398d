"""Configuration of AdLoCo training: `TrainingArguments` plus the rounds, instances and batch-size test."""

import datetime
import os
from dataclasses import dataclass, field

import torch
from transformers import TrainingArguments

from .checks import check_adloco, check_schedule, resolve_batch_size_target
from .compat import (
    has_distributed_accelerator,
    refuse_what_adloco_cannot_honour,
    warn_once,
)
from .environment import check_environment
from .field_names import refuse_unknown_fields
from .fields import BatchFields, InstanceFields, RoundFields, WorkerFields
from .launch import fit_instances_to_one_worker, warn_about_a_last_round_cut_short, warn_about_one_process_of_several
from .restart import form_world_for_this_attempt
from .timeouts import resolve_peer_timeout
from .types import check_types


__all__ = ["AdLoCoConfig"]


# The groups are listed last-first: a dataclass orders inherited fields from the base-most class on, so `--help` lists
# TrainingArguments' fields, then the rounds', the instances', the batch's and the workers' (the docstring's order).
@dataclass
class AdLoCoConfig(WorkerFields, BatchFields, InstanceFields, RoundFields, TrainingArguments):
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
            worker's own progress and takes the others' one round late (measured best: see
            docs/communication.md); None is 1 / M, the eager update of Kale et al. (2025).
        num_fragments (`int`, *optional*, defaults to `None`):
            Streaming DiLoCo (Douillard et al., 2025): the model, flat in parameter order, is cut into P contiguous
            fragments of equal size, and fragment p is synced after inner step ⌊p·H/P⌋ of every round (fragment 0 at
            the round's end), each with its own outer SGD state; each sync sends 1/P of the model, so the links' peak
            falls P-fold. None (the default) syncs the whole model at the round's end; 1 is that schedule through the
            fragments' path.
        fragment_sync_delay (`int`, *optional*, defaults to `0`):
            τ: inner steps between sending a fragment's pseudo-gradient and applying its average, during which the
            all-reduce runs beside training (at most inner_steps // num_fragments).
        fragment_update_alpha (`float`, *optional*, defaults to `0.0`):
            α in [0, 1]: a synced fragment's weights become (1 − α) × its new global weights + α × the local weights
            that trained on during the delay (0: the global weights).

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
            `"all_reduce"`: one weighted all-reduce over the survivor's workers after the merge (each worker of
            the merging instances adds its instance's merge weight / its number of workers × its φ and momentum;
            one that moves elsewhere hands that to a member instead), a broadcast of an instance's state to each
            worker that moves into it from elsewhere, every worker keeping its own AdamW state; 2 (n − 1) P bytes
            over the n members, P per worker that leaves, ≤ 3 P of link time. `"point_to_point"`: blocking
            sends in one order, which also hand the first worker's AdamW state to each worker that joins an
            instance; ≈ n P of link time on the survivor's first worker, plus ≈ P per joining worker.
        merge_payload (`str`, *optional*, defaults to `"float32"`):
            What an all-reduce merge sends: `"float32"` weights and outer momenta (8 bytes a parameter), or
            `"compact"`: weights in bfloat16 and the momentum as int8 blocks of `compression_block_size` (about 3
            bytes a parameter; `instances/payload.py`). Point-to-point merges send float32.
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
            Switch mode accumulates only requests above `switch_threshold` × `max_batch_size`; with a cap between
            `max_batch_size` and that, every larger request runs as `max_batch_size` samples (a warning says so).
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
            Let a request fall, when the test asks for less than `shrink_hysteresis` × it, or when the goodput
            rule finds a smaller one better (never below `batch_size_floor`); without it no request shrinks. Either
            way, a merge with `merge_batch_rule="preserve_total"` lowers the per-worker request of an instance that
            gains workers (it keeps the instance's total batch).
        shrink_hysteresis (`float`, *optional*, defaults to `0.5`):
            See `batch_size_shrink`; in (0, 1].
        batch_size_floor (`int`, *optional*):
            The smallest request shrinking may reach (default: `per_device_train_batch_size`).
        batch_size_target (`str`, *optional*, defaults to `"auto"`):
            `"auto"` is `"goodput"` with the norm test (the default `batch_size_test`) and `"test"` with any other
            test (the inner-product tests' requests; `"none"`: a fixed batch); it is resolved when the config is
            built, so the config, its JSON and a checkpoint's settings hold the rule that ran. The goodput rule ended
            below the norm test's perplexity in every paired comparison; against a fixed batch it wins or loses by
            regime, each figure with its baseline in docs/choosing_settings.md; the paper's norm test is
            `batch_size_target="test"`.
            `"test"`: the request is the norm test's; `"noise_scale"`: `noise_scale_multiple` × the estimated
            noise scale tr Σ / ‖∇F‖² (the norm test's own fixed point is (1 − η²) / η² of it, 0.56 at η = 0.8);
            `"goodput"`: the request from `batch_size_floor` up of the highest goodput, throughput ×
            statistical efficiency (Pollux): the throughput from the step times the run measures (switch mode's
            passes included) with the round's outer step spread over its inner steps, the efficiency
            (B_noise + M b₀) / (B_noise + M b) of the instance's M workers from the smoothed noise scale
            (`batch/goodput.py`). Requests only grow unless `batch_size_shrink=True` (then they may fall to
            `batch_size_floor`); needs a measuring `batch_size_test` (not `"none"`). `batch_size_cap` bounds the
            choice where set; without it the rule bounds its own search where no larger request can win: past it
            even a step with no fixed costs could not make up for the samples' lower worth
            (`GoodputModel.request_bound`).
        noise_scale_multiple (`float`, *optional*, defaults to `1.0`):
            See `batch_size_target`.
        goodput_hysteresis (`float`, *optional*, defaults to `0.05`):
            `batch_size_target="goodput"` moves a request only when the best one's predicted goodput beats keeping
            it by this fraction (AdaptDL's users asked for 5 %); in [0, 1).
        goodput_timing (`str`, *optional*, defaults to `"startup"`):
            Where the goodput rule's costs come from. `"startup"`: a profile measured before the first round (passes
            at several micro-batch sizes, two all-reduces, one gradient-statistics estimate; training is unchanged by
            it: `batch/startup_profile.py`), cached (`$ADLOCO_HF_CACHE`, else `~/.cache/adloco_hf`) and checkpointed:
            the first request is already the best one and a run is repeatable from its seed. `"startup_live"`: then
            every round's timings too; `"live"`: the rounds' alone, from the initial request. Both live modes read
            step times that differ between runs: a seed's runs, and a resumed one, may take other batches.
        merge_batch_rule (`str`, *optional*, defaults to `"preserve_total"`):
            `"paper"`: a merged instance keeps its per-worker request while gaining workers (its total grows);
            `"preserve_total"`: every instance keeps its total batch across a merge (per-worker ⌈total / workers⌉),
            and demand and merge weights count the samples actually processed in the round.
        inner_steps_rule (`str`, *optional*, defaults to `"fixed"`):
            `"fixed"`: every round has `inner_steps` inner steps; `"outer_noise"`: the next round has twice as many
            (up to `max_inner_steps`) when the workers' pseudo-gradients agreed: their variance over M ‖Δ̄‖² (the
            rounds file's `outer_noise`, averaged over instances by workers) is at most `outer_noise_theta²`. Round
            ends stay at multiples of the round's H, so `save_steps`/`eval_steps` must be multiples of
            `max_inner_steps`. Needs blocking outer steps (not `outer_overlap`, nor `fragment_sync_delay` > 0).
        max_inner_steps (`int`, *optional*):
            The largest H of `inner_steps_rule="outer_noise"`: `inner_steps` × a power of 2 (e.g. 4 × inner_steps).
        outer_noise_theta (`float`, *optional*, defaults to `0.5`):
            See `inner_steps_rule`.
        switch_threshold (`float`, *optional*, defaults to `2.0`):
            γ ≥ 1 of switch mode: gradient accumulation starts once the request exceeds γ × `max_batch_size`;
            between `max_batch_size` and that, the request is capped at `max_batch_size` (runs as that many
            samples). `1.0` accumulates every request above `max_batch_size`.
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
        worker_batch_split (`str`, *optional*, defaults to `"equal"`):
            How an instance's batch per inner step is split among its workers: `"equal"` (every worker runs the
            request) or `"speed"`: at every round's end, each worker's share of the instance's total (the request ×
            its workers, as switch mode runs it) follows its measured seconds per sample over the round, so that the
            round ends when the average worker finishes, not the slowest. Shares are integers (multiples of
            `processes_per_worker`, at least one sample per process, at most a worker's data shard) and run whole,
            accumulated in micro-batches above `max_batch_size`; the pseudo-gradients are averaged with each worker
            weighted by the samples it trained (the plain mean when the shares are equal); the learning rate follows
            the request, the same on all of an instance's workers. The rounds file logs every worker's share and
            speed (`worker_batch_sizes`, `worker_sample_seconds`); the split is in the checkpoints.
        split_hysteresis (`float`, *optional*, defaults to `0.05`):
            With `worker_batch_split="speed"`: the split changes only when the new one would end a round sooner by
            more than this share of the current one's predicted time, in [0, 1).

        > Parameters that control failures

        processes_per_worker (`int`, *optional*, defaults to `1`):
            G, the processes of one worker: consecutive ranks of the launch form a worker whose processes train one
            model replica as ordinary data parallel (DDP over the worker's own group, every step); workers talk only
            at a round's end, local rank l of each worker sending 1/G of the pseudo-gradient. With
            `accelerate launch` on N nodes × G GPUs, G per worker makes each node a worker. The requests
            (`batch_size_cap`, `batch_size_floor`, the rounds file's `batch_size`) are per worker and multiples of
            G; each process draws 1/G of its worker's batch (`per_device_train_batch_size` keeps its meaning: the
            initial request is G × it). See `common/layout.py`.
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
            spread between workers, and at most `ddp_timeout` (refused otherwise). A machine whose link dies is
            named after it: docs/faults.md#timeouts.
        peer_timeout (`float`, *optional*, defaults to `None`):
            Seconds a worker's pulse (a counter it moves in the job's store every second, whatever its main thread
            does) may stand still before the workers waiting for it name it dead and end with exit code 75, so that
            their launcher restarts the run from the newest checkpoint: a dead machine or link is named within it,
            while a long transfer still waits up to `worker_timeout`. A link's outage shorter than half of it costs
            nothing. `None` (the default) resolves when the config is built: 45 where `worker_timeout` is above 60,
            else 0 (off: `worker_timeout` names a lost worker within a minute itself). At least 3 when on, and at
            most `worker_timeout` (refused otherwise).
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
        check_types(self)  # first: every check below compares numbers and choices (config/types.py)
        resolve_batch_size_target(self)
        resolve_peer_timeout(self)
        if self.eval_steps is None:  # every round (with a growing H, every longest round)
            self.eval_steps = self.max_inner_steps if self.inner_steps_rule == "outer_noise" else self.inner_steps
        check_adloco(self)
        refuse_what_adloco_cannot_honour(self)
        self._form_cpu_world()
        self._form_world_for_this_attempt()
        super().__post_init__()
        check_schedule(self)
        check_environment(self)  # output_dir, resume_from_checkpoint, report_to, the device: config/environment.py
        fit_instances_to_one_worker(self)  # `python train.py` trains one instance (config/launch.py)
        warn_about_one_process_of_several()
        warn_about_a_last_round_cut_short(self)

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

    def _form_world_for_this_attempt(self) -> None:
        """Under an elastic launcher that shares its store (torchrun, `accelerate launch --max_restarts`), form the
        default group on this restart attempt's own namespace of the store, before accelerate forms it on the shared
        one where a restarted run reads the dead attempt's addresses (`config/restart.py`); and a CPU world on a store
        of its own, with `ddp_timeout`, which transformers leaves out there. The backend is the one accelerate would
        pick; on an accelerator other than CUDA, accelerate forms the group as before."""
        cpu = self.use_cpu or os.environ.get("ACCELERATE_USE_CPU", "").lower() in ("1", "true")
        backend = self.ddp_backend or ("gloo" if cpu or not has_distributed_accelerator() else None)
        if backend is None and torch.cuda.is_available():
            backend = "nccl"
        if backend is not None:
            timeout = datetime.timedelta(seconds=self.ddp_timeout)
            form_world_for_this_attempt(backend=backend, timeout=timeout, cpu=cpu)

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
            "num_fragments",
            "fragment_sync_delay",
            "fragment_update_alpha",
            "num_instances",
            "merge_every",
            "merge_policy",
            "merge_transport",
            "merge_payload",
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
            "goodput_hysteresis",
            "goodput_timing",
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


AdLoCoConfig.__init__ = refuse_unknown_fields(AdLoCoConfig.__init__, AdLoCoConfig)
