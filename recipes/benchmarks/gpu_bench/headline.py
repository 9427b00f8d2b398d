"""The paper's claim on a GPU (`headline`, `headline-seed2`): a target perplexity reached sooner than with DiLoCo.

The paper's setting: 4 workers sharing one GPU (gloo: NCCL refuses two ranks on one device), `llama-50m` on fresh
tokens of `builtin:python-source` (blocks of 512, bf16, the fused AdamW). Three methods, one launch each, every one
trained for the same `budget_seconds` (evaluations excluded; each stops at the end of the first round after them,
or at 0.95 epoch of the train split, whichever comes first):

| method | what it is (`toolkit/methods.py`) |
|---|---|
| `diloco` | DiLoCo, one instance of the 4 workers, a fixed per-worker batch |
| `adloco_goodput` | AdLoCo: 4 instances merging every `merge_every` rounds, the goodput rule, switch mode |
| `adloco_norm` | the same with the paper's norm test (η = 0.8) instead of the goodput rule |

Every method evaluates every `eval_every_rounds` rounds; each curve starts at the initial model's perplexity (the
same weights for all). The result: eval perplexity against training seconds, and each method's seconds to DiLoCo's
final perplexity (first crossing, interpolated in log-perplexity), over DiLoCo's own. The issue's target: AdLoCo
there in <= 0.8 × DiLoCo's time, in one step of <= 8 minutes (3 × `budget_seconds` of training, the launches, the
evaluations and the data: `budget_seconds` is sized for that). `headline-seed2` repeats it with the next seed, in a
later stay.

    python -m recipes.benchmarks.gpu_bench.headline --step headline --results_dir DIR [--tiny]
"""

import os
import sys
import time

from recipes.benchmarks.gpu_bench.data import data_spec, timed_data
from recipes.benchmarks.gpu_bench.device import device_info
from recipes.benchmarks.gpu_bench.step_cli import finish_step, step_entry
from recipes.benchmarks.gpu_bench.workers import launch
from recipes.benchmarks.toolkit.paths import REPO
from recipes.benchmarks.toolkit.runs import prepare
from recipes.benchmarks.toolkit.settings import CPU_BASE, deep_merge
from recipes.benchmarks.toolkit.stats import first_reach, ratio


__all__ = ["METHODS", "STEPS", "headline_settings", "run", "time_to_target"]

DESCRIPTION = "The paper's claim on a GPU: AdLoCo against DiLoCo, 4 workers sharing the device, equal seconds."
STEPS = ("headline", "headline-seed2")
SEEDS = {"headline": 1, "headline-seed2": 2}
METHODS = ("diloco", "adloco_goodput", "adloco_norm")
REFERENCE = "diloco"
# On the device: 4 workers of llama-50m, batch 8 × 512 each (AdLoCo's requests grow from 8, micro-batches of at most
# 16, capped at 64), H = 25, an evaluation every 3 rounds on 256 held-out blocks. 3 × 90 s of training, each run
# stopping at the first round's end after them (a round at the cap: ~4 × a round at 8), with ~25 s a launch (4
# processes importing torch and starting CUDA), the evaluations and <= 20 s of data: ~7 of the step's 8 minutes.
FULL = {
    "preset": "llama-50m",
    "world_size": 4,
    "block_size": 512,
    "bf16": True,
    "optim": "adamw_torch_fused",
    "data": {"eval_blocks": 256},
    "train": {"batch_size": 8, "eval_batch_size": 32, "learning_rate": 1e-3, "warmup_steps": 50, "inner_steps": 25,
              "eval_every_rounds": 3},
    "adloco": {"batch_size_cap": 64, "merge_every": 2},
    "budget_seconds": 90.0,
    "epochs": 0.95,  # the token ceiling: every token fresh
    "timeout": 240,  # one launch
}  # fmt: skip
# --tiny: 2 workers of the tiny model, short blocks, rounds of 2 steps, a budget of one second (on a CPU).
TINY = deep_merge(FULL, {
    "preset": "tiny", "world_size": 2, "block_size": 32, "bf16": False, "optim": "adamw_torch",
    "data": {"eval_blocks": 32},
    "train": {"batch_size": 4, "learning_rate": 3e-3, "warmup_steps": 2, "inner_steps": 2, "eval_every_rounds": 1},
    "adloco": {"batch_size_cap": 16, "merge_every": 1},
    "budget_seconds": 1.0, "timeout": 180,
})  # fmt: skip


def headline_settings(tiny: bool, cache_dir: str, cuda: bool) -> dict:
    """The training benchmarks' shared settings with the headline's model, workers, batch, precision and data."""
    mine = TINY if tiny else FULL
    settings = deep_merge(CPU_BASE, {k: v for k, v in mine.items() if k != "data"})
    settings.update(device="cuda" if cuda else "cpu", cache_dir=cache_dir,
                    data={**data_spec(tiny, cache_dir), **mine["data"]})  # fmt: skip
    return settings


def time_to_target(runs: dict[str, dict], reference: str = REFERENCE) -> dict:
    """Each run's seconds (and tokens) to the reference's final perplexity, first crossing interpolated in
    log-perplexity between evaluations (None: never reached), and over the reference's own seconds."""
    target = runs[reference]["final_eval_ppl"]
    out = {"target_ppl": target, "reference": reference, "methods": {}}
    for method, run in runs.items():
        reached = first_reach(run["evals"], target, {"seconds": "seconds", "tokens": "tokens"})
        out["methods"][method] = {
            "seconds": None if reached is None else reached["seconds"],
            "tokens": None if reached is None else reached["tokens"],
        }
    own = out["methods"][reference]["seconds"]
    for entry in out["methods"].values():
        entry["vs_reference"] = ratio(entry["seconds"], own)
    return out


def run(step: str, results_dir: str, cache_dir: str, tiny: bool) -> str:
    started = time.perf_counter()
    import torch

    cuda = torch.cuda.is_available()
    seed = SEEDS[step]
    settings = headline_settings(tiny, cache_dir, cuda)
    data_seconds = timed_data(settings)
    initial_ppl, train_tokens = prepare(settings, seed)
    budget_tokens = int(settings.pop("epochs") * train_tokens)
    work = os.path.join(REPO, "outputs", "gpu_bench", "runs", os.path.basename(results_dir), step)
    runs = {}
    for method in METHODS:
        result = launch(method, settings, work, seed=seed, budget_tokens=budget_tokens,
                        budget_seconds=settings["budget_seconds"])  # fmt: skip
        start = {"seconds": 0.0, "tokens": 0, "inner_steps": 0, "rounds": 0, "eval_ppl": initial_ppl}
        result["evals"] = [start, *result["evals"]]
        result["stopped_by"] = "time" if result.get("stopped_by_time_at") else "tokens"
        runs[method] = result
        print(f"[{step}] {method}: final ppl {result['final_eval_ppl']:.2f} after {result['wall_seconds']:.0f} s "
              f"({result['tokens']:,} tokens, stopped by {result['stopped_by']})", flush=True)  # fmt: skip
    reach = time_to_target(runs)
    result = {"seed": seed, "initial_ppl": initial_ppl, "train_tokens": train_tokens, "budget_tokens": budget_tokens,
              "data_seconds": data_seconds, "runs": runs, "time_to_target": reach}  # fmt: skip
    return finish_step(step, results_dir, settings, result, started, device_info())


parse_args, main = step_entry(run, STEPS, DESCRIPTION)


if __name__ == "__main__":
    sys.exit(main())
