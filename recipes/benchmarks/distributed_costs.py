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
import time

from adloco_hf.reporting.run_log import group_by_round
from adloco_hf.testing import launch_command, run_workers
from recipes.benchmarks._common import REPO, socket_bytes_sent


# The workers run this module again, with `--worker SPEC_JSON` (`accelerate launch --module`, from REPO).
MODULE = "recipes.benchmarks.distributed_costs"


def _minus(after: int | None, before: int | None) -> int | None:
    return None if after is None or before is None else after - before


# ---------------------------------------------------------------- worker side
def worker(spec: dict) -> None:
    import datasets
    import torch
    import torch.distributed as dist
    from transformers import TrainerCallback

    from adloco_hf import AdLoCoConfig, AdLoCoTrainer
    from adloco_hf.common.distributed import WorkerTimeoutError
    from adloco_hf.testing import tiny_llama

    args = AdLoCoConfig(use_cpu=True, report_to=[], disable_tqdm=True, log_level="error", **spec["config"])
    assert dist.get_world_size() == spec["world_size"]
    rank = dist.get_rank()
    model = tiny_llama(
        seed=0, vocab_size=4096, hidden_size=64, intermediate_size=256, layers=2, max_position_embeddings=256
    )
    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 4096, (2048, 128), generator=generator).tolist()
    data = datasets.Dataset.from_dict({"input_ids": ids, "labels": ids})
    trainer = AdLoCoTrainer(model=model, args=args, train_dataset=data)
    record = {"step": [], "stats_step": [], "outer": [], "outer_bytes": [], "outer_rounds": [], "save": []}
    pid = os.getpid()

    class Before(TrainerCallback):
        """First in the callback list: its `on_step_end` runs before AdLoCo's ends the round."""

        def on_step_begin(self, args, state, control, **kwargs):
            self.start = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            duration = time.perf_counter() - self.start
            round_end = state.global_step % args.inner_steps == 0
            if state.global_step > args.inner_steps:  # skip the first round (warm-up)
                record["stats_step" if round_end else "step"].append(duration)
            self.sent = socket_bytes_sent(pid) if round_end else None
            self.end = time.perf_counter()  # after the `ss` call, which is not AdLoCo's cost
            if round_end:
                record["round_end_reached"] = time.time()  # from here on, waiting for the round-end barrier

        def on_save(self, args, state, control, **kwargs):
            # The Trainer saves right after `on_step_end` (no logging or evaluation at these steps) and then calls
            # `on_save`: the time since the last callback's `on_step_end` is the save.
            record["save"].append(time.perf_counter() - after.step_end)

    class After(TrainerCallback):
        """Added last: its `on_step_end` runs after AdLoCo's has closed the round."""

        def __init__(self, before):
            self.before = before
            self.step_end = 0.0

        def on_step_end(self, args, state, control, **kwargs):
            if self.before.sent is not None and trainer.adloco_state.last_round_step == state.global_step:
                record["outer"].append(time.perf_counter() - self.before.end)
                record["outer_bytes"].append(_minus(socket_bytes_sent(pid), self.before.sent))
                record["outer_rounds"].append(trainer.adloco_state.rounds)
            self.step_end = time.perf_counter()

    before = Before()
    after = After(before)
    trainer.callback_handler.callbacks.insert(0, before)
    trainer.add_callback(after)

    fail = spec.get("fail")
    if fail is not None:
        fail_rank, fail_step, how = fail

        class Fail(TrainerCallback):
            def on_step_begin(self, args, state, control, **kwargs):
                if rank == fail_rank and state.global_step == fail_step:
                    with open(os.path.join(spec["probe_dir"], "failed_at"), "w") as f:
                        f.write(str(time.time()))
                    if how == "hang":
                        time.sleep(3600)
                    os._exit(0)

        trainer.add_callback(Fail())
    try:
        trainer.train()
    except WorkerTimeoutError as error:
        failed_at = float(open(os.path.join(spec["probe_dir"], "failed_at")).read())
        now = time.time()
        record["noticed_after"] = now - failed_at
        record["barrier_wait"] = now - record["round_end_reached"]
        record["error"] = str(error)
    payload = sum(p.numel() for p in model.parameters())
    record.update(rank=rank, pid=pid, numel=payload)
    with open(os.path.join(spec["probe_dir"], f"rank{rank}.json"), "w") as f:
        json.dump(record, f)
    if "noticed_after" in record:
        os._exit(1)  # a failed run: the launcher then stops the lost worker too


# ---------------------------------------------------------------- launcher side
def launch(spec: dict, workers: int, timeout: int = 600) -> tuple[list[dict], list[dict]]:
    """Run one configuration on `workers` workers; returns every worker's record and the run's round lines."""
    from adloco_hf.reporting.run_log import load_rounds

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


def _total(values):
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
        sent = _total([r["outer_bytes"][r["outer_rounds"].index(step)] for r in reports])
        outer_bytes = sum(line["comm_bytes"] for line in lines) - survivor["merge_bytes"]
        events.append(
            {
                "round": step,
                "seconds": survivor["merge_seconds"],
                "modelled_bytes": survivor["merge_bytes"],
                "socket_bytes": _minus(sent, outer_bytes),
                "round_end_socket_bytes": sent,
                "round_outer_modelled_bytes": outer_bytes,
            }
        )
    return events


def median(values):
    return statistics.median(values) if values else float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--inner_steps", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--worker_timeout", type=float, default=10.0)
    parser.add_argument("--output_dir", default="outputs/benchmarks/costs")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    cli = parser.parse_args()
    if cli.worker:
        worker(json.loads(cli.worker))
        return

    H, P = cli.inner_steps, cli.workers
    base = dict(
        inner_steps=H, max_steps=H * cli.rounds, per_device_train_batch_size=cli.batch, max_batch_size=cli.batch,
        batch_size_cap=cli.batch, learning_rate=1e-3, optim="adamw_torch", save_strategy="no", logging_steps=10_000,
    )  # fmt: skip
    results: dict = {"workers": P, "inner_steps": H, "batch": cli.batch}

    # 1-2. steps, statistics, outer step, bytes — one instance over all workers, bf16 and fp32 all-reduce.
    for dtype in ("bfloat16", "float32"):
        reports, rounds = launch({"config": {**base, "pseudo_grad_dtype": dtype, "batch_size_test": "norm"}}, P)
        numel = reports[0]["numel"]
        element = 2 if dtype == "bfloat16" else 4
        per_round = [_total([r["outer_bytes"][i] for r in reports]) for i in range(len(reports[0]["outer_bytes"]))]
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


if __name__ == "__main__":
    main()
