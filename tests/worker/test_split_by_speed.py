"""`worker_batch_split="speed"` with real workers (`scripts/adloco_worker.py`): a slowed worker's share, the weighted
average of pseudo-gradients, exact resume with the split in the checkpoint, and equal speeds giving today's run.

A worker is slowed by a delay per sample inside its inner steps (`slow`), 0.2 s a sample against a few milliseconds of
compute: its speed is then what decides, by a factor of 20 or more, on any machine. No assertion reads a time; they
read the split it leads to, and a delay dominant enough makes that split the same in every run (the slow worker's
share falls to one sample, where any faster split would end the round later).
"""

import os
import shutil

import pytest
import safetensors.torch
import torch
from helpers import (
    SCRIPTS,
    TWO_BY_TWO,
    comparable_rounds,
    launch_run,
    merged_params,
    reports_of,
    rounds_of,
)


pytestmark = pytest.mark.multiprocess

WORKER = os.path.join(SCRIPTS, "adloco_worker.py")

# Two workers, one instance; worker 1 slowed. outer_lr 1 without momentum in float32, so that the workers check
# after every round that φ is the sample-weighted average of their weights (`AfterSync.max_mean_error`). The norm
# test measures and grows the request (up to the cap) from the unequal batches; a checkpoint at step 10.
SLOW = dict(
    seed=3, optim="adamw_torch", learning_rate=3e-3, max_steps=20, inner_steps=5, save_steps=10,
    per_device_train_batch_size=4, max_batch_size=8, batch_size_cap=8, eta=0.5, outer_lr=1.0, outer_momentum=0.0,
    pseudo_grad_dtype="float32", worker_batch_split="speed",
)  # fmt: skip
DELAY = 0.2


@pytest.fixture(scope="module")
def slow_run(tmp_path_factory):
    return launch_run(WORKER, tmp_path_factory.mktemp("slow"), SLOW, world_size=2, slow={"1": DELAY})


def test_a_slowed_worker_gets_a_smaller_share_and_the_average_weighs_samples(slow_run):
    out, probe = slow_run
    reports = reports_of(probe, 2)
    rounds = rounds_of(out)
    assert [line["outer_step"] for line in rounds] == [1, 2, 3, 4]
    # Round 1 runs equal batches (nothing measured yet); from round 2 the slow worker trains one sample a step.
    shares = [line["worker_batch_sizes"] for line in rounds]
    assert shares[0] == [4, 4]
    for line, split in zip(rounds[1:], shares[1:]):
        assert split == [2 * line["batch_size"] - 1, 1]  # the instance's total is the request × 2, as before
    # Each worker's speed is logged: the slowed worker's seconds per sample include its delay (at least DELAY), far
    # above the other's compute of a few milliseconds a sample.
    for line in rounds:
        fast, slow = line["worker_sample_seconds"]
        assert slow >= DELAY and 0 < fast < slow
    for rank, report in enumerate(reports):
        assert report["world_size"] == 2
        assert report["seen_batches"] == [split[rank] for split in shares for _ in range(5)]
        # After every outer step φ = Σ_w (n_w / N) θ_w: the samples each worker trained in the round.
        assert report["mean_checks"] == 4 and report["max_mean_error"] < 1e-6
        assert report["round_samples"] == [[5.0 * s for s in split] for split in shares]
    # The statistics pool over the unequal batches: the norm test grew the request.
    assert rounds[-1]["batch_size"] > 4 and all(line["grad_variance"] is not None for line in rounds)
    assert all(line["samples"] == 5 * sum(split) for line, split in zip(rounds, shares))


def test_resuming_the_checkpoint_continues_with_its_split_exactly(slow_run, tmp_path):
    out, _ = slow_run
    resumed = str(tmp_path / "out")
    os.makedirs(resumed)
    shutil.copytree(os.path.join(out, "checkpoint-10"), os.path.join(resumed, "checkpoint-10"))
    state = torch.load(os.path.join(resumed, "checkpoint-10", "adloco", "rank-0.pt"), weights_only=True)
    (row,) = state["instances"]
    assert row[-1] == rounds_of(out)[2]["worker_batch_sizes"]  # round 3's split is in the checkpoint
    launch_run(
        WORKER,
        tmp_path,
        SLOW,
        world_size=2,
        name="out",
        slow={"1": DELAY},
        resume=os.path.join(resumed, "checkpoint-10"),
    )
    assert comparable_rounds(resumed) == comparable_rounds(out)[2:]
    assert (merged_params(resumed) - merged_params(out)).abs().max().item() <= 1e-6


def test_equal_speeds_give_the_run_of_equal_batches(tmp_path, two_by_two_ddp):
    # helpers.TWO_BY_TWO (2 workers of 2 processes) with the split by speed, every process slowed alike: their
    # speeds then differ by far less than a re-split needs (1.58 × for 3 + 1 processes' halves against 2 + 2).
    config = dict(TWO_BY_TWO, worker_batch_split="speed")
    out, probe = launch_run(WORKER, tmp_path, config, world_size=4, name="speed", slow={"all": 0.1})
    assert all(report["world_size"] == 4 for report in reports_of(probe, 4))
    equal, _ = two_by_two_ddp
    assert comparable_rounds(out) == comparable_rounds(equal)
    assert all(line["worker_batch_sizes"] == [4, 4] for line in rounds_of(out))
    assert torch.equal(merged_params(out), merged_params(equal))
    final = safetensors.torch.load_file(str(probe / "final-rank3.safetensors"))["params"]
    assert torch.equal(final, merged_params(equal))
