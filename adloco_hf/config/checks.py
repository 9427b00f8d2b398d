"""The checks `AdLoCoConfig.__post_init__` runs: each refuses a value AdLoCo cannot train with, and its message names
the field and the fix.

`check_adloco` and the checks it calls need nothing from `TrainingArguments`' own `__post_init__` and run before
it; `check_schedule` reads the save/eval strategies it normalises and runs after it. What AdLoCo refuses of the
Trainer's own features, and what it only warns about, is in `config/compat.py`.
"""

import os

from transformers import TrainingArguments
from transformers.trainer_utils import IntervalStrategy, SaveStrategy

from .choices import WORKER_PARALLELISMS
from .timeouts import check_timeouts


__all__ = [
    "check_adloco",
    "check_fragments",
    "check_goodput",
    "check_inner_steps_rule",
    "check_loader_processes",
    "check_processes_per_worker",
    "check_schedule",
    "check_worker_parallelism",
    "resolve_batch_size_target",
]


def check_adloco(config: TrainingArguments) -> None:
    """Checks that need nothing from TrainingArguments: ranges, and what the rounds need of the Trainer's own settings
    (the types and choices are checked before, `config/types.py`)."""
    if config.max_steps is None or config.max_steps <= 0:
        raise ValueError(
            f"max_steps={config.max_steps}: set max_steps > 0. AdLoCo's sampler never runs out of data, so the run "
            f"length is max_steps (e.g. max_steps={20 * config.inner_steps} for 20 rounds of {config.inner_steps})."
        )
    if config.gradient_accumulation_steps != 1:
        raise ValueError(
            f"gradient_accumulation_steps={config.gradient_accumulation_steps}: leave it at 1. Switch mode "
            "accumulates by itself once the requested batch exceeds switch_threshold × max_batch_size."
        )
    if int(config.inner_steps) != config.inner_steps or config.inner_steps < 1:
        raise ValueError(f"inner_steps={config.inner_steps}: set an integer >= 1 (the paper uses 200).")
    for name in ("eta", "theta", "nu"):
        if not getattr(config, name) > 0:
            raise ValueError(f"{name}={getattr(config, name)}: the test tolerances must be > 0 (e.g. eta=0.8).")
    if not config.switch_threshold >= 1:
        raise ValueError(f"switch_threshold={config.switch_threshold}: set a value >= 1 (the paper uses 2.0).")
    if not config.outer_lr > 0:
        raise ValueError(f"outer_lr={config.outer_lr}: set a value > 0 (1.0 with momentum 0 is plain averaging).")
    if not 0 <= config.outer_momentum < 1:
        raise ValueError(f"outer_momentum={config.outer_momentum}: set a value in [0, 1) (DiLoCo uses 0.9).")
    block = config.compression_block_size
    if isinstance(block, bool) or int(block) != block or block < 2 or block % 2:
        raise ValueError(
            f"compression_block_size={block}: set an even integer >= 2 (256 is the default; smaller blocks "
            "quantize more finely and send more scales)."
        )
    if config.outer_overlap_local_weight is not None and not 0 < config.outer_overlap_local_weight <= 1:
        raise ValueError(
            f"outer_overlap_local_weight={config.outer_overlap_local_weight}: set a value in (0, 1], or None "
            "(1 / M, the eager update of Kale et al.)."
        )
    if not 0 <= config.batch_size_smoothing < 1:
        raise ValueError(
            f"batch_size_smoothing={config.batch_size_smoothing}: set a value in [0, 1) (0 uses each round alone)."
        )
    if not 0 < config.shrink_hysteresis <= 1:
        raise ValueError(f"shrink_hysteresis={config.shrink_hysteresis}: set a value in (0, 1] (e.g. 0.5).")
    if not 0 <= config.split_hysteresis < 1:
        raise ValueError(
            f"split_hysteresis={config.split_hysteresis}: set a value in [0, 1) (0.05 re-splits a worker's batches "
            "only when a round would end 5 % sooner)."
        )
    if config.batch_size_floor is not None and config.batch_size_floor < 1:
        raise ValueError(f"batch_size_floor={config.batch_size_floor}: set an integer >= 1, or None.")
    if not config.noise_scale_multiple > 0:
        raise ValueError(f"noise_scale_multiple={config.noise_scale_multiple}: set a value > 0 (e.g. 1.0).")
    check_goodput(config)
    check_inner_steps_rule(config)
    check_fragments(config)
    if config.num_instances < 1:
        raise ValueError(f"num_instances={config.num_instances}: set an integer >= 1.")
    if config.merge_every < 0:
        raise ValueError(f"merge_every={config.merge_every}: set 0 (never merge) or a positive number of rounds.")
    if isinstance(config.max_batch_size, str):
        if config.max_batch_size != "auto":
            raise ValueError(f"max_batch_size={config.max_batch_size!r}: set a positive integer or 'auto'.")
    elif config.max_batch_size < 1:
        raise ValueError(f"max_batch_size={config.max_batch_size}: set a positive integer or 'auto'.")
    if config.per_device_train_batch_size < 1:
        raise ValueError(
            f"per_device_train_batch_size={config.per_device_train_batch_size}: the initial request must be >= 1."
        )
    check_processes_per_worker(config)
    check_worker_parallelism(config)
    g = config.processes_per_worker
    if config.batch_size_cap is not None and config.batch_size_cap < g * config.per_device_train_batch_size:
        initial = "per_device_train_batch_size=" if g == 1 else f"{g} × per_device_train_batch_size="
        raise ValueError(
            f"batch_size_cap={config.batch_size_cap} is below the initial request {initial}"
            f"{config.per_device_train_batch_size}; raise batch_size_cap or lower the initial batch."
        )
    if not config.worker_timeout > 0:
        raise ValueError(f"worker_timeout={config.worker_timeout}: set a positive number of seconds (e.g. 600).")
    check_timeouts(config)
    if config.max_skipped_rounds is not None and config.max_skipped_rounds < 0:
        raise ValueError(f"max_skipped_rounds={config.max_skipped_rounds}: set 0 or more, or None (never stop).")
    if not 0 < config.memory_fraction <= 1:
        raise ValueError(f"memory_fraction={config.memory_fraction}: set a value in (0, 1].")
    if config.average_tokens_across_devices:
        raise ValueError(
            "average_tokens_across_devices=True would all-gather token counts every step and couple the workers; "
            "leave it False."
        )
    if not config.ignore_data_skip:
        raise ValueError("ignore_data_skip=False would replay batches on resume; leave it True.")
    check_loader_processes(config)
    if config.load_best_model_at_end:
        raise ValueError(
            "load_best_model_at_end=True is not supported: the final model is the merge of the instances. "
            "Set it to False and pick a checkpoint from the eval logs if needed."
        )


