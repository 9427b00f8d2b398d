"""Steps (d) and (e) of `gpu_bench`: launches of the benchmark worker (`toolkit/worker/`: `accelerate launch`,
gloo) on one device, each method one launch; `launch` serves `headline.py` too.

(d) and (e), `workers`: DiLoCo with 4 workers sharing the device against 1 worker at the same per-worker batch, and
4-worker DiLoCo with the int4 ring (`pseudo_grad_compression="int4"`) and with the overlapped outer step
(`outer_overlap=True`) against its bf16 all-reduce: tokens/s, side by side in one step, each run `short_rounds`
rounds at the initial batch.

    python -m recipes.benchmarks.gpu_bench.workers --step workers --results_dir DIR [--tiny]
"""

import os
import sys
import time

from recipes.benchmarks.gpu_bench.data import data_spec, timed_data
from recipes.benchmarks.gpu_bench.device import device_info
from recipes.benchmarks.gpu_bench.step_cli import finish_step, step_entry
from recipes.benchmarks.toolkit.paths import REPO
from recipes.benchmarks.toolkit.runs import run_method
from recipes.benchmarks.toolkit.settings import CPU_BASE, deep_merge, method_spec


__all__ = ["STEPS", "launch", "run"]

DESCRIPTION = "Steps (d) and (e) of `gpu_bench`: launches of the benchmark worker on one device."
STEPS = ("workers",)
# On the device: a ~100 M Llama, 4 workers of batch 8 × 512 tokens, H = 50, bf16 and the fused AdamW.
FULL = {
    "preset": "llama-100m",
    "world_size": 4,
    "block_size": 512,
    "bf16": True,
    "optim": "adamw_torch_fused",
    "train": {"batch_size": 8, "eval_batch_size": 32, "learning_rate": 1e-3, "warmup_steps": 50, "inner_steps": 50,
              "eval_every_rounds": 4},
    "adloco": {"max_batch_size": 32, "batch_size_cap": 128, "merge_every": 2},
    "short_rounds": 8,  # rounds per run
    "timeout": 150,  # one launch
}  # fmt: skip
# --tiny: 2 workers of the tiny model, short blocks, rounds of 2 steps, a budget of one second (on a CPU).
TINY = deep_merge(FULL, {
    "preset": "tiny", "world_size": 2, "block_size": 32, "bf16": False, "optim": "adamw_torch",
    "train": {"batch_size": 4, "learning_rate": 3e-3, "warmup_steps": 2, "inner_steps": 2, "eval_every_rounds": 1},
    "adloco": {"max_batch_size": 8, "batch_size_cap": 16, "merge_every": 1},
    "short_rounds": 2, "timeout": 180,
})  # fmt: skip
COMM_METHODS = ("diloco", "diloco_int4", "diloco_overlap")
# --tiny: one compressed method beside the 2-worker run (each launch costs ~13 s of imports on a 2-core CPU; the
# overlapped step is the same code here, a name, and has its own tests).
TINY_COMM_METHODS = ("diloco", "diloco_int4")


def shared_settings(tiny: bool, cache_dir: str, cuda: bool) -> dict:
    """The training benchmarks' shared settings with the GPU benchmark's model, batch, precision and data."""
    mine = TINY if tiny else FULL
    settings = deep_merge(CPU_BASE, {k: v for k, v in mine.items() if k not in ("short_rounds",)})
    settings.update(device="cuda" if cuda else "cpu", cache_dir=cache_dir, data=data_spec(tiny, cache_dir))
    settings["short_rounds"] = mine["short_rounds"]
    settings["comm_methods"] = TINY_COMM_METHODS if tiny else COMM_METHODS
    return settings


