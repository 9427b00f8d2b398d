"""Workers of several processes sharding one replica with FSDP2 (`worker_parallelism="fsdp"`, `worker_fsdp.py`):
4 real gloo processes on the CPU, 2 workers of 2 processes. The checks that need every process's weights run in
the workers (`scripts/fsdp_worker.py`)."""

import json
import os

import pytest
import safetensors.torch
import torch
from helpers import (
    SCRIPTS,
    TWO_BY_TWO,
    comparable_rounds,
    flat_params,
    launch_run,
    merged_params,
    reports_of,
    rounds_of,
)
from transformers import AutoModelForCausalLM


pytestmark = pytest.mark.multiprocess

WORKER = os.path.join(SCRIPTS, "fsdp_worker.py")

BASE = dict(
    seed=3, optim="adamw_torch", learning_rate=3e-3, per_device_train_batch_size=2, max_batch_size=4,
    processes_per_worker=2, worker_parallelism="fsdp",
)  # fmt: skip


def run(tmp_path, config, *, world_size=4, name="out", **extra):
    return launch_run(WORKER, tmp_path, {**BASE, **config}, world_size=world_size, name=name, **extra)


def test_two_workers_of_two_processes_fsdp(tmp_path, two_by_two_ddp):
    # The DDP run's config (helpers.TWO_BY_TWO), with the instance evaluated at step 8, the end, and merged.
    config = dict(TWO_BY_TWO, worker_parallelism="fsdp", eval_strategy="steps", eval_steps=8, eval_merged_model=True)
    out, probe = launch_run(WORKER, tmp_path, config, world_size=4, eval=True)
    reports = reports_of(probe, 4)
    merged = merged_params(out)  # a plain from_pretrained folder, gathered from the shards
    numel = merged.numel()
    for report in reports:
        assert report["world_size"] == 4 and report["sharded"]
        assert report["worker_id"] == report["rank"] // 2 and report["local_rank"] == report["rank"] % 2
        assert report["steps_checked"] == 12 and report["rounds_checked"] == 3
        assert report["min_spread_inside_round"] > 1e-6
        # outer_lr=1, no momentum, fp32: after each outer step every process holds the mean of the workers' pre-sync
        # models (a sum instead of a mean, or shards exchanged at the wrong offsets, are not).
        assert report["mean_checks"] == 3 and report["max_mean_error"] < 1e-6
        # Every logged evaluation equals a direct one of the process's own (gathered) weights, checked in the worker:
        # the instance's at steps 8 and 12 (the end), then the merged model's.
        checks = report["eval_checks"]
        assert [(c["step"], c["instance"]) for c in checks] == [(8, 0), (12, 0), (12, "merged")], checks
        assert report["full_numel"] == numel
    # φ is sharded like the model: each local rank holds about half of it.
    assert reports[0]["part_numel"] + reports[1]["part_numel"] == numel
    assert (
        reports[0]["part_numel"] == reports[2]["part_numel"] and reports[1]["part_numel"] == reports[3]["part_numel"]
    )
    for line in rounds_of(out):
        assert line["workers"] == [0, 1] and line["processes"] == [0, 1, 2, 3]
        # The gradient noise, from two halves of the synced sharded gradients (local rank 0 of each worker reports).
        assert line["grad_variance"] is not None and line["grad_variance"] > 0
        assert line["comm_bytes"] == 2 * 1 * 4 * numel  # two half payloads, one ring of 2 workers each
    final = safetensors.torch.load_file(str(probe / "final-rank0.safetensors"))["params"]
    assert torch.equal(final, merged)
    evals = [json.loads(line) for line in open(os.path.join(out, "adloco_eval.jsonl"))]
    assert evals and all(torch.isfinite(torch.tensor(line["eval_loss"])) for line in evals)

    # The same run with the replica whole (DDP) inside each worker: the same data per process, the same outer steps
    # on φ (sharded or whole), so the same model and losses up to the float order of the reductions.
    ddp, _ = two_by_two_ddp
    assert (merged - merged_params(ddp)).abs().max().item() <= 1e-5
    sharded, whole = rounds_of(out), rounds_of(ddp)
    assert [line["batch_size"] for line in sharded] == [line["batch_size"] for line in whole] == [4, 4, 4]
    assert [line["train_loss"] for line in sharded] == pytest.approx([line["train_loss"] for line in whole], rel=1e-5)


RESUME = dict(max_steps=16, inner_steps=4, save_steps=8, num_instances=2, merge_every=3)


def test_fsdp_stop_and_resume_and_merges(tmp_path):
    full, full_probe = run(tmp_path, RESUME, name="full", dropout=0.1)
    part, _ = run(tmp_path, RESUME, name="part", dropout=0.1, fail=[10, 0])
    checkpoint = os.path.join(part, "checkpoint-8")
    assert not os.path.isdir(os.path.join(part, "merged"))
    # The checkpoint's model files are the full model; each process's state holds its shard.
    assert flat_params(AutoModelForCausalLM.from_pretrained(checkpoint)).numel() == merged_params(full).numel()
    states = [torch.load(os.path.join(checkpoint, "adloco", f"rank-{r}.pt"), weights_only=True) for r in range(4)]
    numel = merged_params(full).numel()
    assert sum(s["global_model"]["phi"].numel() for s in states[:2]) == numel
    run(tmp_path, RESUME, name="part", dropout=0.1, resume=checkpoint)
    assert (merged_params(part) - merged_params(full)).abs().max().item() <= 1e-6
    full_rounds = rounds_of(full)
    assert comparable_rounds(part) == comparable_rounds(full)
    assert any(line["merged_from"] for line in full_rounds)  # a merge happened (after the resume)
    # The merge (round 3) equals the weighted average of the instances' full φ before it, each gathered from its
    # worker's shards (saved by local rank 0 of workers 0 and 1): shards summed or misplaced give another model.
    assert sorted(os.listdir(os.path.join(full, "merges"))) == ["outer-3"]
    folder = os.path.join(full, "merges", "outer-3")
    info = json.load(open(os.path.join(folder, "adloco_merge.json")))
    premerge = full_probe / "merges"

    def phi_of(worker):
        name = next(f for f in sorted(os.listdir(premerge)) if f.startswith(f"premerge-worker{worker}-0-"))
        return safetensors.torch.load_file(os.path.join(premerge, name))["phi"]

    survivor, merged = info["instances"]
    assert phi_of(0).ne(phi_of(1)).any() and phi_of(0).numel() == numel
    expected = info["weights"][0] * phi_of(survivor) + info["weights"][1] * phi_of(merged)
    saved = flat_params(AutoModelForCausalLM.from_pretrained(folder))
    assert (saved - expected).abs().max().item() < 1e-6


def test_fsdp_point_to_point_merge_of_independent_instances(tmp_path):
    config = dict(
        max_steps=8, inner_steps=4, num_instances=2, merge_every=1, merge_transport="point_to_point",
        outer_momentum=0.9, instance_init="independent", save_strategy="no",
    )  # fmt: skip
    out, probe = run(tmp_path, config)
    lines = rounds_of(out)
    assert [(line["outer_step"], line["workers"]) for line in lines] == [(1, [0]), (1, [1]), (2, [0, 1])]
    assert lines[0]["merged_from"] or lines[1]["merged_from"]
    merge = flat_params(AutoModelForCausalLM.from_pretrained(os.path.join(out, "merges", "outer-1")))
    assert merge.numel() == merged_params(out).numel() and torch.isfinite(merge).all()
    final = safetensors.torch.load_file(str(probe / "final-rank3.safetensors"))["params"]
    assert torch.equal(final, merged_params(out))
