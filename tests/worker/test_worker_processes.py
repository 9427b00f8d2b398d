"""Workers of several processes (`processes_per_worker=2`) with real gloo processes: DDP inside a worker, DiLoCo
across workers (`worker_layout.py`). The assertions that need every process's weights run inside the workers
(`scripts/adloco_worker.py`: `InWorker`, `BeforeSync`, `AfterSync`)."""

import json
import os
import shutil

import pytest
import safetensors.torch
import torch
from helpers import (
    SCRIPTS,
    comparable_rounds,
    flat_params,
    launch,
    launch_failing,
    launch_run,
    merged_params,
    reports_of,
    rounds_of,
    worker_spec,
)
from transformers import AutoModelForCausalLM


pytestmark = pytest.mark.multiprocess

WORKER = os.path.join(SCRIPTS, "adloco_worker.py")
EQUIVALENCE = os.path.join(SCRIPTS, "ddp_equivalence_worker.py")

BASE = dict(
    seed=3, optim="adamw_torch", learning_rate=3e-3, per_device_train_batch_size=2, max_batch_size=4, eta=0.5,
    processes_per_worker=2,
)  # fmt: skip


def run(tmp_path, config, *, world_size=4, name="out", **extra):
    return launch_run(WORKER, tmp_path, {**BASE, **config}, world_size=world_size, name=name, **extra)


def test_two_workers_of_two_processes(two_by_two_ddp):
    out, probe = two_by_two_ddp
    reports = reports_of(probe, 4)
    numel = merged_params(out).numel()
    for report in reports:
        assert report["world_size"] == 4
        assert report["worker_id"] == report["rank"] // 2
        assert report["steps_checked_in_worker"] == 12  # the processes of each worker agreed after every step
        assert report["rounds_checked"] == 3  # every process of the instance agreed after each outer step
        # The two workers drift apart inside a round (measured at steps 1, 4, 7, 10 and the round ends 4, 8, 12)...
        assert report["spread_checks"] == 6 and report["min_spread_inside_round"] > 1e-4
        assert report["mean_checks"] == 3 and report["max_mean_error"] < 1e-6  # ...and meet at their mean after it
        assert report["numel"] == numel
    # Local ranks 0 and 1 reduce complementary halves of the pseudo-gradient.
    parts = sorted(tuple(r["part"]) for r in reports if r["worker_id"] == 0)
    assert parts[0][0] == 0 and parts[0][1] == parts[1][0] and parts[1][1] == numel
    rounds = rounds_of(out)
    assert [line["outer_step"] for line in rounds] == [1, 2, 3]
    for line in rounds:
        assert line["workers"] == [0, 1]
        assert line["processes"] == [0, 1, 2, 3] and line["processes_per_worker"] == 2
        assert line["batch_size"] % 2 == 0 and line["next_batch_size"] % 2 == 0
        used = line["batch_size"] if line["accumulation_steps"] > 1 else 2 * line["micro_batch_size"]
        assert line["samples"] == 2 * 4 * used  # two workers, four steps, the worker's batch
        # The bytes between workers: two half payloads in float32, the ring total of the whole model.
        assert line["comm_bytes"] == 2 * (2 - 1) * 4 * numel
        # Each local rank sends its half: the payload per process between workers is 1/G of the model's.
        assert line["process_payload_bytes"] == [4 * (b - a) for a, b in parts]
        assert sum(line["process_payload_bytes"]) == 4 * numel
    assert rounds[0]["stats_dof"] == 4  # the statistics of all four processes pool (two halves each)
    assert rounds[0]["batch_size"] == 4  # the initial request: 2 processes × per_device_train_batch_size
    assert {line["next_batch_size"] for line in rounds} == {4}  # eta 1e6: measured, never grown (TWO_BY_TWO)
    for report in reports:
        assert report["seen_batches"][:10] == [2] * 10  # each process draws half of its worker's batch