def launch(
    name: str,
    settings: dict,
    folder: str,
    *,
    seed: int = 1,
    world_size: int | None = None,
    budget_tokens: int,
    budget_seconds: float | None = None,
) -> dict:
    """One launch of method `name` (`toolkit.methods.METHODS`) into `folder`, until `budget_tokens` (the method's
    own `budget_factor` does not apply: the caller's budget is the ceiling) or `budget_seconds` of training."""
    # `budget_tokens` in the settings too: `method_spec` scales it by a goodput method's `budget_factor`, which the
    # update below then overrides with the caller's budget.
    spec = method_spec(name, {**settings, "budget_tokens": budget_tokens}, folder, seed=seed)
    spec.update(method=name, output_dir=os.path.join(folder, name, f"seed-{seed}"), budget_tokens=budget_tokens,
                budget_seconds=budget_seconds)  # fmt: skip
    if world_size is not None:
        spec["world_size"] = world_size
    spec.pop("short_rounds", None)
    spec.pop("comm_methods", None)
    if "num_instances" in spec["adloco"]:  # --tiny: fewer workers than AdLoCo's 4 instances
        spec["adloco"]["num_instances"] = min(spec["adloco"]["num_instances"], spec["world_size"])
    result = run_method(name, spec, reuse=False)
    if "error" in result:
        raise SystemExit(f"{name}: the launch failed ({result['error']}); see {spec['output_dir']}/launch.log")
    keep = ("final_eval_ppl", "tokens", "steps", "rounds", "wall_seconds", "tokens_per_second", "comm_bytes",
            "epochs", "max_worker_epochs", "peak_memory_bytes", "world_size", "parameters", "stopped_by_time_at",
            "budget_reached", "launch_seconds", "batch_sizes", "instances", "eval_seconds", "curve_kind")  # fmt: skip
    run = {key: result.get(key) for key in keep}
    run["name"], run["seed"] = name, seed
    run["evals"] = [{k: p.get(k) for k in ("tokens", "seconds", "inner_steps", "rounds", "eval_ppl")}
                    for p in result.get("evals", [])]  # fmt: skip
    return run


def short_budget(settings: dict, world_size: int) -> int:
    """Tokens of `short_rounds` rounds of `world_size` workers at the initial batch ((d) and (e))."""
    train = settings["train"]
    return settings["short_rounds"] * train["inner_steps"] * world_size * train["batch_size"] * settings["block_size"]


def workers(settings: dict, work: str) -> dict:
    """(d) DiLoCo on 4 workers and on 1 (the same per-worker batch); (e) the int4 ring and the overlapped outer step
    against the bf16 all-reduce of the 4-worker run."""
    world = settings["world_size"]
    budget = short_budget(settings, world)
    runs = [launch("diloco", settings, os.path.join(work, "all"), budget_tokens=budget),
            launch("diloco", settings, os.path.join(work, "one"), world_size=1, budget_tokens=short_budget(settings, 1)),
            *(launch(name, settings, work, budget_tokens=budget) for name in settings["comm_methods"][1:])]  # fmt: skip
    runs[0]["name"], runs[1]["name"] = f"diloco, {world} workers", "diloco, 1 worker"
    bf16 = runs[0]["tokens_per_second"]
    for run in runs:
        run["ratio_to_bf16"] = None if run["world_size"] != world else run["tokens_per_second"] / bf16
    return {"runs": runs, "ratio": bf16 / runs[1]["tokens_per_second"]}


def run(step: str, results_dir: str, cache_dir: str, tiny: bool) -> str:
    started = time.perf_counter()
    import torch

    settings = shared_settings(tiny, cache_dir, torch.cuda.is_available())
    data_seconds = timed_data(settings)
    work = os.path.join(REPO, "outputs", "gpu_bench", "runs", os.path.basename(results_dir), step)
    result = {**workers(settings, work), "data_seconds": data_seconds}
    return finish_step(step, results_dir, settings, result, started, device_info())


parse_args, main = step_entry(run, STEPS, DESCRIPTION)


if __name__ == "__main__":
    sys.exit(main())
