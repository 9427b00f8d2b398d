"""`inner_steps_rule="outer_noise"` with real workers: H doubles at round ends while the workers' pseudo-gradients
agree, the rounds file records each round's H and outer noise, and a stopped run resumes into the same run."""

import json
import os

import pytest
from helpers import SCRIPTS, comparable_rounds, launch, merged_params, rounds_of, worker_spec


pytestmark = pytest.mark.multiprocess

WORKER = os.path.join(SCRIPTS, "adloco_worker.py")
# theta = 100: the test always passes, so H doubles at every round end (5 -> 10 -> 20, the cap).
CONFIG = dict(
    max_steps=40, inner_steps=5, inner_steps_rule="outer_noise", max_inner_steps=20, outer_noise_theta=100.0,
    save_steps=20, num_instances=1, per_device_train_batch_size=2, max_batch_size=4, eta=0.5, seed=3,
    optim="adamw_torch", learning_rate=3e-3,
)  # fmt: skip


def spec(out, probe, **extra):
    return worker_spec(out, probe, 2, CONFIG, dropout=0.1, num_samples=96, **extra)


def test_h_doubles_and_a_stopped_run_resumes_into_the_same_run(tmp_path):
    full = str(tmp_path / "full")
    launch(WORKER, json.dumps(spec(full, str(tmp_path / "p0"))), num_processes=2)
    reports = [json.load(open(tmp_path / "p0" / f"report-rank{rank}.json")) for rank in range(2)]
    assert [r["world_size"] for r in reports] == [2, 2]
    assert all(r["rounds_checked"] == 4 for r in reports)  # replicas identical after each of the 4 round ends
    lines = rounds_of(full)
    # Round ends at multiples of the round's H: 5 (H 5), 10 (H 10: 5 steps), 20 (H 20: 10 steps), 40 (20 steps).
    assert [line["global_step"] for line in lines] == [5, 10, 20, 40]
    assert [line["inner_steps"] for line in lines] == [5, 5, 10, 20]
    assert all(line["outer_noise"] is not None and line["outer_noise"] >= 0 for line in lines)
    used = [line["batch_size"] if line["accumulation_steps"] > 1 else line["micro_batch_size"] for line in lines]
    assert [line["samples"] for line in lines] == [2 * h * b for h, b in zip([5, 5, 10, 20], used)]

    part = str(tmp_path / "part")
    launch(WORKER, json.dumps(spec(part, str(tmp_path / "p1"), fail=["all", 22, 0])), num_processes=2)
    checkpoint = os.path.join(part, "checkpoint-20")
    assert os.path.isdir(checkpoint) and not os.path.isdir(os.path.join(part, "merged"))
    launch(WORKER, json.dumps(spec(part, str(tmp_path / "p2"), resume=checkpoint)), num_processes=2)
    keep = ("global_step", "inner_steps", "outer_noise", "batch_size", "samples", "train_loss", "pseudo_grad_norm")
    assert comparable_rounds(part, keep) == comparable_rounds(full, keep)

    assert (merged_params(part) - merged_params(full)).abs().max().item() <= 1e-6