def test_one_worker_of_two_processes_equals_plain_ddp(tmp_path):
    spec = {"output_dir": str(tmp_path / "out"), "probe_dir": str(tmp_path / "probe"), "max_steps": 10}
    launch(EQUIVALENCE, json.dumps(spec), num_processes=2, timeout=400)
    reports = reports_of(tmp_path / "probe", 2)
    for report in reports:
        assert report["world_size"] == 2 and report["ddp_group_size"] == 2 and report["rounds"] == 2
        assert report["moved"] > 1e-3  # the models trained
        assert report["max_abs_diff"] <= 1e-5, report
    params = [safetensors.torch.load_file(tmp_path / "probe" / f"params-rank{r}.safetensors") for r in range(2)]
    assert torch.equal(params[0]["adloco"], params[1]["adloco"])


@pytest.mark.parametrize(
    "options",
    [
        dict(merge_transport="all_reduce", eval_merged_model=True),
        dict(
            merge_transport="point_to_point",
            instance_init="independent",
            pseudo_grad_compression="int8",
            eval_merged_model=True,
        ),
    ],
    ids=["all_reduce", "point_to_point"],
)
def test_a_merge_of_two_workers_of_two_processes(tmp_path, options):
    config = dict(
        max_steps=20, inner_steps=10, num_instances=2, merge_every=2, save_strategy="no", eval_strategy="steps",
        eval_steps=10, **options,
    )  # fmt: skip
    out, probe = run(tmp_path, config, eval=True)
    reports = reports_of(probe, 4)
    assert all(r["world_size"] == 4 for r in reports)
    # Evaluated at step 10 while two instances trained: each instance's loss is that of its own weights (checked
    # inside every process against a direct evaluation, `EvalProbe`), then the merged model at the end.
    for report in reports:
        instances = [check["instance"] for check in report["eval_checks"]]
        assert instances[0] == report["worker_id"] and instances[-1] == "merged", instances
    rounds = rounds_of(out)
    for step in (1, 2):
        lines = sorted(
            (line["instance"], line["workers"], line["processes"]) for line in rounds if line["outer_step"] == step
        )
        assert lines == [(0, [0], [0, 1]), (1, [1], [2, 3])]
    assert [line["num_instances"] for line in rounds] == [2, 2, 1, 1]
    assert sum(bool(line["merged_from"]) for line in rounds) == 1

    # The merge equals the demand-weighted average of the instances' φ before it (saved by worker w's local rank 0).
    folder = os.path.join(out, "merges", "outer-2")
    info = json.load(open(os.path.join(folder, "adloco_merge.json")))
    premerge = probe / "merges"

    def phi_of(worker):
        name = next(f for f in sorted(os.listdir(premerge)) if f.startswith(f"premerge-rank{worker}-0-"))
        return safetensors.torch.load_file(os.path.join(premerge, name))["phi"]

    survivor, merged = info["instances"]
    assert phi_of(0).ne(phi_of(1)).any()
    expected = info["weights"][0] * phi_of(survivor) + info["weights"][1] * phi_of(merged)
    saved = flat_params(AutoModelForCausalLM.from_pretrained(folder))
    assert (saved - expected).abs().max().item() < 1e-6
    # Every process ends with merged/.
    final = merged_params(out)
    for rank in range(4):
        params = safetensors.torch.load_file(probe / f"final-rank{rank}.safetensors")["params"]
        assert torch.equal(params, final)


RESUME = dict(
    max_steps=20, inner_steps=5, save_steps=10, num_instances=2, merge_every=3, lr_batch_scaling="sqrt",
)  # fmt: skip