def check_loader_processes(config: TrainingArguments) -> None:
    """DataLoader worker processes prefetch batches that a change of batch size re-plans (`sampling/prefetch.py`):
    that needs the batches back in the order they were planned."""
    workers = config.dataloader_num_workers
    if int(workers) != workers or workers < 0:
        raise ValueError(f"dataloader_num_workers={workers}: set 0 (load in the training process) or more.")
    if workers > 0 and not getattr(config, "dataloader_in_order", True):
        raise ValueError(
            "dataloader_in_order=False hands batches over as the loader processes finish them, but AdLoCo re-plans "
            "the batches drawn ahead when the batch size changes and must receive them in the order it planned them; "
            "set dataloader_in_order=True."
        )
    if workers == 0 and config.dataloader_persistent_workers:
        raise ValueError(
            "dataloader_persistent_workers=True needs loader processes: set dataloader_num_workers > 0, or leave "
            "dataloader_persistent_workers False."
        )


def resolve_batch_size_target(config: TrainingArguments) -> None:
    """`batch_size_target="auto"` (the default): the goodput rule where it can run, on the norm test's statistics;
    an inner-product test's own request, or a fixed batch (`batch_size_test="none"`), where the user chose those."""
    if config.batch_size_target == "auto":
        config.batch_size_target = "goodput" if config.batch_size_test == "norm" else "test"


