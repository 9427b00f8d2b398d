"""Which `TrainingArguments` options AdLoCo honours: those it cannot are refused, those that work badly warn once.

Every field of `TrainingArguments` (transformers 5.23) was checked against what AdLoCo does with it:

| option | verdict | why |
|---|---|---|
| `auto_find_batch_size` | refused | AdLoCo sets the batch itself; the micro-batch limit is `max_batch_size="auto"` |
| `train_sampling_strategy` ≠ `"random"` | refused | the adaptive sampler gives each worker a random disjoint shard |
| `inner_steps > max_steps` | refused | no round would complete: no outer step, batch-size test or merge |
| `deepspeed`, `fsdp`, `parallelism_config` | refused | they shard the model; each worker trains a full copy |
| `enable_jit_checkpoint` | refused | saves at any step on SIGTERM; workers agree only at a round's end |
| `optim` = `lomo`, `adalomo`, `*_layerwise` | refused | they step inside backward: micro-batches cannot accumulate |
| `gradient_accumulation_steps`, `average_tokens_across_devices`, `ignore_data_skip`, `load_best_model_at_end`, epoch strategies | refused | (`config/checks.py`: `check_adloco`, `check_schedule`) |
| `dataloader_in_order=False` with `dataloader_num_workers > 0` | refused | batches drawn ahead are re-planned when the size changes, matched in order (`check_loader_processes`) |
| `torch_compile` (and its backend/mode) | warned | runs; the first change of batch shape recompiles once, with a dynamic batch dimension that then serves every size (measured below) |
| `ddp_find_unused_parameters`, `ddp_bucket_cap_mb`, `ddp_broadcast_buffers`, `ddp_static_graph` | warned | no DDP |
| AdLoCo's `batch_size_cap` in (`max_batch_size`, `switch_threshold` × `max_batch_size`] | warned | switch mode runs those requests as `max_batch_size`: nothing accumulates |
| `use_cpu` unset with `WORLD_SIZE > 1` and no GPU | set | (`AdLoCoConfig._form_cpu_world`) |
| `fp16=True` on a CPU | warned | the Trainer trains in float32 there (`config/environment.py`) |
| `dataloader_pin_memory=True` on a CPU | set to False | nothing to pin into; every loader warned (`config/environment.py`) |
| `report_to` an integration not installed, or unknown | refused | it failed when the trainer was built, after the data (`config/environment.py`) |
| `output_dir` a file, `resume_from_checkpoint` a file, missing or not AdLoCo's | refused | before any data is read (`config/paths.py`) |
| `max_steps` not a multiple of `inner_steps` | warned | the last round is shorter (`config/launch.py`) |
| `num_instances` > 1 on a launch of one worker | set to 1, warned | one worker trains one instance (`config/launch.py`) |
| accelerate's simple launcher asked for several processes | warned | it starts one (`config/launch.py`) |

Everything else works as in the Trainer (precision, optimizers and schedules, gradient checkpointing, logging,
reporting, evaluation, saving, the Hub, seeds, data collation).
"""

import os

import torch

from ..common.logs import get_logger


__all__ = [
    "has_distributed_accelerator",
    "refuse_what_adloco_cannot_honour",
    "warn_about_a_cap_switch_mode_never_reaches",
    "warn_about_what_works_badly",
    "warn_once",
]

# Optimizers that update a parameter inside backward, as soon as its gradient is ready: micro-batches could not
# accumulate into one step, and the gradient statistics would see a model that changes under them.
STEP_IN_BACKWARD_OPTIMIZERS = ("lomo", "adalomo")
# Accelerators accelerate forms a process group on (accelerate.state.PartialState._prepare_backend); without one,
# processes launched with WORLD_SIZE > 1 form a gloo group only with `use_cpu=True`.
_ACCELERATOR_CHECKS = ("is_xpu_available", "is_npu_available", "is_mlu_available", "is_musa_available",
                       "is_sdaa_available", "is_hpu_available", "is_neuron_available", "is_torch_xla_available")  # fmt: skip

logger = get_logger(__name__)
_warned: set[str] = set()

# Measured on 2 shared CPU cores with inductor, a 2-layer Llama, 3 runs (issue 24; the command is in
# recipes/benchmarks/gpu_bench/throughput.py's docstring): a request growing 4 → 6 → 8 → 9 → 15 → 24 → 38 (and the
# statistics step's halves of each) built 2 graphs, no graph break; the second compilation took 3.2 s (warm compile
# cache; the first run's cold compilations ~20 s each); steps at 38 ran at 1.00, 0.90 and 0.92 × the speed of a run
# compiled for 38 alone. With statistics whose groups are the micro-batches (no new shape), the hooks added no graph.
TORCH_COMPILE_NOTE = (
    "torch_compile=True works with AdLoCo, at one extra compilation: the first batch of a new shape (the halves of a "
    "round's statistics step, a request that grew, switch mode's micro-batches) recompiles once, and dynamo marks the "
    "batch dimension dynamic so that graph serves every later size (measured on a CPU: 2 graphs while a request grew "
    "4 → 38 through 7 sizes, no graph break; the dynamic graph ran at 0.90-1.00 × a graph compiled for the final "
    "size). Each compilation costs its time once (seconds for a small model, minutes for a large one on a GPU): for "
    "short runs, leave it off."
)


