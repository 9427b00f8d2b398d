"""Training from a stream with real workers: a streamed run stopped and resumed ends with the same merged model."""

import json
import os
import shutil

import pytest
import torch
from helpers import (
    COMPARED_ROUND_KEYS,
    RESUME_CONFIG,
    SCRIPTS,
    comparable_rounds,
    launch,
    merged_params,
    rounds_of,
    worker_spec,
    write_c4_shards,
)


pytestmark = pytest.mark.multiprocess

WORKER = os.path.join(SCRIPTS, "adloco_worker.py")

# As test_reliability's resume test: 2 workers, 2 instances merging at round 4 (after the checkpoint at round 2),
# batches that grow, a learning rate that follows each worker's batch, attention dropout.
CONFIG = dict(RESUME_CONFIG, eval_strategy="steps", eval_steps=10, per_device_eval_batch_size=8)


def spec_for(out, probe, shards, **extra):
    stream = {"shards": shards, "documents": 40, "block_size": 16}
    return worker_spec(out, probe, 2, CONFIG, dropout=0.1, eval=True, stream=stream, **extra)


def comparable(out):
    return comparable_rounds(out, (*COMPARED_ROUND_KEYS, "tokens"))


@pytest.fixture(scope="module")
def stopped(tmp_path_factory):
    """A 2-worker streamed run stopped (all workers gone) at step 12, after checkpoint-10, recording the documents it
    read; and a copy of its output folder for an elastic resume."""
    root = tmp_path_factory.mktemp("streamed")
    shards, docs = write_c4_shards(root / "shards", 4, 10)  # 4 files: each worker reads 2, ~11 blocks a pass
    part = str(root / "part")
    spec = spec_for(part, str(root / "p1"), shards, fail=["all", 12, 0], record_documents=True)
    launch(WORKER, json.dumps(spec), num_processes=2)
    shutil.copytree(part, str(root / "elastic"))
    return {"root": root, "shards": shards, "docs": docs, "part": part, "elastic": str(root / "elastic")}


def test_streamed_stop_and_resume_ends_with_the_same_merged_model(tmp_path, stopped):
    shards, part = stopped["shards"], stopped["part"]
    full = str(tmp_path / "full")
    launch(WORKER, json.dumps(spec_for(full, str(tmp_path / "p0"), shards)), num_processes=2)

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
    gap = (merged_params(part) - merged_params(full)).abs().max().item()
    print(f"streamed stop/resume: max |merged - uninterrupted merged| = {gap:.3g}")
    assert gap <= 1e-6
    full_rounds = comparable(full)
    assert comparable(part) == full_rounds
    assert any(line["merged_from"] for line in full_rounds if line["outer_step"] == 4)  # merged after the resume
    assert max(line["batch_size"] for line in full_rounds) > 2  # batches grew along the way


def documents_read(probe_dir, rank, before_step=None):
    """(pass, document) of every document a worker tokenised (before `before_step`: those its checkpoint counts)."""
    with open(os.path.join(probe_dir, f"documents-rank{rank}.jsonl")) as f:
        records = [json.loads(line) for line in f]
    return [(r["pass"], r["doc"]) for r in records if before_step is None or r["step"] < before_step]


def test_a_streamed_run_resumes_elastically_on_four_workers(stopped):
    root, out = stopped["root"], stopped["elastic"]
    checkpoint = os.path.join(out, "checkpoint-10")
    saved = [torch.load(os.path.join(checkpoint, "adloco", f"rank-{r}.pt"), weights_only=True) for r in range(2)]
    resumed = launch(
        WORKER,
        json.dumps({**spec_for(out, str(root / "p4"), stopped["shards"], resume=checkpoint, record_documents=True),
                    "world_size": 4}),
        num_processes=4,
    )  # fmt: skip
    reports = [json.load(open(root / "p4" / f"report-rank{rank}.json")) for rank in range(4)]
    assert [r["world_size"] for r in reports] == [4] * 4
    assert "elastic resume: checkpoint-10 was written by 2 workers, this run has 4" in resumed.stdout + resumed.stderr
    merged = merged_params(out)
    assert torch.isfinite(merged).all()
    rounds = rounds_of(out)
    assert sorted({w for line in rounds if line["outer_step"] > 2 for w in line["workers"]}) == [0, 1, 2, 3]

    # Within every pass the old workers had started, each training document is read exactly once by the old
    # workers (up to checkpoint-10) and the new ones together; the pass after is split by the new layout.
    held_out = {doc.split()[0] for doc in stopped["docs"][:4]}  # the eval slice: the stream's first 4 documents
    training = sorted(doc.split()[0] for doc in stopped["docs"] if doc.split()[0] not in held_out)
    last = max(int(state["sampler"]["stream"]["source"]["epoch"]) for state in saved)
    read = [pair for r in range(2) for pair in documents_read(root / "p1", r, before_step=10)]
    read += [pair for r in range(4) for pair in documents_read(root / "p4", r)]
    for epoch in range(last + 1):
        assert sorted(doc for e, doc in read if e == epoch) == training, epoch
    after = [doc for e, doc in read if e == last + 1]
    assert after and len(set(after)) == len(after)
