"""A run interrupted after its last step (in the final merge, `merged/` save, evaluation or push) and resumed from
its final checkpoint: only what is missing is redone, never a training step, never a new checkpoint."""

import json
import os

import pytest
from helpers import RESUME_CONFIG, SCRIPTS, launch, launch_failing, merged_params, root_cause

from adloco_hf.reporting.run_log import MERGED, load_evals, load_rounds


pytestmark = pytest.mark.multiprocess

WORKER = os.path.join(SCRIPTS, "adloco_worker.py")

# 2 workers, 2 instances merging at round 4, growing batches, dropout, an evaluation every 2 rounds; the Trainer
# saves checkpoint-30 at max_steps=30 (save_strategy "steps" always saves at the last step).
CONFIG = dict(RESUME_CONFIG, eval_strategy="steps", eval_steps=10)


def run(out, probe, *, expect_failure=False, **extra):
    spec = {
        "output_dir": out,
        "world_size": 2,
        "probe_dir": probe,
        "config": {"output_dir": out, **CONFIG},
        "dropout": 0.1,
        "eval": True,
        **extra,
    }
    if not expect_failure:
        return launch(WORKER, json.dumps(spec), num_processes=2, timeout=300)
    return launch_failing(WORKER, json.dumps(spec), num_processes=2, timeout=300)


def test_a_run_killed_in_its_final_merged_save_is_finished_without_training_again(tmp_path):
    full = str(tmp_path / "full")
    run(full, str(tmp_path / "p0"))

    out = str(tmp_path / "out")
    output = run(out, str(tmp_path / "p1"), kill_in_merged_save=True, expect_failure=True)
    assert root_cause(output) == (0, 1)  # rank 0, killed (os._exit(1)) inside the merged/ save
    names = os.listdir(out)
    assert "checkpoint-30" in names and "merged" not in names
    assert any(name.startswith(".merged.tmp-") for name in names)  # the half-done save, never renamed into place
    assert not [line for line in load_evals(out) if line["instance"] == MERGED]

    run(out, str(tmp_path / "p2"), resume=True)
    names = os.listdir(out)
    assert sorted(int(n.split("-")[1]) for n in names if n.startswith("checkpoint-")) == [10, 20, 30]  # no 31
    assert os.path.isfile(os.path.join(out, "merged", "model.safetensors"))
    for rank in range(2):
        report = json.load(open(tmp_path / "p2" / f"report-rank{rank}.json"))
        assert report["seen_batches"] == [] and report["rounds_checked"] == 0  # not one training step
    assert (merged_params(out) - merged_params(full)).abs().max().item() <= 1e-6
    merged_evals = [line for line in load_evals(out) if line["instance"] == MERGED]
    assert len(merged_evals) == 1 and merged_evals[0]["global_step"] == 30
    full_evals = [line for line in load_evals(full) if line["instance"] == MERGED]
    assert merged_evals[0]["eval_loss"] == pytest.approx(full_evals[0]["eval_loss"], abs=1e-6)
    steps = [(line["outer_step"], line["instance"]) for line in load_rounds(out)]
    assert steps == [(line["outer_step"], line["instance"]) for line in load_rounds(full)]  # no round redone
