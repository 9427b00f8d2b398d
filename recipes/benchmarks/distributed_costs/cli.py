"""What AdLoCo's distributed machinery costs, measured with real workers on this machine.

    # from the repository root
    python -m recipes.benchmarks.distributed_costs                 # 4 CPU workers, tiny Llama, ~3 minutes
    python -m recipes.benchmarks.distributed_costs --workers 2 --output_dir outputs/benchmarks/costs

Measures, with 4 workers launched by `accelerate launch` (gloo on CPU):

1. inner step time with and without gradient statistics, and the outer step's cost (all per round);
2. bytes really sent per outer step (per-socket `bytes_sent` of every worker, from `ss -tinpH`) against the payload
   (parameters × dtype bytes) and the ring all-reduce model 2 (M − 1) × payload, for bf16 and fp32;
3. a merge plus redistribution: time and bytes moved (4 instances merging every round);
4. a checkpoint save with 4 workers;
5. how long the others take to notice a worker that exited or hangs (`worker_timeout`).

Only public interfaces are used: Trainer callbacks around AdLoCo's own (one first in the Trainer's callback list, one
added after it), `trainer.adloco_state`, and the library's own timings in `adloco_rounds.jsonl` (`outer_seconds`,
`merge_seconds`, `merge_bytes`). Prints tables and writes `distributed_costs.json` to `--output_dir`.
"""

import argparse
import json
import os
import statistics
import tempfile

from adloco_hf.inspection import group_by_round, load_rounds
from adloco_hf.testing import launch_command, run_workers
from recipes.benchmarks.distributed_costs.worker import minus, worker
from recipes.benchmarks.toolkit.paths import REPO


__all__ = ["MODULE", "launch", "main", "merge_events", "parse_args", "print_tables"]

# The workers run this package again, with `--worker SPEC_JSON` (`accelerate launch --module`, from REPO).
MODULE = "recipes.benchmarks.distributed_costs"


def launch(spec: dict, workers: int, timeout: int = 600) -> tuple[list[dict], list[dict]]:
    """Run one configuration on `workers` workers; returns every worker's record and the run's round lines."""
    probe = tempfile.mkdtemp(prefix="adloco-costs-")
    spec = {**spec, "world_size": workers, "probe_dir": probe}
    spec["config"] = {"output_dir": os.path.join(probe, "run"), **spec["config"]}
    command = launch_command(MODULE, "--worker", json.dumps(spec), num_processes=workers, module=True)
    result = run_workers(command, timeout=timeout, cwd=REPO, pythonpath=[REPO], threads=1, check=False)
    output = f"{result.stdout[-4000:]}\n{result.stderr[-4000:]}"
    if result.timed_out:
        raise RuntimeError(f"the workers did not finish in {timeout}s:\n{output}")
    reports = []
    for rank in range(workers):
        path = os.path.join(probe, f"rank{rank}.json")
        if os.path.exists(path):
            reports.append(json.load(open(path)))
    if not reports:
        raise RuntimeError(f"no worker report (exit {result.returncode}):\n{output}")
    try:
        rounds = load_rounds(spec["config"]["output_dir"])
    except FileNotFoundError:  # a run that failed before its first round
        rounds = []
    return reports, rounds


def total(values):
    """The sum, or None when a value is unknown."""
    return None if any(v is None for v in values) else sum(values)


def merge_events(reports: list[dict], rounds: list[dict]) -> list[dict]:
    """One entry per merge, from the survivors' round lines and the workers' socket counts at those round ends.

    `seconds` and `modelled_bytes` are the library's own (`merge_seconds`: the slowest worker's merge, redistribution
    included; `merge_bytes`). The sockets are read around the whole round end, which also holds the round's outer
    all-reduces: `socket_bytes` takes their modelled bytes out of `round_end_socket_bytes` (all workers).
    """
    events = []
    for step, lines in group_by_round(rounds).items():
        survivor = next((line for line in lines if line["merged_from"]), None)
        if survivor is None:
            continue
        sent = total([r["outer_bytes"][r["outer_rounds"].index(step)] for r in reports])
        outer_bytes = sum(line["comm_bytes"] for line in lines) - survivor["merge_bytes"]
        events.append(
            {
                "round": step,
                "seconds": survivor["merge_seconds"],
                "modelled_bytes": survivor["merge_bytes"],
                "socket_bytes": minus(sent, outer_bytes),
                "round_end_socket_bytes": sent,
                "round_outer_modelled_bytes": outer_bytes,
            }
        )
    return events


