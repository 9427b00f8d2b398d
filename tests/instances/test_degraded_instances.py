"""A worker that turns NaN for good, with real workers: the merge leaves its untrained instance out, the rounds its
instance skips are counted, and the run stops with an error naming it instead of training on silently."""

import json
import os

import pytest
import safetensors.torch
import torch
from helpers import SCRIPTS, flat_params, launch, launch_failing
from transformers import AutoModelForCausalLM

from adloco_hf.reporting.run_log import load_rounds


pytestmark = pytest.mark.multiprocess

WORKER = os.path.join(SCRIPTS, "adloco_worker.py")

# 2 workers in 2 instances that merge at round 3; rank 1 is instance 1's only worker.
CONFIG = dict(
    max_steps=40, inner_steps=5, save_steps=10, num_instances=2, merge_every=3, per_device_train_batch_size=2,
    max_batch_size=4, eta=0.5, seed=3, optim="adamw_torch", learning_rate=3e-3,
)  # fmt: skip


def run(out, probe, nan, *, expect_failure=False):
    spec = {
        "output_dir": out,
        "world_size": 2,
        "probe_dir": probe,
        "config": {"output_dir": out, **CONFIG},
        "nan": nan,
    }
    if not expect_failure:
        result = launch(WORKER, json.dumps(spec), num_processes=2, timeout=300)
        return result.stdout + result.stderr
    return launch_failing(WORKER, json.dumps(spec), num_processes=2, timeout=300)  # all of it: round lines first


def lines_of(out, instance):
    return [line for line in load_rounds(out) if line["instance"] == instance]


def test_a_worker_nan_for_the_whole_run_is_left_out_of_merges_and_stops_the_run_naming_it(tmp_path):
    out, probe = str(tmp_path / "out"), tmp_path / "p"
    output = run(out, str(probe), [1, 0, "onwards"], expect_failure=True)  # rank 1 poisoned before every step

    # Instance 1 (rank 1 alone) skips every round; each one is logged at WARNING with its count.
    assert [(line["skipped"], line["skipped_in_a_row"]) for line in lines_of(out, 1)] == [
        (True, 1),
        (True, 2),
        (True, 3),
    ]
    assert "| SKIPPED (non-finite) [1] (i1: 3 in a row)" in output
    # At round 3 it merges into the healthy instance 0 with weight 0, not its demand's, and a warning names it.
    merge = json.load(open(os.path.join(out, "merges", "outer-3", "adloco_merge.json")))
    assert merge["survivor"] == 0 and merge["weights"] == [1.0, 0.0]
    assert "round 3: instance 1 (worker rank(s) [1]) made no progress: all its 3 round(s) since the start" in output
    assert "with weight 0, not its demand's" in output
    before = safetensors.torch.load_file(str(probe / "merges" / "premerge-rank0-0-i0-1.safetensors"))["phi"]
    saved = flat_params(AutoModelForCausalLM.from_pretrained(os.path.join(out, "merges", "outer-3")))
    assert torch.equal(saved, before)  # instance 0's weights alone: none of instance 1's starting weights

    # Why instance 0 skips from round 4 on: the merge seated rank 1 in it, and one worker's NaN pseudo-gradient makes
    # its instance's average NaN. Instance 0 trained every round before that.
    healthy = lines_of(out, 0)
    assert [line["skipped"] for line in healthy[:3]] == [False, False, False]
    assert [(line["workers"], line["skipped_in_a_row"]) for line in healthy[3:]] == [([0, 1], n) for n in (1, 2, 3, 4)]
    # The 4th in a row is more than max_skipped_rounds=3: every worker stops there with an error that says what to do.
    assert (
        "SkippedRoundsError: AdLoCo, round 7 (step 35): instance 0 (worker rank(s) [0, 1]) skipped rounds 4-7 "
        "(4 in a row, more than max_skipped_rounds=3)" in output
    )
    assert "have not moved since round 3; the training loss was not finite on worker rank(s) [1]" in output
    assert "The last checkpoint (" in output and "checkpoint-30) is intact" in output
    assert not os.path.exists(os.path.join(out, "merged"))


def test_a_passing_nan_skips_one_round_of_its_own_instance_and_nothing_else(tmp_path):
    out = str(tmp_path / "out")
    output = run(out, str(tmp_path / "p"), [1, 0])  # rank 1 poisoned before its first step only
    assert [line["skipped"] for line in lines_of(out, 1)] == [True, False, False]
    assert not any(line["skipped"] for line in lines_of(out, 0))  # before and after the merge
    merge = json.load(open(os.path.join(out, "merges", "outer-3", "adloco_merge.json")))
    # Instance 1 trained in rounds 2 and 3: it merges with its demand's weight, d = batch × workers (one worker each)
    # with the batch each instance ran in round 3 (switch mode runs the micro-batch alone when it does not accumulate).
    demand = {
        line["instance"]: line["batch_size"] if line["accumulation_steps"] > 1 else line["micro_batch_size"]
        for line in load_rounds(out)
        if line["outer_step"] == 3
    }
    assert sorted(merge["instances"]) == [0, 1] and demand[0] != demand[1]
    total = demand[0] + demand[1]
    assert merge["weights"] == pytest.approx([demand[i] / total for i in merge["instances"]], abs=1e-12)
    assert "made no progress" not in output and "SkippedRoundsError" not in output
    assert os.path.isfile(os.path.join(out, "merged", "model.safetensors"))