def test_stop_and_resume_with_two_processes_per_worker(tmp_path):
    """Preemption in units of workers, then an exact resume: SIGTERM to one process (rank 1, local rank 1 of worker
    0) at step 12; every process of every worker agrees to stop at the round's end (15) and saves checkpoint-15, and
    the resumed run ends as the uninterrupted one. Checkpoint-10 of the same run is resumed elastically on 3 workers
    below."""
    full, _ = run(tmp_path, RESUME, name="full", dropout=0.1)
    part = str(tmp_path / "part")
    spec = worker_spec(part, tmp_path / "probe-part", 4, {**BASE, **RESUME}, dropout=0.1, sigterm=[1, 12, "self"])
    output = launch_failing(WORKER, json.dumps(spec), num_processes=4, timeout=400)  # TrainingPreempted: exit != 0
    assert "training was preempted" in output
    assert sorted(name for name in os.listdir(part) if name.startswith("checkpoint-")) == [
        "checkpoint-10",
        "checkpoint-15",
    ]
    assert not os.path.isdir(os.path.join(part, "merged"))
    shutil.copytree(part, str(tmp_path / "elastic"))  # resumed elastically below, on 3 workers
    for rank in range(4):
        state = torch.load(os.path.join(part, "checkpoint-10", "adloco", f"rank-{rank}.pt"), weights_only=True)
        assert state["world_size"] == 4 and state["processes_per_worker"] == 2
        assert [row[3] for row in state["instances"]] == [[0], [1]]  # worker ids
        state = torch.load(os.path.join(part, "checkpoint-15", "adloco", f"rank-{rank}.pt"), weights_only=True)
        assert state["world_size"] == 4 and state["outer_step"] == 3 and state["round"] is None
    run(tmp_path, RESUME, name="part", dropout=0.1, resume=os.path.join(part, "checkpoint-15"))

    assert (merged_params(part) - merged_params(full)).abs().max().item() <= 1e-6
    assert comparable_rounds(part) == comparable_rounds(full)
    assert any(line["merged_from"] for line in rounds_of(full) if line["outer_step"] == 3)

    # The same checkpoint on 3 workers of 2 processes (an elastic resume in units of workers): the new worker 2
    # joins an instance; each of its processes takes the state of the same local rank of the instance's old first
    # worker, and the data is re-split over the 6 processes.
    elastic = str(tmp_path / "elastic")
    saved = [torch.load(os.path.join(elastic, "checkpoint-10", "adloco", f"rank-{r}.pt"), weights_only=True)
             for r in range(4)]  # fmt: skip
    _, probe = run(tmp_path, RESUME, world_size=6, name="elastic", dropout=0.1,
                   resume=os.path.join(elastic, "checkpoint-10"), probe_resume=True)  # fmt: skip
    reports = reports_of(probe, world_size=6)
    assert [(r["world_size"], r["worker_id"]) for r in reports] == [(6, rank // 2) for rank in range(6)]
    assert all(r["steps_checked_in_worker"] == 10 for r in reports)  # the processes of each worker agreed
    resumes = [json.loads(line) for line in open(os.path.join(elastic, "adloco_resumes.jsonl"))]
    assert len(resumes) == 1 and (resumes[0]["from_workers"], resumes[0]["to_workers"]) == (2, 3)
    after = {int(i): workers for i, workers in resumes[0]["workers_after"].items()}
    assert sorted(w for workers in after.values() for w in workers) == [0, 1, 2]
    for rank in range(6):
        worker, local = divmod(rank, 2)
        instance = next(i for i, workers in after.items() if worker in workers)
        source = saved[2 * instance + local]  # instance i's old first worker is worker i (one worker each)
        restored = safetensors.torch.load_file(str(probe / f"resume-rank{rank}.safetensors"))
        assert torch.equal(restored["phi"], source["global_model"]["phi"]), rank
    elastic_rounds = [line for line in rounds_of(elastic) if line["outer_step"] > 2]
    assert sorted({w for line in elastic_rounds for w in line["workers"]}) == [0, 1, 2]
    assert all(
        line["processes"] == [p for w in line["workers"] for p in (2 * w, 2 * w + 1)] for line in elastic_rounds
    )
    assert os.path.isfile(os.path.join(elastic, "merged", "model.safetensors"))
