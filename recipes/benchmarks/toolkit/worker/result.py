"""Rank 0's `result.json`: every worker's figures combined (tokens, bytes modelled and measured, wall time without
the evaluations, the eval curves, per-round figures from the run's rounds file)."""

import os

import torch

from adloco_hf.inspection import load_rounds
from recipes.benchmarks.toolkit.results import write_json
from recipes.benchmarks.toolkit.worker.trainers import CURVE_SOURCES


__all__ = ["adloco_rounds", "curve_kind", "shard_epochs", "write_result"]


def shard_epochs(sampler) -> float:
    """How many passes over its own shard this worker's sampler has drawn (1.0 = every sample once)."""
    return sampler.epoch + sampler.position / sampler.shard_size


def adloco_rounds(output_dir: str) -> list[dict]:
    """Per round: tokens so far, instances, per-worker batch sizes, bytes of the round (from adloco_rounds.jsonl)."""
    by_round: dict[int, list[dict]] = {}
    for line in load_rounds(output_dir):
        by_round.setdefault(line["outer_step"], []).append(line)
    rounds, previous_step = [], 0
    for step in sorted(by_round):
        lines = by_round[step]
        workers = sum(len(line["workers"]) for line in lines)
        steps = lines[0]["global_step"] - previous_step
        previous_step = lines[0]["global_step"]
        # What the workers really ran (switch mode caps a request between max_batch_size and γ × max_batch_size).
        used = {str(line["instance"]): line["samples"] / (len(line["workers"]) * steps) for line in lines}
        rounds.append(
            {
                "outer_step": step,
                "global_step": lines[0]["global_step"],
                "total_tokens": lines[0]["total_tokens"],
                "num_instances": lines[0]["num_instances"],
                "instances_trained": len(lines),
                "requested_batch_sizes": {str(line["instance"]): line["batch_size"] for line in lines},
                "batch_sizes": used,
                "mean_batch_size": sum(line["samples"] for line in lines) / (workers * steps),
                "accumulation_steps": {str(line["instance"]): line["accumulation_steps"] for line in lines},
                "comm_bytes": sum(line["comm_bytes"] for line in lines),
                # The library's timings (slowest worker of each instance), the round's slowest instance: the outer
                # step as the worker waited for it (pseudo-gradient, all-reduce, outer SGD; with outer_overlap the
                # wait for the background all-reduce), its whole outer step, and the merge.
                "comm_seconds": max((line.get("comm_seconds") or 0.0) for line in lines),
                "outer_seconds": max((line.get("outer_seconds") or 0.0) for line in lines),
                "merge_seconds": sum((line.get("merge_seconds") or 0.0) for line in lines),
                "merged": any(line["merged_from"] for line in lines),
                # Each instance's workers: the samples each trained per inner step, its seconds per sample.
                "worker_batch_sizes": {str(line["instance"]): line.get("worker_batch_sizes") for line in lines},
                "worker_sample_seconds": {str(line["instance"]): line.get("worker_sample_seconds") for line in lines},
                "elapsed_seconds": lines[0].get("elapsed_seconds"),
            }
        )
    return rounds


