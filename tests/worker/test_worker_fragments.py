"""Streaming DiLoCo (`num_fragments`, `fragment_sync_delay`, `fragment_update_alpha`) on real `accelerate launch`
workers: the fragments' path equals blocking DiLoCo when it should, keeps φ shared after every fragment's sync,
sends every fragment once per round, and a run stopped with a fragment's average in flight resumes exactly (also on
another number of workers, and with two processes per worker)."""

import json
import os
import shutil

import pytest
import torch
from helpers import (
    RESUME_CONFIG,
    SCRIPTS,
    TWO_BY_TWO,
    comparable_rounds,
    launch,
    launch_run,
    merged_params,
    reports_of,
    rounds_of,
    worker_spec,
)

from adloco_hf.outer.compression import wire_bytes
from adloco_hf.outer.fragments import fragment_ranges


pytestmark = pytest.mark.multiprocess

WORKER = os.path.join(SCRIPTS, "adloco_worker.py")
# What a resumed or equivalent run must reproduce: the rounds file but its timings.
TIMINGS = ("comm_seconds", "outer_seconds", "elapsed_seconds", "merge_seconds", "worker_sample_seconds")
# RESUME_CONFIG's run (2 workers, rounds of H = 5, 2 one-worker instances) in 2 fragments: fragment 1 is sent after
# inner step ⌊5/2⌋ = 2 of each round and fragment 0 at its end, each average applied τ = 2 steps later, mixed with
# the local weights by α = 0.5; int4 pseudo-gradients with error feedback. The instances merge at round 2 (step 10),
# so the checkpoint at step 20 holds one instance of 2 workers with fragment 0's average in flight (due at step 22).
STREAMED = dict(
    RESUME_CONFIG,
    merge_every=2,
    compression_block_size=32,
    pseudo_grad_compression="int4",
    num_fragments=2,
    fragment_sync_delay=2,
    fragment_update_alpha=0.5,
)


def run(out, probe, config, world_size=2, **extra):
    """One launch of `scripts/adloco_worker.py` (attention dropout 0.1, as the resume reference's)."""
    spec = worker_spec(out, probe, world_size, config, dropout=0.1, **extra)
    return launch(WORKER, json.dumps(spec), num_processes=world_size, timeout=300)


def without_timings(out):
    return [{k: v for k, v in line.items() if k not in TIMINGS} for line in rounds_of(out)]


def test_one_fragment_without_delay_or_mix_is_blocking_diloco_bit_for_bit(tmp_path, resume_reference):
    """RESUME_CONFIG through the fragments' path with P = 1, τ = 0, α = 0 (bfloat16 all-reduces, instances of one
    and two workers, a merge, adaptive batches): the same rounds file and the same merged model as blocking DiLoCo's
    run of the same config (the session's `resume_reference`)."""
    out = str(tmp_path / "one")
    config = dict(RESUME_CONFIG, num_fragments=1, fragment_sync_delay=0, fragment_update_alpha=0.0)
    run(out, tmp_path / "probe", config)
    assert torch.equal(merged_params(out), merged_params(resume_reference))
    assert without_timings(out) == without_timings(resume_reference)
    reports = reports_of(tmp_path / "probe", 2)
    assert [r["world_size"] for r in reports] == [2, 2]
    assert all(r["phi_checks"] == 6 for r in reports)  # φ shared after each of the 6 rounds' one sync
    assert reports[0]["fragment_applied"] == [[5 * r, 0] for r in range(1, 7)]


@pytest.fixture(scope="module")
def streamed_reference(tmp_path_factory):
    """The uninterrupted run of `STREAMED`: (output folder, probe folder)."""
    root = tmp_path_factory.mktemp("streamed")
    out = str(root / "full")
    run(out, root / "probe", STREAMED)
    return out, root / "probe"