def median(values):
    return statistics.median(values) if values else float("nan")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--inner_steps", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--worker_timeout", type=float, default=10.0)
    parser.add_argument("--output_dir", default="outputs/benchmarks/costs")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    """Measure every cost (or, with `--worker SPEC_JSON`, be one launched worker); print the tables and write
    `distributed_costs.json`."""
    cli = parse_args(argv)
    if cli.worker:
        worker(json.loads(cli.worker))
        return

    H, P = cli.inner_steps, cli.workers
    base = dict(
        inner_steps=H, max_steps=H * cli.rounds, per_device_train_batch_size=cli.batch, max_batch_size=cli.batch,
        batch_size_cap=cli.batch, batch_size_target="test", learning_rate=1e-3, optim="adamw_torch", save_strategy="no", logging_steps=10_000,
    )  # fmt: skip
    results: dict = {"workers": P, "inner_steps": H, "batch": cli.batch}

    # 1-2. steps, statistics, outer step, bytes — one instance over all workers, bf16 and fp32 all-reduce.
    for dtype in ("bfloat16", "float32"):
        reports, rounds = launch({"config": {**base, "pseudo_grad_dtype": dtype, "batch_size_test": "norm"}}, P)
        numel = reports[0]["numel"]
        element = 2 if dtype == "bfloat16" else 4
        per_round = [total([r["outer_bytes"][i] for r in reports]) for i in range(len(reports[0]["outer_bytes"]))]
        step, stats_step = (
            median([t for r in reports for t in r["step"]]),
            median([t for r in reports for t in r["stats_step"]]),
        )
        outer = median([t for r in reports for t in r["outer"]])
        # The library's own timing of the outer step (all-reduce included, slowest worker), without the wait for
        # the slowest worker at the round-end barrier and the round's bookkeeping.
        outer_own = median([line["outer_seconds"] for line in rounds])
        results[dtype] = {
            "payload_bytes": numel * element,
            "ring_model_bytes": 2 * (P - 1) * numel * element,
            "measured_bytes_per_round": None if None in per_round else median(per_round),
            "step_seconds": step,
            "statistics_step_seconds": stats_step,
            "outer_step_seconds": outer,
            "outer_step_after_barrier_seconds": outer_own,
            "round_seconds": step * (H - 1) + stats_step + outer,
        }
    none, _ = launch({"config": {**base, "batch_size_test": "none"}}, P)
    plain_step = median([t for r in none for t in r["step"] + r["stats_step"]])
    bf16 = results["bfloat16"]
    bf16["no_statistics_step_seconds"] = plain_step
    bf16["statistics_overhead_per_round"] = (bf16["statistics_step_seconds"] - plain_step) / (plain_step * H)
    bf16["outer_overhead_per_round"] = bf16["outer_step_seconds"] / (plain_step * H)

    # 3. merges: 4 instances, one merge per round.
    merges, merge_rounds = launch(
        {"config": {**base, "num_instances": P, "merge_every": 1, "max_steps": H * P, "batch_size_test": "norm"}}, P
    )
    results["merges"] = merge_events(merges, merge_rounds)

    # 4. checkpoint saves with all workers.
    saves, _ = launch({"config": {**base, "save_strategy": "steps", "save_steps": H}}, P)
    results["checkpoint_save_seconds"] = median(
        [max(r["save"][i] for r in saves) for i in range(len(saves[0]["save"]))]
    )

    # 5. a worker that exits, one that hangs.
    for how in (0, "hang"):
        config = {**base, "worker_timeout": cli.worker_timeout, "max_steps": H * 3}
        lost, _ = launch({"config": config, "fail": [P - 1, H + H // 2, how]}, P)
        noticed = [r for r in lost if "noticed_after" in r]
        results[f"lost_worker_{'exits' if how == 0 else 'hangs'}"] = {
            "noticed_after_seconds": max(r["noticed_after"] for r in noticed) if noticed else None,
            "barrier_wait_seconds": max(r["barrier_wait"] for r in noticed) if noticed else None,
            "half_round_seconds": bf16["step_seconds"] * H / 2,
            "message": next((r["error"] for r in lost if r.get("error")), None),
        }

    os.makedirs(cli.output_dir, exist_ok=True)
    with open(os.path.join(cli.output_dir, "distributed_costs.json"), "w") as f:
        json.dump(results, f, indent=2)
    print_tables(results)


def _cell(value: float | None, scale: float) -> str:
    return f"{'-':>14}" if value is None else f"{value * scale:>14.3f}"


def print_tables(r: dict) -> None:
    H, P = r["inner_steps"], r["workers"]
    print(f"\n{P} CPU workers, tiny Llama, inner_steps={H}, batch {r['batch']} per worker\n")
    print(f"{'':34}{'bfloat16':>14}{'float32':>14}")
    for key, label, scale, unit in [
        ("payload_bytes", "payload per worker", 1e-6, "MB"),
        ("ring_model_bytes", "ring model, all workers", 1e-6, "MB"),
        ("measured_bytes_per_round", "measured, all workers", 1e-6, "MB"),
        ("step_seconds", "inner step", 1e3, "ms"),
        ("statistics_step_seconds", "statistics step", 1e3, "ms"),
        ("outer_step_seconds", "outer step (with wait)", 1e3, "ms"),
        ("outer_step_after_barrier_seconds", "outer step (own work)", 1e3, "ms"),
    ]:
        print(f"{label + f' ({unit})':34}{_cell(r['bfloat16'][key], scale)}{_cell(r['float32'][key], scale)}")
    b = r["bfloat16"]
    measured = b["measured_bytes_per_round"]
    ratio = "-" if measured is None else f"{measured / b['ring_model_bytes']:.3f}"
    print(f"\nmeasured / ring model (bf16): {ratio}")
    print(
        f"statistics add {100 * b['statistics_overhead_per_round']:.2f}% to a round (step without: {1e3 * b['no_statistics_step_seconds']:.2f} ms)"
    )
    print(f"outer step adds {100 * b['outer_overhead_per_round']:.2f}% to a round")
    print(f"\nmerges ({P} instances → 1):")
    for i, m in enumerate(r["merges"], 1):
        sockets = "-" if m["socket_bytes"] is None else f"{m['socket_bytes'] / 1e6:.2f}"
        print(
            f"  merge {i}: {1e3 * m['seconds']:.1f} ms, modelled {m['modelled_bytes'] / 1e6:.2f} MB, sockets {sockets} MB"
        )
    print(f"\ncheckpoint save with {P} workers: {1e3 * r['checkpoint_save_seconds']:.0f} ms")
    for kind in ("exits", "hangs"):
        lost = r[f"lost_worker_{kind}"]
        print(
            f"worker {kind} mid-round: the others stopped {lost['noticed_after_seconds']:.1f} s later, of which "
            f"{lost['barrier_wait_seconds']:.2f} s waiting at the round-end barrier (the rest is finishing the round)"
        )
