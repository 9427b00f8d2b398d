"""Launching a training benchmark's methods: the data built once and the initial perplexity (`prepare`), one
method's `accelerate launch` of the benchmark worker (`launch`, `run_method`), and the cgroup of its slow workers.

Each method is one launch of `WORKER_MODULE` (`worker/`) with its spec (`settings.method_spec`) as `spec.json` in its
folder; the worker writes `result.json` there once every worker has trained and reported.
"""

import contextlib
import json
import os

import torch

from adloco_hf.testing import launch_command, run_workers
from recipes.benchmarks.toolkit.data import load_data, make_model, perplexity
from recipes.benchmarks.toolkit.methods import METHODS
from recipes.benchmarks.toolkit.paths import OFFLINE, REPO
from recipes.benchmarks.toolkit.results import human_bytes, write_json
from recipes.benchmarks.toolkit.testbeds import cgroups


__all__ = ["LOCATION_KEYS", "WORKER_MODULE", "launch", "prepare", "run_method", "runnable", "same_run", "slow_group"]

# Launched as a module from the repository root (`accelerate launch --module`): no path edits in the workers.
WORKER_MODULE = "recipes.benchmarks.toolkit.worker"


def prepare(settings: dict, seed: int) -> tuple[float, int]:
    """Build the tokenizer and packed data into the cache (the workers then only load them); return the initial
    model's eval perplexity for `seed`'s weights (the curves' first point: every method starts from them) and the
    tokens of the train split."""
    tokenizer, lm = load_data(settings)
    train_tokens = len(lm["train"]) * settings["block_size"]
    model = make_model({**settings, "seed": seed}, tokenizer).to(settings["device"])
    ppl = perplexity(model, lm["eval"], settings["train"]["eval_batch_size"], settings["device"])
    del model
    if settings["device"] == "cuda":
        torch.cuda.empty_cache()  # the workers need the memory; this process keeps only its CUDA context
    return ppl, train_tokens


def launch(spec: dict, log_path: str) -> tuple[int, float]:
    """Run the workers of one method; returns (exit code, seconds). Kills the whole launch on timeout (exit 124).
    A method with `slow_workers` runs inside a cgroup with a CPU quota, made for this launch and removed after it
    (`cgroups.py`); its ranks join it themselves."""
    command = launch_command(
        WORKER_MODULE, os.path.join(spec["output_dir"], "spec.json"), num_processes=spec["world_size"], module=True
    )
    with slow_group(spec) as slow_env:
        result = run_workers(
            command,
            timeout=spec["timeout"],
            env={**OFFLINE, **slow_env},
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
    with cgroups.cpu_quota_group(slow["cores"]) as procs:
        yield {cgroups.ENV_PROCS: procs, cgroups.ENV_RANKS: ",".join(map(str, ranks))}


def runnable(names: list[str]) -> tuple[list[str], str | None]:
    """The methods that can run here, and why the others cannot: a slow worker needs a cgroup with a CPU quota."""
    if not any(METHODS[n].get("slow_workers") for n in names):
        return names, None
    try:
        cgroups.cpu_controller()
    except cgroups.CgroupUnavailable as error:
        return [n for n in names if not METHODS[n].get("slow_workers")], str(error)
    return names, None


# Where a run's folder and the data cache lie: neither changes what the run trains (the spec's `data` names the
# corpus and tokenizer), so a run folder copied or a cache spelt another way is still the same run.
LOCATION_KEYS = ("output_dir", "cache_dir")


def same_run(earlier: dict, spec: dict) -> bool:
    """Whether an earlier run's spec trains what `spec` trains: equal but for `LOCATION_KEYS`."""

    def trained(s: dict) -> dict:
        return {key: value for key, value in s.items() if key not in LOCATION_KEYS}

    return trained(earlier) == trained(spec)


def run_method(name: str, spec: dict, reuse: bool) -> dict:
    """Launch one method with `spec` (written to its folder's `spec.json`) and return the worker's `result.json`, or
    `{"error": ...}` when the launch wrote none. `reuse`: an unchanged spec's earlier result is returned as it is."""
    folder = spec["output_dir"]
    name = f"{name} seed {spec['seed']}"
    result_path = os.path.join(folder, "result.json")
    spec_path = os.path.join(folder, "spec.json")
    if reuse and os.path.exists(result_path) and os.path.exists(spec_path):
        with open(spec_path, encoding="utf-8") as f:
            if same_run(json.load(f), spec):
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