def warn_once(message: str) -> None:
    """A warning printed once per process, by the first worker only (every worker builds the same config)."""
    if message not in _warned and os.environ.get("RANK", "0") == "0":
        _warned.add(message)
        logger.warning(message)


def has_distributed_accelerator() -> bool:
    """Whether accelerate would form a process group on an accelerator (CUDA, XPU, NPU, ...) rather than need gloo."""
    import accelerate.utils

    return torch.cuda.is_available() or any(getattr(accelerate.utils, name, bool)() for name in _ACCELERATOR_CHECKS)


def refuse_what_adloco_cannot_honour(args) -> None:
    """TrainingArguments options AdLoCo would otherwise silently ignore or break: refused, naming what to use instead
    (checked before `TrainingArguments.__post_init__`, which would set up DeepSpeed or FSDP)."""
    if args.inner_steps > args.max_steps:
        raise ValueError(
            f"inner_steps={args.inner_steps} is more than max_steps={args.max_steps}: no round would ever complete (no "
            "outer step, no batch-size test, no merge). Set inner_steps <= max_steps (e.g. inner_steps="
            f"{max(1, args.max_steps // 10)} for 10 rounds)."
        )
    if args.auto_find_batch_size:
        raise ValueError(
            "auto_find_batch_size=True is not supported: AdLoCo sets the batch size itself (the first request is "
            "per_device_train_batch_size, the batch-size test grows it). Set it to False; the largest micro-batch "
            "that fits comes from max_batch_size='auto' (or an integer)."
        )
    if args.train_sampling_strategy != "random":
        raise ValueError(
            f"train_sampling_strategy={args.train_sampling_strategy!r} is not supported: AdLoCo's adaptive sampler "
            "gives each worker a disjoint random shard and resizes its batches between rounds. Set "
            "train_sampling_strategy='random' (and pack the data into fixed-length blocks to avoid padding)."
        )
    sharded = {"deepspeed": args.deepspeed, "fsdp": args.fsdp, "parallelism_config": args.parallelism_config}
    for name, value in sharded.items():
        if value:
            raise ValueError(
                f"{name} is not supported: it shards the model (or its gradients or optimizer states) over the "
                "processes, but every AdLoCo worker trains a full copy of the model and talks to the others once per "
                f"round. Remove {name}; to train one worker on several GPUs (data parallel inside the worker) set "
                "processes_per_worker=G instead, and worker_parallelism='fsdp' to shard its model over those G "
                "processes (FSDP2 inside the worker only); to fit memory also use bf16, gradient_checkpointing=True "
                "and max_batch_size (switch mode accumulates micro-batches)."
            )
    if args.enable_jit_checkpoint:
        raise ValueError(
            "enable_jit_checkpoint=True is not supported: it saves at whatever step each worker receives SIGTERM, "
            f"but the workers only agree at a round's end. Save every k rounds with save_steps = k × "
            f"{args.inner_steps} and resume from the last checkpoint."
        )
    optim = str(getattr(args.optim, "value", args.optim))
    if optim in STEP_IN_BACKWARD_OPTIMIZERS or optim.endswith("_layerwise"):
        raise ValueError(
            f"optim={optim!r} is not supported: it updates each parameter during backward, so switch mode's "
            "micro-batches cannot accumulate into one step. Use optim='adamw_torch' (or any optimizer that steps once "
            "per inner step)."
        )


def warn_about_what_works_badly(args) -> None:
    """Options that run but cost much or do nothing: one warning each (after TrainingArguments normalised them)."""
    if args.torch_compile:
        warn_once(TORCH_COMPILE_NOTE)
    warn_about_a_cap_switch_mode_never_reaches(args)
    for name in ("ddp_find_unused_parameters", "ddp_bucket_cap_mb", "ddp_broadcast_buffers", "ddp_static_graph"):
        if getattr(args, name) is not None and getattr(args, "processes_per_worker", 1) == 1:
            warn_once(
                f"{name}={getattr(args, name)} has no effect: AdLoCo workers train without DDP (it applies inside a "
                "worker with processes_per_worker > 1)."
            )


def warn_about_a_cap_switch_mode_never_reaches(args) -> None:
    """A `batch_size_cap` above `max_batch_size` but at most `switch_threshold` × it: switch mode runs every request
    above `max_batch_size` as `max_batch_size` samples (`batch.switch_mode.plan_batch`), so the cap works as
    `max_batch_size` and nothing is ever accumulated. Per worker: G processes run G × `max_batch_size`."""
    cap, limit = args.batch_size_cap, args.max_batch_size
    if cap is None or isinstance(limit, str):
        return
    g = getattr(args, "processes_per_worker", 1)
    fits, switch = g * limit, g * args.switch_threshold * limit
    if fits < cap <= switch:
        warn_once(
            f"batch_size_cap={cap} with max_batch_size={limit} and switch_threshold={args.switch_threshold}: switch "
            f"mode runs a request of {fits + 1} to {switch:g} samples per worker as {fits} (it accumulates only above "
            f"switch_threshold × max_batch_size = {switch:g}), so no request up to the cap is accumulated and every "
            f"worker's batch stays at most {fits}. Raise batch_size_cap above {switch:g} to let switch mode "
            f"accumulate, or set switch_threshold=1.0 to accumulate every request above {fits}."
        )
