"""`inner_steps_rule="outer_noise"` with real workers: H doubles at round ends while the workers' pseudo-gradients
agree, the rounds file records each round's H and outer noise, and a stopped run resumes into the same run."""

import json
import os

import pytest
from helpers import SCRIPTS, comparable_rounds, launch, merged_params, rounds_of, worker_spec


pytestmark = pytest.mark.multiprocess

WORKER = os.path.join(SCRIPTS, "adloco_worker.py")
# theta^2 = 0.1: the first rounds' outer noise (~0.2 here) keeps H at 5, later rounds' (< 0.08) doubles it, so both
# branches of the rule run (theta = 100 would double at every round end whatever the noise measured).
THETA = 0.1**0.5
CONFIG = dict(
    max_steps=40, inner_steps=5, inner_steps_rule="outer_noise", max_inner_steps=20, outer_noise_theta=THETA,
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
    lines = rounds_of(full)
    assert all(r["rounds_checked"] == len(lines) for r in reports)  # replicas identical after every round end
    # The rule, applied here to the outer noise the workers measured: a round started at `step` with H inner steps
    # ends at the next multiple of H; H doubles (up to 20) after a round whose noise is at most theta^2.
    h, step, doubled, kept = 5, 0, 0, 0
    for line in lines:
        end = (step // h + 1) * h
        assert (line["global_step"], line["inner_steps"]) == (end, end - step), (line, h, step)
        assert line["outer_noise"] is not None and line["outer_noise"] >= 0
        if line["outer_noise"] <= THETA**2:
            h, doubled = min(2 * h, 20), doubled + 1
        else:
            kept += 1
        step = end
    assert step == 40 and doubled >= 1 and kept >= 1, lines  # both branches ran
    assert lines[0]["outer_noise"] > THETA**2 and lines[0]["inner_steps"] == lines[1]["inner_steps"] == 5
    used = [line["batch_size"] if line["accumulation_steps"] > 1 else line["micro_batch_size"] for line in lines]
    assert [line["samples"] for line in lines] == [2 * line["inner_steps"] * b for line, b in zip(lines, used)]

    part = str(tmp_path / "part")
    launch(WORKER, json.dumps(spec(part, str(tmp_path / "p1"), fail=["all", 22, 0])), num_processes=2)
    checkpoint = os.path.join(part, "checkpoint-20")
    assert os.path.isdir(checkpoint) and not os.path.isdir(os.path.join(part, "merged"))
    launch(WORKER, json.dumps(spec(part, str(tmp_path / "p2"), resume=checkpoint)), num_processes=2)
    keep = ("global_step", "inner_steps", "outer_noise", "batch_size", "samples", "train_loss", "pseudo_grad_norm")
    assert comparable_rounds(part, keep) == comparable_rounds(full, keep)

    assert (merged_params(part) - merged_params(full)).abs().max().item() <= 1e-6
