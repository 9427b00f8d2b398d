"""Elastic resume with real workers: a checkpoint of 4 workers resumed with 2, one of 2 resumed with 4 (map-style).

Each pair shares one module-scoped run: the old run stops (all workers gone) at step 12 after checkpoint-10, the
resumed one records every draw of its sampler and what AdLoCo restored.
"""

import json
import os

import pytest
import safetensors.torch
import torch
from helpers import RESUME_CONFIG, SCRIPTS, launch, sequence_dataset, tiny_model, worker_spec

from adloco_hf import AdLoCoConfig, AdLoCoTrainer
from adloco_hf.checkpoint.elastic import plan_elastic_resume
from adloco_hf.instances.table import Instance, instance_of, seat_counts


pytestmark = pytest.mark.multiprocess

WORKER = os.path.join(SCRIPTS, "adloco_worker.py")
NUM_SAMPLES = 96
# 2 instances merging at round 4 (after the resume), batches that grow from 2 up to 4, a learning rate following them.
CONFIG = RESUME_CONFIG


def spec(out, probe, world_size, **extra):
    return worker_spec(
        out, probe, world_size, CONFIG, dropout=0.1, num_samples=NUM_SAMPLES, record_passes=True, **extra
    )


def elastic_pair(tmp_path_factory, old, new):
    """Run `old` workers up to step 12 (checkpoint-10), then resume checkpoint-10 with `new` workers."""
    root = tmp_path_factory.mktemp(f"elastic{old}to{new}")
    out = str(root / "out")
    launch(WORKER, json.dumps(spec(out, str(root / "old"), old, fail=["all", 12, 0])), num_processes=old)
    checkpoint = os.path.join(out, "checkpoint-10")
    assert os.path.isdir(checkpoint) and not os.path.isdir(os.path.join(out, "merged"))
    saved = [torch.load(os.path.join(checkpoint, "adloco", f"rank-{r}.pt"), weights_only=True) for r in range(old)]
    resumed = launch(
        WORKER,
        json.dumps(spec(out, str(root / "new"), new, resume=checkpoint, probe_resume=True)),
        num_processes=new,
    )
    return {
        "root": root,
        "out": out,
        "saved": saved,
        "output": resumed.stdout + resumed.stderr,
        "old": old,
        "new": new,
    }


@pytest.fixture(scope="module")
def four_to_two(tmp_path_factory):
    return elastic_pair(tmp_path_factory, 4, 2)


@pytest.fixture(scope="module")
def two_to_four(tmp_path_factory):
    return elastic_pair(tmp_path_factory, 2, 4)


def draws(probe_dir, rank, before_step=None):
    """(pass, index) of every sample a worker drew (before `before_step`: those its checkpoint-10 counts)."""
    drawn = []
    with open(os.path.join(probe_dir, f"passes-rank{rank}.jsonl")) as f:
        for line in f:
            record = json.loads(line)
            if before_step is None or record["step"] < before_step:
                drawn += [(epoch, index) for epoch, indices in record["parts"] for index in indices]
    return drawn