def test_every_fragment_is_synced_once_per_round_with_phi_shared_after_each_sync(streamed_reference):
    out, probe = streamed_reference
    reports = reports_of(probe, 2)
    assert [r["world_size"] for r in reports] == [2, 2]
    h, steps, merge_at = STREAMED["inner_steps"], STREAMED["max_steps"], 2 * STREAMED["inner_steps"]
    # Fragment 1 is sent after offset ⌊5/2⌋ = 2 of each round, fragment 0 at its end. A merge (round 2's end, step
    # 10) and the end of training are points where every fragment is synced: the average in flight is applied there
    # and fragment 1, which trained on since its send, is synced once more, at once.
    schedule = [[r * h + offset, p] for r in range(steps // h) for offset, p in ((2, 1), (h, 0))]
    sent = schedule[:4] + [[merge_at, 1]] + schedule[4:] + [[steps, 1]]
    applied = [[s if s in (merge_at, steps) else s + 2, p] for s, p in sent]
    for report in reports:
        assert report["fragment_sent"] == sent
        assert report["fragment_applied"] == applied
        assert report["phi_checks"] == len({s for s, _ in applied}) - 1  # after every sync but the final one
    # One instance of 2 workers after the merge: each round sends both fragments as int4 blocks of 32.
    numel = reports[0]["numel"]
    payload = sum(wire_bytes(b - a, bits=4, block_size=32) for a, b in fragment_ranges(numel, 2))
    after = [line["comm_bytes"] for line in rounds_of(out) if line["outer_step"] > 2]
    assert after == [2 * payload] * 4


def test_a_run_stopped_with_a_fragment_in_flight_resumes_exactly_also_on_three_workers(tmp_path, streamed_reference):
    full, _ = streamed_reference
    part = str(tmp_path / "part")
    run(part, tmp_path / "p1", STREAMED, fail=["all", 22, 0])  # every worker gone after checkpoint-20
    checkpoint = os.path.join(part, "checkpoint-20")
    for rank in range(2):
        saved = torch.load(os.path.join(checkpoint, "adloco", f"rank-{rank}.pt"), weights_only=True)
        fragments = saved["global_model"]["fragments"]
        assert fragments["in_flight"]["fragment"] == 0 and fragments["in_flight"]["apply_step"] == 22
        assert all(ef["residual"] is not None for ef in fragments["error_feedback"])  # a residual per fragment
        assert saved["global_model"]["pending"] is None and saved["global_model"]["eager"] is None
    elastic = str(tmp_path / "elastic")
    shutil.copytree(part, elastic)  # resumed on 3 workers below
    run(part, tmp_path / "p2", STREAMED, resume=checkpoint)
    assert (merged_params(part) - merged_params(full)).abs().max().item() <= 1e-6
    assert comparable_rounds(part) == comparable_rounds(full)

    # The same checkpoint on 3 workers: the average in flight is applied at the resume and every worker's own
    # weights and residuals dropped, so the three workers of the one instance share φ after every fragment's sync
    # (asserted inside the workers) and the run completes.
    run(elastic, tmp_path / "p3", STREAMED, world_size=3, resume=os.path.join(elastic, "checkpoint-20"))
    reports = reports_of(tmp_path / "p3", 3)
    assert [r["world_size"] for r in reports] == [3, 3, 3]
    # Fragment 0's average, due at step 22, applied at the resume; then fragment 1's of steps 24 and 29 and fragment
    # 0's of step 27, each followed by a check.
    assert all(r["phi_checks"] == 3 for r in reports)
    assert [line["workers"] for line in rounds_of(elastic) if line["outer_step"] > 4] == [[0, 1, 2], [0, 1, 2]]
    assert os.path.isfile(os.path.join(elastic, "merged", "model.safetensors"))


# TWO_BY_TWO (2 workers of 2 processes, float32, rounds of H = 4) in 2 fragments, τ = 1, α = 0.5.
TWO_BY_TWO_STREAMED = dict(TWO_BY_TWO, num_fragments=2, fragment_sync_delay=1, fragment_update_alpha=0.5)


@pytest.fixture(scope="module")
def two_by_two_streamed(tmp_path_factory):
    """(output folder, probe folder) of `TWO_BY_TWO_STREAMED` with DDP inside each worker."""
    return launch_run(WORKER, tmp_path_factory.mktemp("two-by-two"), TWO_BY_TWO_STREAMED, world_size=4)


def test_two_processes_per_worker_stream_their_slices_of_each_fragment(two_by_two_streamed):
    """Two workers of two DDP processes: local rank l sends slice l of each fragment across the workers and the
    slices are gathered inside the worker, so both processes of a worker hold the same weights after every step
    (asserted inside them), and φ is shared after every fragment's sync."""
    out, probe = two_by_two_streamed
    reports = reports_of(probe, 4)
    assert [r["world_size"] for r in reports] == [4] * 4
    # Fragment 1 is sent after steps 2, 6, 10 and fragment 0 after 4, 8, 12, each applied a step later (the last
    # one at the end of training): 5 syncs during training, each followed by a check.
    assert all(r["steps_checked_in_worker"] == 12 and r["phi_checks"] == 5 for r in reports)
    numel = reports[0]["numel"]
    halves = [[(b - a + 1) // 2, (b - a) // 2] for a, b in fragment_ranges(numel, 2)]
    for line in rounds_of(out):
        # Each process sends its half of both fragments in float32 (TWO_BY_TWO's pseudo_grad_dtype).
        assert line["process_payload_bytes"] == [4 * (halves[0][0] + halves[1][0]), 4 * (halves[0][1] + halves[1][1])]


def test_fsdp_workers_stream_their_shards_like_ddp_workers(tmp_path, two_by_two_streamed):
    """The same run with each worker's replica sharded by FSDP: φ and each fragment are this process's shards'
    (the same shard as the other workers' local rank), so the run follows the DDP run up to the float order of the
    reductions."""
    config = dict(TWO_BY_TWO_STREAMED, worker_parallelism="fsdp")
    out, probe = launch_run(os.path.join(SCRIPTS, "fsdp_worker.py"), tmp_path, config, world_size=4)
    reports = reports_of(probe, 4)
    assert [r["world_size"] for r in reports] == [4] * 4 and all(r["sharded"] for r in reports)
    assert all(r["steps_checked"] == 12 for r in reports)  # the processes of a worker agree after every step
    ddp, _ = two_by_two_streamed
    assert (merged_params(out) - merged_params(ddp)).abs().max().item() <= 1e-5
    sharded, whole = rounds_of(out), rounds_of(ddp)
    assert [line["train_loss"] for line in sharded] == pytest.approx([line["train_loss"] for line in whole], rel=1e-5)
    assert [line["pseudo_grad_norm"] for line in sharded] == pytest.approx(
        [line["pseudo_grad_norm"] for line in whole], rel=1e-5
    )
