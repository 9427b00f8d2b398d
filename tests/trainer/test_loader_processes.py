"""`dataloader_num_workers > 0` with AdLoCo (issue 38): launched workers whose loader processes prefetch batches of
sizes that change every round train on exactly the batches of a run without loader processes, resume exactly, and
keep their loader processes through every change of size."""

import json
import os

import pytest
from helpers import (
    RESUME_CONFIG,
    SCRIPTS,
    comparable_rounds,
    launch,
    merged_params,
    reports_of,
    rounds_of,
    worker_spec,
    write_c4_shards,
)


pytestmark = pytest.mark.multiprocess

WORKER = os.path.join(SCRIPTS, "adloco_worker.py")

# The resume tests' run (2 workers, 2 instances merging at round 4, batches that grow, a learning rate that follows
# them, attention dropout), micro-batches of at most 2 (switch mode accumulates above 4) and evaluation every 2 rounds.
CONFIG = dict(RESUME_CONFIG, max_batch_size=2, eval_strategy="steps", eval_steps=10, per_device_eval_batch_size=8)
# 2 loader processes × prefetch 3: 6 batches drawn ahead, more than a round's 5 steps, so the batches in flight at a
# round's end may reach into the round after next. Map-style runs keep their loader processes persistent.
LOADER = {
    "map": dict(dataloader_num_workers=2, dataloader_prefetch_factor=3, dataloader_persistent_workers=True),
    "stream": dict(dataloader_num_workers=2, dataloader_prefetch_factor=3),
}


@pytest.fixture(scope="module", params=["map", "stream"])
def runs(request, tmp_path_factory):
    """For map-style data and a PackedStream: a run without loader processes, the same run with them, and one with
    them stopped (all workers gone) at step 12 and resumed from checkpoint-10, with them again."""
    kind, root = request.param, tmp_path_factory.mktemp(request.param)
    data = {"dropout": 0.1, "eval": True}
    if kind == "stream":
        shards, _ = write_c4_shards(root / "shards", 4, 10)
        data["stream"] = {"shards": shards, "documents": 40, "block_size": 16}

    def run(name, loader, **extra):
        out, probe = str(root / name), str(root / f"probe-{name}")
        spec = worker_spec(out, probe, 2, {**CONFIG, **loader}, **data, **extra)
        launch(WORKER, json.dumps(spec), num_processes=2, timeout=400)
        return out, probe

    plain = run("plain", {})
    loaded = run("loaded", LOADER[kind], record_collate=True)
    part, _ = run("part", LOADER[kind], fail=["all", 12, 0])
    checkpoint = os.path.join(part, "checkpoint-10")
    assert os.path.isdir(checkpoint) and not os.path.isdir(os.path.join(part, "merged"))
    _, resumed = run("part", LOADER[kind], resume=checkpoint)
    return {"kind": kind, "plain": plain, "loaded": loaded, "part": part, "resumed": resumed}


def test_every_step_trains_on_the_batches_of_a_run_without_loader_processes(runs):
    (plain, plain_probe), (loaded, loaded_probe) = runs["plain"], runs["loaded"]
    expected, reports = reports_of(plain_probe, 2), reports_of(loaded_probe, 2)
    assert [r["world_size"] for r in expected + reports] == [2] * 4
    for rank in range(2):
        assert len(expected[rank]["seen_inputs"]) == 30
        assert reports[rank]["seen_inputs"] == expected[rank]["seen_inputs"], rank  # samples and order, every step
    gap = (merged_params(loaded) - merged_params(plain)).abs().max().item()
    print(f"{runs['kind']}: max |merged with 2 loader processes - merged without| = {gap:.3g}")
    assert gap <= 1e-6
    assert comparable_rounds(loaded) == comparable_rounds(plain)
    lines = rounds_of(plain)
    assert len({line["batch_size"] for line in lines}) >= 3  # the request grew round after round
    assert any(line["accumulation_steps"] > 1 for line in lines)  # switch mode's micro-batches
    assert any(line["merged_from"] for line in lines)  # two instances merged


def test_a_run_stopped_and_resumed_with_loader_processes_ends_as_one_without(runs):
    (plain, plain_probe), part = runs["plain"], runs["part"]
    gap = (merged_params(part) - merged_params(plain)).abs().max().item()
    print(f"{runs['kind']}: stopped at 12, resumed from checkpoint-10: max |merged - merged without| = {gap:.3g}")
    assert gap <= 1e-6
    assert comparable_rounds(part) == comparable_rounds(plain)
    expected, resumed = reports_of(plain_probe, 2), reports_of(runs["resumed"], 2)
    for rank in range(2):
        assert resumed[rank]["world_size"] == 2
        after = {step: seen for step, seen in expected[rank]["seen_inputs"].items() if int(step) >= 10}
        assert resumed[rank]["seen_inputs"] == after, rank


def test_loader_processes_live_through_every_change_of_size(runs):
    _, probe = runs["loaded"]
    for report in reports_of(probe, 2):
        with open(os.path.join(probe, f"collate-rank{report['rank']}.jsonl")) as f:
            collated = [json.loads(line) for line in f]
        pids = {entry["pid"] for entry in collated}
        assert len(pids) == 2 and report["pid"] not in pids  # the same 2 loader processes collated every batch
        assert len({entry["size"] for entry in collated}) >= 3  # through the request's changes of size
        trained = sum(size for size, _ in report["seen_inputs"].values())
        assert sum(entry["size"] for entry in collated) > trained  # some were drawn ahead and re-planned