def write_result(spec, args, trainer, everyone, *, tokens_per_step: int, ddp_step_bytes: int) -> None:
    """Global rank 0: combine every worker's numbers into `{output_dir}/result.json`."""
    kind, world = spec["kind"], spec["world_size"]
    numel = sum(p.numel() for p in trainer.model.parameters() if p.requires_grad)

    def total(values):
        return None if any(v is None for v in values) else int(sum(values))

    points = trainer.bench_points
    for i, point in enumerate(points):
        point["measured_bytes"] = total([r["points"][i] for r in everyone])
        del point["measured_bytes_local"]
    final = points[-1]
    steps = trainer.state.global_step
    if kind == "ddp":
        tokens, comm_bytes, comm_rounds, rounds = steps * tokens_per_step, steps * ddp_step_bytes, steps, None
        batch_sizes = [[0, spec["train"]["batch_size"]]]
        instances_curve = [[0, 1]]
    else:
        adloco = trainer.adloco_state  # after train(): the final merge's bytes included
        tokens, comm_bytes = adloco.tokens, adloco.comm_bytes
        rounds = adloco_rounds(args.output_dir)
        final_merge_bytes = comm_bytes - sum(r["comm_bytes"] for r in rounds)
        comm_rounds = sum(1 for r in rounds if r["comm_bytes"] > 0) + (1 if final_merge_bytes > 0 else 0)
        batch_sizes = [[r["total_tokens"], r["mean_batch_size"]] for r in rounds]
        instances_curve = [[r["total_tokens"], r["num_instances"]] for r in rounds]
    walls = [r["wall"] - r["eval_seconds"] for r in everyone]
    result = {
        "method": spec["method"],
        "kind": kind,
        "budget_reached": tokens >= spec["budget_tokens"],
        # The step at which the time budget stopped training (None: the token budget or max_steps did); with a
        # virtual clock, the virtual seconds budget.
        "stopped_by_time_at": everyone[0].get("time_budget_stop") or everyone[0].get("virtual_budget_stop"),
        "final_eval_ppl": final["eval_ppl"],
        "tokens": tokens,
        "comm_rounds": comm_rounds,
        "comm_bytes": comm_bytes,
        "wall_seconds": max(walls),
        "curve": [[p["tokens"], p["eval_ppl"]] for p in points],
        "curve_bytes": [[p["comm_bytes"], p["eval_ppl"]] for p in points],
        # The merged model's perplexity where a point has one (`curve_kind`, `CURVE_SOURCES`); the instances'
        # demand-weighted mean (the library's eval_loss) is kept as curve_instances_mean.
        "curve_kind": curve_kind([p["curve_source"] for p in points]),
        "curve_instances_mean": [[p["tokens"], p["instances_mean_ppl"]] for p in points],
        "curve_best_instance": [[p["tokens"], p["best_instance_ppl"]] for p in points],
        "curve_measured_bytes": [[p["measured_bytes"], p["eval_ppl"]] for p in points],
        "measured_bytes_sent": total([r["measured"] for r in everyone]),
        "measured_eval_bytes_sent": int(sum(r["eval_bytes"] for r in everyone)),
        "measured_bytes_per_rank": [r["measured"] for r in everyone],
        "wall_seconds_with_eval": max(r["wall"] for r in everyone),
        "eval_seconds": max(r["eval_seconds"] for r in everyone),
        "steps": steps,
        "rounds": None if rounds is None else len(rounds),
        "tokens_per_second": tokens / max(walls),
        "parameters": numel,
        "batch_sizes": batch_sizes,
        "instances": instances_curve,
        "round_log": rounds,
        "evals": points,
        "world_size": world,
        "train_tokens_available": len(trainer.train_dataset) * spec["block_size"],
        # Tokens trained over the tokens of the train split, and the most passes any worker made over its shard
        # (workers of instances with larger batches draw faster): above 1, some samples were seen twice.
        "epochs": tokens / (len(trainer.train_dataset) * spec["block_size"]),
        "max_worker_epochs": max(r["shard_epochs"] for r in everyone),
        "eval_blocks": len(trainer.eval_dataset),
        "max_batch_size": getattr(getattr(trainer, "worker", None), "max_batch_size", None),
        "peak_memory_bytes": torch.cuda.max_memory_allocated() if torch.cuda.is_available() else None,
        "torch_threads": torch.get_num_threads(),
        # Per worker: seconds in inner steps ([`StepClock`]; DDP's include its gradient all-reduce, which runs inside
        # backward) and, for AdLoCo, one mark per round end ([`RoundMarks`]).
        "inner_step_seconds_per_rank": [r["inner_step_seconds"] for r in everyone],
        "inner_steps_timed_per_rank": [r["inner_steps_timed"] for r in everyone],
        "round_marks_per_rank": None if kind == "ddp" else [r["round_marks"] for r in everyone],
        "slowed_ranks": [r["rank"] for r in everyone if r["slowed"]],  # in the CPU-quota cgroup (cgroups.py)
        # With a virtual clock (`spec["clock"]`): per round [global step, virtual seconds at its end on each of the
        # clock's bandwidths] (the same on every worker after the round end's synchronisation), and rank 0's seconds
        # of device work (steps, outer steps: what no link changes).
        "virtual_round_ends": everyone[0].get("virtual_round_ends"),
        "virtual_compute_seconds": everyone[0].get("virtual_compute_seconds"),
        # The factor on the bytes the clock priced: the profile's model's parameters over the run's.
        "virtual_bytes_scale": everyone[0].get("virtual_bytes_scale"),
        "clock": None if spec.get("clock") is None else {k: v for k, v in spec["clock"].items() if k != "profile"},
        # time.time() when the first worker started training and the last one stopped (evaluations included)
        "train_started_at": min(r["started_at"] for r in everyone),
        "train_ended_at": max(r["ended_at"] for r in everyone),
    }
    write_json(os.path.join(args.output_dir, "result.json"), result)
    print(
        f"[{spec['method']}] ppl {final['eval_ppl']:.2f} tokens {tokens} steps {steps} bytes {comm_bytes} "
        f"measured {result['measured_bytes_sent']} wall {result['wall_seconds']:.1f}s curve {result['curve_kind']}",
        flush=True,
    )


def curve_kind(sources: list[str]) -> str:
    """What a run's curve follows: `"merged"` when some point is the merged model evaluated while several instances
    trained, else `"instances_mean"` when some point is the instances' mean, else `"model"` (one model throughout)."""
    for kind in CURVE_SOURCES:
        if kind in sources:
            return kind
    return "model"
