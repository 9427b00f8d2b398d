"""Training from a stream with real workers: a streamed run stopped and resumed ends with the same merged model."""

import json
import os

import pytest
import torch
from helpers import SCRIPTS, flat_params, launch, write_c4_shards
from transformers import AutoModelForCausalLM


pytestmark = pytest.mark.multiprocess

WORKER = os.path.join(SCRIPTS, "adloco_worker.py")

# As test_reliability's resume test: 2 workers, 2 instances merging at round 4 (after the checkpoint at round 2),
# batches that grow, a learning rate that follows each worker's batch, attention dropout.
CONFIG = dict(
    max_steps=30, inner_steps=5, save_steps=10, num_instances=2, merge_every=4, per_device_train_batch_size=2,
    max_batch_size=4, eta=0.5, seed=3, optim="adamw_torch", learning_rate=3e-3, lr_batch_scaling="sqrt",
    eval_strategy="steps", eval_steps=10, per_device_eval_batch_size=8,
)  # fmt: skip


def spec_for(out, probe, shards, **extra):
    return {
        "output_dir": out,
        "world_size": 2,
        "probe_dir": probe,
        "config": {"output_dir": out, **CONFIG},
        "dropout": 0.1,
        "eval": True,
        "stream": {"shards": shards, "documents": 40, "block_size": 16},
        **extra,
    }


def merged_params(out):
    return flat_params(AutoModelForCausalLM.from_pretrained(os.path.join(out, "merged")))


def comparable(out):
    keep = ("outer_step", "instance", "workers", "batch_size", "next_batch_size", "samples", "tokens", "train_loss",
            "grad_variance", "pseudo_grad_norm", "merged_from", "num_instances")  # fmt: skip
    lines = [json.loads(line) for line in open(os.path.join(out, "adloco_rounds.jsonl"))]
    return [{k: line[k] for k in keep} for line in lines]


def test_streamed_stop_and_resume_ends_with_the_same_merged_model(tmp_path):
    shards, _ = write_c4_shards(tmp_path / "shards", 4, 10)  # 4 files: each worker reads 2, ~11 blocks a pass
    full = str(tmp_path / "full")
    launch(WORKER, json.dumps(spec_for(full, str(tmp_path / "p0"), shards)), num_processes=2)

    part = str(tmp_path / "part")
    launch(WORKER, json.dumps(spec_for(part, str(tmp_path / "p1"), shards, fail=["all", 12, 0])), num_processes=2)
    checkpoint = os.path.join(part, "checkpoint-10")
    assert os.path.isdir(checkpoint) and not os.path.isdir(os.path.join(part, "merged"))
    for rank in range(2):
        state = torch.load(os.path.join(checkpoint, "adloco", f"rank-{rank}.pt"), weights_only=True)
        sampler = state["sampler"]
        assert state["world_size"] == 2 and sampler["kind"] == "stream" and sampler["samples"] >= 20
        packed = sampler["stream"]
        assert packed["kind"] == "packed" and packed["blocks"] == sampler["samples"]
        assert packed["source"]["layout"] == "shards" and packed["source"]["epoch"] >= 1
    resume = spec_for(part, str(tmp_path / "p2"), shards, resume=checkpoint)
    launch(WORKER, json.dumps(resume), num_processes=2)

    reports = [json.load(open(tmp_path / "p2" / f"report-rank{rank}.json")) for rank in range(2)]
    assert [r["world_size"] for r in reports] == [2, 2]
    assert (merged_params(part) - merged_params(full)).abs().max().item() <= 1e-6
    full_rounds = comparable(full)
    assert comparable(part) == full_rounds
    assert any(line["merged_from"] for line in full_rounds if line["outer_step"] == 4)  # merged after the resume
    assert max(line["batch_size"] for line in full_rounds) > 2  # batches grew along the way