def full_pass(workers, epoch):
    """The samples a pass of the sampler draws with `workers` workers (seed 3, as CONFIG's)."""
    permutation = torch.randperm(NUM_SAMPLES, generator=torch.Generator().manual_seed(3 + epoch))
    return sorted(permutation[: workers * (NUM_SAMPLES // workers)].tolist())


def check_elastic_run(run):
    old, new, root, out, saved = run["old"], run["new"], run["root"], run["out"], run["saved"]
    # Both launches had the world size asked for, and the resumed one ran to the end.
    assert all(state["world_size"] == old and state["outer_step"] == 2 for state in saved)
    reports = [json.load(open(root / "new" / f"report-rank{r}.json")) for r in range(new)]
    assert [report["world_size"] for report in reports] == [new] * new
    assert os.path.isfile(os.path.join(out, "merged", "model.safetensors"))

    # No sample of a started pass lost or drawn twice: old draws up to checkpoint-10, then the new workers' bridge.
    last = max(s["sampler"]["epoch"] - (s["sampler"]["position"] == 0) for s in saved)
    drawn = [pair for r in range(old) for pair in draws(root / "old", r, before_step=10)]
    drawn += [pair for r in range(new) for pair in draws(root / "new", r)]
    for epoch in range(last + 1):
        assert sorted(index for e, index in drawn if e == epoch) == full_pass(old, epoch), epoch
    # The pass after is the new layout's: disjoint shards, never a sample twice.
    after = [index for e, index in drawn if e == last + 1]
    assert after and len(set(after)) == len(after) and set(after) <= set(full_pass(new, last + 1))

    # Each instance's weights and momentum at the resume point are the saved ones, on every worker it now has. A
    # worker that stays in its instance keeps its own AdamW state; one that joins takes the instance's old first
    # worker's.
    before = {inst.id: inst for inst in (Instance.from_row(row) for row in saved[0]["instances"])}
    plan = plan_elastic_resume(list(before.values()), old, new)
    generators = [state["rng"]["cpu"] for state in saved]
    for rank in range(new):
        restored = safetensors.torch.load_file(str(root / "new" / f"resume-rank{rank}.safetensors"))
        inst = before[next(a.id for a in plan.after if rank in a.workers)]
        source = rank if rank < old and rank in inst.workers else inst.first_worker
        assert plan.sources[rank] == source
        phi = saved[inst.first_worker]["global_model"]
        assert all(torch.equal(saved[m]["global_model"]["phi"], phi["phi"]) for m in inst.workers)
        assert torch.equal(restored["phi"], phi["phi"]), rank
        assert torch.equal(restored["momentum"], phi["momentum"]), rank
        # Old ranks keep their random generators; new ones get their own (not a copy of another worker's).
        if rank < old:
            assert torch.equal(restored["rng_cpu"], saved[rank]["rng"]["cpu"])
        else:
            assert not any(torch.equal(restored["rng_cpu"], other) for other in generators)
        generators.append(restored["rng_cpu"])
        moments = saved[source]["inner_optimizer"]["state"]
        for key in ("exp_avg", "exp_avg_sq"):
            want = torch.cat([moments[i][key].reshape(-1) for i in sorted(moments)])
            assert torch.equal(restored[key], want), (rank, key)
    # The rounds after the resume are the new workers'.
    rounds = [json.loads(line) for line in open(os.path.join(out, "adloco_rounds.jsonl"))]
    assert sorted({w for line in rounds if line["outer_step"] > 2 for w in line["workers"]}) == list(range(new))
    assert [line["outer_step"] for line in rounds][:4] == [1, 1, 2, 2]  # the old run's rounds are kept

    # Logged, and recorded in adloco_resumes.jsonl.
    assert f"elastic resume: checkpoint-10 was written by {old} workers, this run has {new}" in run["output"]
    lines = [json.loads(line) for line in open(os.path.join(out, "adloco_resumes.jsonl"))]
    assert len(lines) == 1
    line = lines[0]
    assert (line["from_workers"], line["to_workers"], line["global_step"], line["outer_step"]) == (old, new, 10, 2)
    assert line["workers_after"] == {str(i.id): list(i.workers) for i in plan.after}
    assert line["optimizer_sources"] == list(plan.sources)
    return plan


def test_four_workers_resume_on_two(four_to_two):
    plan = check_elastic_run(four_to_two)
    assert [inst.workers for inst in plan.after] == [(0,), (1,)] and plan.sources == (0, 1)


def test_two_workers_resume_on_four(two_to_four):
    plan = check_elastic_run(two_to_four)
    # Ranks 0 and 1 stay; ranks 2 and 3 are new, seated by demand, each taking its instance's old first worker's state.
    assert [inst.workers[0] for inst in plan.after] == [0, 1]
    assert {inst.id: len(inst.workers) for inst in plan.after} == seat_counts({i.id: i.demand for i in plan.before}, 4)
    assert plan.sources[:2] == (0, 1) and all(plan.sources[r] == instance_of(plan.after, r).id for r in (2, 3))


def test_more_instances_than_workers_asks_to_merge_down_first(four_to_two, tmp_path):
    # checkpoint-10 holds 2 instances; this process is 1 worker. Refused before anything is loaded or written.
    out = str(tmp_path / "out")
    args = AdLoCoConfig(output_dir=out, use_cpu=True, report_to=[], **CONFIG)
    assert args.world_size == 1
    trainer = AdLoCoTrainer(model=tiny_model(), args=args, train_dataset=sequence_dataset(NUM_SAMPLES))
    with pytest.raises(ValueError) as error:
        trainer.train(resume_from_checkpoint=os.path.join(four_to_two["out"], "checkpoint-10"))
    assert str(error.value) == (
        "checkpoint-10 holds 2 instances but this run has 1 worker(s): every instance needs a worker. Resume with at "
        "least 2 workers, or merge down first: resume with the checkpoint's 4 workers until merges (merge_every) "
        "leave at most 1 instance(s), then resume that checkpoint with 1."
    )
    assert not os.path.exists(os.path.join(out, "adloco_rounds.jsonl"))
