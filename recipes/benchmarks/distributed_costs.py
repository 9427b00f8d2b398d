"""What AdLoCo's distributed machinery costs, measured with real workers on this machine.

    python recipes/benchmarks/distributed_costs.py                 # 4 CPU workers, tiny Llama, ~3 minutes
    python recipes/benchmarks/distributed_costs.py --workers 2 --output_dir outputs/benchmarks/costs

Measures, with 4 workers launched by `accelerate launch` (gloo on CPU):

1. inner step time with and without gradient statistics, and the outer step's cost (all per round);
2. bytes really sent per outer step (per-socket `bytes_sent` of every worker, from `ss -tinpH`) against the payload
   (parameters × dtype bytes) and the ring all-reduce model 2 (M − 1) × payload, for bf16 and fp32;
3. a merge plus redistribution: time and bytes moved (4 instances merging every round);
4. a checkpoint save with 4 workers;
5. how long the others take to notice a worker that exited or hangs (`worker_timeout`).

Prints tables and writes `distributed_costs.json` to `--output_dir`.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time


sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import free_port, socket_bytes_sent  # noqa: E402


# ---------------------------------------------------------------- worker side
def worker(spec: dict) -> None:
    import datasets
    import torch
    import torch.distributed as dist
    from transformers import LlamaConfig, LlamaForCausalLM, TrainerCallback

    import adloco_hf.callback as callback_module
    import adloco_hf.distributed as distributed_module
    from adloco_hf import AdLoCoConfig, AdLoCoTrainer
    from adloco_hf.distributed import WorkerTimeoutError

    args = AdLoCoConfig(use_cpu=True, report_to=[], disable_tqdm=True, log_level="error", **spec["config"])
    assert dist.get_world_size() == spec["world_size"]
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = LlamaForCausalLM(
        LlamaConfig(
            vocab_size=4096, hidden_size=64, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=256,
        )
    )  # fmt: skip
    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 4096, (2048, 128), generator=generator).tolist()
    data = datasets.Dataset.from_dict({"input_ids": ids, "labels": ids})
    trainer = AdLoCoTrainer(model=model, args=args, train_dataset=data)
    record = {
        "step": [],
        "stats_step": [],
        "outer": [],
        "outer_after_barrier": [],
        "outer_bytes": [],
        "merge": [],
        "save": [],
    }
    pid = os.getpid()

    class Before(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            self.start = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            duration = time.perf_counter() - self.start
            round_end = state.global_step % args.inner_steps == 0
            if state.global_step > args.inner_steps:  # skip the first round (warm-up)
                record["stats_step" if round_end else "step"].append(duration)
            self.sent = socket_bytes_sent(pid) if round_end else None
            self.end = time.perf_counter()  # after the `ss` call, which is not AdLoCo's cost

    class After(TrainerCallback):
        def __init__(self, before):
            self.before = before

        def on_step_end(self, args, state, control, **kwargs):
            if self.before.sent is None:
                return
            outer = time.perf_counter() - self.before.end
            record["outer"].append(outer)
            record["outer_after_barrier"].append(outer - record["barrier_wait_last"])
            record["outer_bytes"].append(socket_bytes_sent(pid) - self.before.sent)

    before = Before()
    trainer.callback_handler.callbacks.insert(0, before)
    trainer.add_callback(After(before))

    original_merge = callback_module.AdLoCoCallback._merge

    def timed_merge(self, instances):
        sent = socket_bytes_sent(pid)
        start = time.perf_counter()
        info = original_merge(self, instances)
        record["merge"].append(
            {
                "seconds": time.perf_counter() - start,
                "socket_bytes": socket_bytes_sent(pid) - sent,
                "bytes": info["bytes"],
            }
        )
        return info

    callback_module.AdLoCoCallback._merge = timed_merge
    original_save = AdLoCoTrainer._save_checkpoint

    def timed_save(self, model, trial):
        start = time.perf_counter()
        original_save(self, model, trial)
        record["save"].append(time.perf_counter() - start)

    AdLoCoTrainer._save_checkpoint = timed_save

    original_check = distributed_module.WorkerMonitor.check

    def timed_check(self, where, hint=""):
        record["barrier_entered"] = time.time()
        start = time.perf_counter()
        original_check(self, where, hint)
        record["barrier_wait_last"] = time.perf_counter() - start  # waiting for the slowest worker

    distributed_module.WorkerMonitor.check = timed_check

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
        record["barrier_wait"] = now - record["barrier_entered"]
        record["error"] = str(error)
    payload = sum(p.numel() for p in model.parameters())
    record.update(rank=rank, pid=pid, numel=payload)
    with open(os.path.join(spec["probe_dir"], f"rank{rank}.json"), "w") as f:
        json.dump(record, f)
    if "noticed_after" in record:
        os._exit(1)  # a failed run: the launcher then stops the lost worker too


# ---------------------------------------------------------------- launcher side
def launch(spec: dict, workers: int, timeout: int = 600) -> list[dict]:
    probe = tempfile.mkdtemp(prefix="adloco-costs-")
    spec = {**spec, "world_size": workers, "probe_dir": probe}
    spec["config"] = {"output_dir": os.path.join(probe, "run"), **spec["config"]}
    command = [
        sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", str(workers),
        "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
        "--main_process_port", str(free_port()), os.path.abspath(__file__), "--worker", json.dumps(spec),
    ]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    result = subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=env)
    reports = []
    for rank in range(workers):
        path = os.path.join(probe, f"rank{rank}.json")
        if os.path.exists(path):
            reports.append(json.load(open(path)))
    if not reports:
        raise RuntimeError(
            f"no worker report (exit {result.returncode}):\n{result.stdout[-4000:]}\n{result.stderr[-4000:]}"
        )
    return reports


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
        reports = launch({"config": {**base, "pseudo_grad_dtype": dtype, "batch_size_test": "norm"}}, P)
        numel = reports[0]["numel"]
        element = 2 if dtype == "bfloat16" else 4
        per_round = [sum(r["outer_bytes"][i] for r in reports) for i in range(len(reports[0]["outer_bytes"]))]
        step, stats_step = (
            median([t for r in reports for t in r["step"]]),
            median([t for r in reports for t in r["stats_step"]]),
        )
        outer = median([t for r in reports for t in r["outer"]])
        outer_own = median([t for r in reports for t in r["outer_after_barrier"]])
        results[dtype] = {
            "payload_bytes": numel * element,
            "ring_model_bytes": 2 * (P - 1) * numel * element,
            "measured_bytes_per_round": median(per_round),
            "step_seconds": step,
            "statistics_step_seconds": stats_step,
            "outer_step_seconds": outer,
            "outer_step_after_barrier_seconds": outer_own,
            "round_seconds": step * (H - 1) + stats_step + outer,
        }
    none = launch({"config": {**base, "batch_size_test": "none"}}, P)
    plain_step = median([t for r in none for t in r["step"] + r["stats_step"]])
    bf16 = results["bfloat16"]
    bf16["no_statistics_step_seconds"] = plain_step
    bf16["statistics_overhead_per_round"] = (bf16["statistics_step_seconds"] - plain_step) / (plain_step * H)
    bf16["outer_overhead_per_round"] = bf16["outer_step_seconds"] / (plain_step * H)

    # 3. merges: 4 instances, one merge per round.
    merges = launch(
        {"config": {**base, "num_instances": P, "merge_every": 1, "max_steps": H * P, "batch_size_test": "norm"}}, P
    )
    events = []
    for i in range(len(merges[0]["merge"])):
        events.append(
            {
                "seconds": max(r["merge"][i]["seconds"] for r in merges),
                "modelled_bytes": merges[0]["merge"][i]["bytes"],
                "socket_bytes": sum(r["merge"][i]["socket_bytes"] for r in merges),
            }
        )
    results["merges"] = events

    # 4. checkpoint saves with all workers.
    saves = launch({"config": {**base, "save_strategy": "steps", "save_steps": H}}, P)
    results["checkpoint_save_seconds"] = median(
        [max(r["save"][i] for r in saves) for i in range(len(saves[0]["save"]))]
    )

    # 5. a worker that exits, one that hangs.
    for how in (0, "hang"):
        config = {**base, "worker_timeout": cli.worker_timeout, "max_steps": H * 3}
        lost = launch({"config": config, "fail": [P - 1, H + H // 2, how]}, P)
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
        print(f"{label + f' ({unit})':34}{r['bfloat16'][key] * scale:>14.3f}{r['float32'][key] * scale:>14.3f}")
    b = r["bfloat16"]
    print(f"\nmeasured / ring model (bf16): {b['measured_bytes_per_round'] / b['ring_model_bytes']:.3f}")
    print(
        f"statistics add {100 * b['statistics_overhead_per_round']:.2f}% to a round (step without: {1e3 * b['no_statistics_step_seconds']:.2f} ms)"
    )
    print(f"outer step adds {100 * b['outer_overhead_per_round']:.2f}% to a round")
    print("\nmerges (4 instances → 1):")
    for i, m in enumerate(r["merges"], 1):
        print(
            f"  merge {i}: {1e3 * m['seconds']:.1f} ms, modelled {m['modelled_bytes'] / 1e6:.2f} MB, sockets {m['socket_bytes'] / 1e6:.2f} MB"
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