def check_goodput(config: TrainingArguments) -> None:
    """`batch_size_target="goodput"` reads the noise scale the statistics measure and chooses within bounds."""
    if not 0 <= config.goodput_hysteresis < 1:
        raise ValueError(
            f"goodput_hysteresis={config.goodput_hysteresis}: set a value in [0, 1) (0.05: a request changes only "
            "for a predicted gain of 5 %)."
        )
    if config.batch_size_target != "goodput":
        return
    if config.batch_size_test == "none":
        raise ValueError(
            "batch_size_target='goodput' weighs each request by the noise scale that the gradient statistics "
            "measure, which batch_size_test='none' turns off; set batch_size_test='norm'."
        )


def check_inner_steps_rule(config: TrainingArguments) -> None:
    if config.inner_steps_rule == "fixed":
        if config.max_inner_steps is not None:
            raise ValueError(
                f"max_inner_steps={config.max_inner_steps} has no effect with inner_steps_rule='fixed': set "
                "inner_steps_rule='outer_noise' or leave max_inner_steps unset."
            )
        return
    h, largest = config.inner_steps, config.max_inner_steps
    if largest is None or largest <= h or largest % h or (largest // h) & (largest // h - 1):
        example = 4 * h
        raise ValueError(
            f"inner_steps_rule='outer_noise' doubles H from inner_steps={h}: set max_inner_steps to inner_steps "
            f"× a power of 2 above 1 (e.g. max_inner_steps={example}), got {largest}."
        )
    if not config.outer_noise_theta > 0:
        raise ValueError(f"outer_noise_theta={config.outer_noise_theta}: set a value > 0 (e.g. 0.5).")
    if config.outer_overlap:
        raise ValueError(
            "inner_steps_rule='outer_noise' measures the workers' pseudo-gradients against their average, which "
            "outer_overlap=True only has a round later: set outer_overlap=False or inner_steps_rule='fixed'."
        )


def check_fragments(config: TrainingArguments) -> None:
    """Streaming DiLoCo's `num_fragments` (P), `fragment_sync_delay` (τ) and `fragment_update_alpha` (α)."""
    p, delay, alpha, h = (
        config.num_fragments,
        config.fragment_sync_delay,
        config.fragment_update_alpha,
        config.inner_steps,
    )
    if p is None:
        for name, value, default in (("fragment_sync_delay", delay, 0), ("fragment_update_alpha", alpha, 0.0)):
            if value != default:
                raise ValueError(
                    f"{name}={value} has no effect without fragments: set num_fragments (e.g. num_fragments=4) or "
                    f"leave {name} at {default}."
                )
        return
    if isinstance(p, bool) or int(p) != p or not 1 <= p <= h:
        raise ValueError(
            f"num_fragments={p}: set an integer from 1 to inner_steps={h} (every fragment is synced once per round, "
            "each after an inner step of its own), or None to sync the whole model at the round's end."
        )
    if isinstance(delay, bool) or int(delay) != delay or not 0 <= delay <= h // p:
        raise ValueError(
            f"fragment_sync_delay={delay}: set an integer from 0 to inner_steps // num_fragments = {h} // {p} = "
            f"{h // p}, so that a fragment's average arrives before the next fragment is sent."
        )
    if not 0 <= alpha <= 1:
        raise ValueError(
            f"fragment_update_alpha={alpha}: set a value in [0, 1] (0: a synced fragment takes the global weights; "
            "Streaming DiLoCo uses 0.5 with a delay)."
        )
    if config.outer_overlap:
        raise ValueError(
            "outer_overlap=True and num_fragments both overlap the outer step with the inner steps: set "
            "outer_overlap=False (fragment_sync_delay overlaps each fragment's all-reduce), or num_fragments=None."
        )
    if config.worker_batch_split == "speed":
        raise ValueError(
            "worker_batch_split='speed' weights each worker's pseudo-gradient by its samples, which the fragments' "
            "syncs do not do yet: set worker_batch_split='equal' with num_fragments, or num_fragments=None."
        )
    if config.inner_steps_rule == "outer_noise" and delay > 0:
        raise ValueError(
            "inner_steps_rule='outer_noise' compares each round's pseudo-gradients with their average, which "
            "fragment_sync_delay > 0 applies in the next round for the last fragment: set fragment_sync_delay=0 or "
            "inner_steps_rule='fixed'."
        )


def check_worker_parallelism(config: TrainingArguments) -> None:
    if config.worker_parallelism not in WORKER_PARALLELISMS:
        raise ValueError(
            f"worker_parallelism={config.worker_parallelism!r}: choose one of {list(WORKER_PARALLELISMS)}."
        )
    if config.worker_parallelism == "fsdp" and config.processes_per_worker == 1:
        raise ValueError(
            "worker_parallelism='fsdp' shards a worker's model over its processes, but processes_per_worker=1: "
            "set processes_per_worker to the processes of a worker (e.g. the GPUs per node), or "
            "worker_parallelism='ddp'."
        )


def check_processes_per_worker(config: TrainingArguments) -> None:
    """`processes_per_worker` (G): an integer >= 1 dividing the launch's processes; the per-worker requests it
    bounds are multiples of G (each process draws 1/G of its worker's batch)."""
    g = config.processes_per_worker
    if isinstance(g, bool) or int(g) != g or g < 1:
        raise ValueError(f"processes_per_worker={g}: set an integer >= 1 (1: one process per worker).")
    config.processes_per_worker = g = int(g)
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
        value = getattr(config, name)
        if value is not None and value % g:
            raise ValueError(
                f"{name}={value} is not a multiple of processes_per_worker={g}: it bounds the per-worker request, "
                f"which each of the worker's {g} processes draws 1/{g} of. Set {name} to a multiple of {g} "
                f"(e.g. {g * max(1, round(value / g))})."
            )
    if config.outer_overlap:
        raise ValueError(
            f"outer_overlap=True is not supported with processes_per_worker={g} yet: set outer_overlap=False, or "
            "processes_per_worker=1."
        )
    if config.worker_parallelism == "fsdp":
        if config.fp16:
            raise ValueError(
                "fp16=True is not supported with worker_parallelism='fsdp' yet (it needs a sharded gradient "
                "scaler): set bf16=True instead, or worker_parallelism='ddp'."
            )
        # The statistics come from two halves of each process's batch, read from the synced sharded gradients
        # (grad_stats.py): a one-sample batch per process has no halves (its route through the previous step's
        # gradient is not sharded yet).
        floor = config.batch_size_floor
        if config.batch_size_test != "none" and (
            config.per_device_train_batch_size < 2 or (floor is not None and floor < 2 * g)
        ):
            raise ValueError(
                f"batch_size_test={config.batch_size_test!r} with worker_parallelism='fsdp' measures the gradient "
                "noise on two halves of every process's batch, which needs at least 2 samples per process: set "
                f"per_device_train_batch_size >= 2 (it is {config.per_device_train_batch_size})"
                + ("" if floor is None else f" and batch_size_floor >= {2 * g} (it is {floor})")
                + ", or batch_size_test='none'."
            )


def check_schedule(config: TrainingArguments) -> None:
    """Checks on save/eval schedules, after TrainingArguments normalised the strategies."""
    for kind, strategy, steps in (
        ("save", config.save_strategy, config.save_steps),
        ("eval", config.eval_strategy, config.eval_steps),
    ):
        if strategy == IntervalStrategy.EPOCH or strategy == SaveStrategy.EPOCH:
            raise ValueError(
                f"{kind}_strategy='epoch' has no meaning with an endless sampler; use {kind}_strategy='steps' "
                f"with {kind}_steps a multiple of inner_steps={config.inner_steps}."
            )
        if strategy != "steps":
            continue
        if steps < 1 or int(steps) != steps or int(steps) % config.inner_steps != 0:
            raise ValueError(
                f"{kind}_steps={steps} is not a multiple of inner_steps={config.inner_steps}: workers only agree "
                f"at the end of a round. Set {kind}_steps to k × {config.inner_steps} (e.g. {config.inner_steps})."
            )
        largest = config.max_inner_steps
        if config.inner_steps_rule == "outer_noise" and int(steps) % largest != 0:
            raise ValueError(
                f"{kind}_steps={steps} is not a multiple of max_inner_steps={largest}: with "
                f"inner_steps_rule='outer_noise' a round may last up to {largest} steps and workers only agree "
                f"at its end. Set {kind}_steps to k × {largest} (e.g. {largest})."
            )
