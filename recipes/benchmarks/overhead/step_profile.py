"""The step profile behind the virtual clock's CPU device profile (`device_profile --step_profile`): seconds of one forward/backward per
micro-batch size, of an optimizer step and of an outer step's local work, measured in a bare loop (no Trainer) by
several concurrent processes, so that workers sharing cores are measured under the same contention."""

import multiprocessing
import statistics
import tempfile
import time

import torch

from adloco_hf.presets import build_model
from recipes.benchmarks.overhead.variants import Variant, run_variant
from recipes.benchmarks.toolkit.data import load_data


__all__ = ["measure_step_profile", "profile_process"]


def profile_process(job: dict) -> dict:
    """One process of the step profile: forward/backward per micro-batch size, optimizer step, outer step."""
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
        settings = {**job["settings"], "batch_size": b, "inner_steps": 20, "rounds": 1, "warmup": 5}
        tokenizer, lm = load_data(settings)
        with tempfile.TemporaryDirectory() as tmp:
            step = run_variant("trainer", Variant("trainer"), settings, tokenizer, lm["train"], tmp)[
                "ordinary_step_seconds"
            ]
        bare = statistics.median(fb[b]) if b in fb else None
        result["trainer_step_seconds"] = {str(b): step}
        if bare is not None:
            result["step_overhead_seconds"] = max(0.0, step - bare - result["optimizer_seconds"])
    return result


def measure_step_profile(
    settings: dict, vocab_size: int, sizes: list[int], processes: int, repeats: int, trainer_batch: int | None = None
) -> dict:
    """The step profile (the virtual clock's CPU device profile), from `processes` concurrent processes (median over them).

    Each process runs `settings["threads"]` torch threads; the processes start together and interleave the sizes, so
    they contend for the cores as the workers of one launch do. With `trainer_batch` (one of `sizes`), each process
    then times the plain Trainer's steps at that batch: `step_overhead_seconds` is what such a step takes beyond the
    bare forward/backward and optimizer step.
    """
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
        per_process = [profile_process(job)]
    else:
        with multiprocessing.get_context("spawn").Pool(processes) as pool:
            per_process = pool.map(profile_process, [job] * processes)
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
