"""`worker_batch_split="speed"` in a round's decision (pure): every instance's split of its total among its workers,
from the seconds each worker measured, with hysteresis, through merges, checkpoints' rows and `processes_per_worker`."""

from dataclasses import replace

import pytest
from helpers import PAPER_ROUNDS, round_rules

from adloco_hf.batch.size_tests import GradientStatistics
from adloco_hf.instances.table import Instance, plan_merge, reassign_workers
from adloco_hf.rounds.decision import decide_round, worker_sample_seconds
from adloco_hf.rounds.rows import WorkerReport


def rules(**overrides):
    """A fixed batch (no test), micro-batches of at most 8, no merges; `overrides` are `AdLoCoConfig` fields."""
    base = dict(PAPER_ROUNDS, batch_size_test="none", merge_every=0, max_batch_size=8, worker_batch_split="speed")
    return round_rules(**{**base, **overrides})


def report(instance: int, samples: int, seconds: float) -> WorkerReport:
    """One process's round: `samples` trained in `seconds` of inner steps."""
    return WorkerReport(
        instance=instance,
        stats=GradientStatistics.missing(),
        loss_sum=10.0,
        loss_steps=5,
        samples=samples,
        tokens=32.0 * samples,
        pseudo_grad_norm=0.5,
        payload_bytes=1000,
        comm_seconds=0.01,
        outer_seconds=0.02,
        skipped=False,
        step_seconds=seconds,
    )


def decide(table, reports, **rule_overrides):
    return decide_round(table, reports, outer_step=1, global_step=5, rules=rules(**rule_overrides))


def test_a_slow_worker_gets_a_smaller_share_of_the_same_total():
    # Two workers at 4 samples per step for 5 steps; worker 1 takes 3 × as long per sample.
    table = [Instance(0, (0, 1), 4)]
    decision = decide(table, [report(0, 20, 1.0), report(0, 20, 3.0)])
    inst = decision.instances[0]
    assert inst.shares == (6, 2) and sum(inst.shares) == 8  # max(6 × 0.05, 2 × 0.15) = 0.3 s a step, not 0.6 s
    assert inst.batch_size == 4  # the request (and the controller's total) does not change
    line = decision.lines[0]
    assert line.worker_batch_sizes == [4, 4]  # what the round that ended ran
    assert line.worker_sample_seconds == pytest.approx([0.05, 0.15])
    assert line.to_json()["worker_batch_sizes"] == [4, 4]
    # The next round's line reports the split it ran.
    after = decide(decision.instances, [report(0, 30, 1.5), report(0, 10, 1.5)])
    assert after.lines[0].worker_batch_sizes == [6, 2]
    assert after.instances[0].shares == (6, 2)  # 0.05 and 0.15 s per sample again: the split stays


def test_equal_speeds_keep_the_equal_split_and_the_table_of_an_equal_run():
    table = [Instance(0, (0, 1, 2), 4)]
    reports = [report(0, 20, 1.0), report(0, 20, 1.04), report(0, 20, 0.97)]  # within the 5 % hysteresis
    speed = decide(table, reports)
    equal = decide(table, reports, worker_batch_split="equal")
    assert speed.instances == equal.instances and speed.instances[0].shares == ()
    assert speed.lines == equal.lines


def test_noise_does_not_reshuffle_a_split_but_a_real_change_does():
    table = [Instance(0, (0, 1), 4, shares=(6, 2))]
    noisy = decide(table, [report(0, 30, 1.5 * 1.03), report(0, 10, 1.5 * 0.97)])
    assert noisy.instances[0].shares == (6, 2)
    faster = decide(table, [report(0, 30, 1.5), report(0, 10, 0.5)])  # worker 1 is as fast as worker 0 now
    assert faster.instances[0].shares == ()  # back to 4 + 4
    no_time = decide(table, [report(0, 30, 1.5), report(0, 10, 0.0)])  # worker 1 measured no time
    assert no_time.instances[0].shares == (6, 2)


def test_the_total_follows_switch_mode_and_the_share_limit():
    # A request of 10 with micro-batches of 8 runs as 8 per worker (switch mode caps it): the split is of 16.
    table = [Instance(0, (0, 1), 10)]
    decision = decide(table, [report(0, 40, 1.0), report(0, 40, 100.0)])
    assert decision.instances[0].shares == (15, 1)
    # A worker's share stays within its data shard (a map-style shard of 12 samples per worker).
    limited = decide_round(
        table,
        [report(0, 40, 1.0), report(0, 40, 100.0)],
        outer_step=1,
        global_step=5,
        rules=rules_with_shard(12),
    )
    assert limited.instances[0].shares == (12, 4)


def rules_with_shard(shard: int):
    base = dict(PAPER_ROUNDS, batch_size_test="none", merge_every=0, max_batch_size=8, worker_batch_split="speed")
    return round_rules(shard_size=shard, **base)


def test_processes_per_worker_split_in_whole_processes_and_take_the_slowest_process():
    # 2 workers of 2 processes; a worker's request of 8 is 4 per process; worker 1's second process is slow.
    reports = [report(0, 20, 1.0), report(0, 20, 1.0), report(0, 20, 1.0), report(0, 20, 3.0)]
    assert worker_sample_seconds(reports, 2) == pytest.approx([1.0 / 40, 3.0 / 40])
    table = [Instance(0, (0, 1), 8)]
    decision = decide(table, reports, processes_per_worker=2, per_device_train_batch_size=4)
    assert decision.instances[0].shares == (12, 4)  # multiples of 2: max(12/40, 4·3/40) = 0.3 against 0.6
    assert decision.lines[0].worker_batch_sizes == [8, 8]
    # FSDP with a batch-size test needs 2 samples per process: a share of at least 4.
    fsdp = decide(
        table,
        [report(0, 20, 1.0), report(0, 20, 1.0), report(0, 20, 100.0), report(0, 20, 100.0)],
        processes_per_worker=2,
        per_device_train_batch_size=4,
        worker_parallelism="fsdp",
        batch_size_test="norm",
    )
    assert fsdp.instances[0].shares == (12, 4)


def test_a_merge_plans_the_survivor_s_split_over_its_new_workers():
    table = [Instance(0, (0, 1), 4, shares=(6, 2)), Instance(1, (2, 3), 4)]
    reports = [report(0, 30, 1.5), report(0, 10, 1.5), report(1, 20, 1.0), report(1, 20, 1.0)]
    decision = decide(table, reports, merge_every=1)
    assert decision.merge is not None
    (merged,) = decision.instances
    assert merged.workers == (0, 1, 2, 3) and len(merged.shares) == 4
    assert sum(merged.shares) == 16 and merged.shares[1] == min(merged.shares)  # worker 1 is the slow one


def test_shares_in_the_instance_row_and_when_they_stop_applying():
    inst = Instance(0, (3, 1), 4, shares=(2, 6))  # given in any order, kept with their workers
    assert inst.workers == (1, 3) and inst.shares == (6, 2)
    assert Instance.from_row(inst.to_row()) == inst
    assert Instance.from_row(Instance(0, (0, 1), 4).to_row()).shares == ()  # an equal split is stored as none
    assert len(Instance(0, (0, 1), 4).to_row()) == 9  # ... and its row is the one written before shares existed
    assert inst.split(4) == (6, 2)
    assert inst.split(5) == (5, 5)  # another total (the request grew): equal until the next round's end
    with pytest.raises(ValueError, match="2 workers but 3 shares"):
        Instance(0, (0, 1), 4, shares=(4, 2, 2))
    # Workers that change (a merge's redistribution, an elastic resume) drop the split.
    moved = reassign_workers([replace(inst, workers=(0, 3)), Instance(1, (1, 2), 4)], 3)
    assert all(i.shares == () for i in moved if i.workers != (0, 3))
    kept = plan_merge(
        [Instance(0, (0, 1), 4, shares=(6, 2)), Instance(1, (2,), 4), Instance(2, (3,), 4)],
        policy="smallest_pair",
        num_workers=4,
    )
    assert (kept.survivor, kept.merged) in ((1, 2), (2, 1))
    untouched = next(i for i in kept.after if i.id == 0)
    assert untouched.workers == (0, 1) and untouched.shares == (6, 2)  # its workers stay: so does its split


def test_a_request_that_grows_keeps_the_split_resized_unless_a_new_one_is_clearly_faster():
    # The request went from 4 to 6 per worker (a total of 12): the split (6, 2) resized is (9, 3). At 0.05 and 0.17 s
    # per sample, (10, 2) would end a step at 0.50 s against 0.51 s for (9, 3): 2 % sooner, within the hysteresis.
    reports = [report(0, 30, 1.5), report(0, 10, 1.7)]
    kept = decide([Instance(0, (0, 1), 6, shares=(6, 2))], reports)
    assert kept.instances[0].shares == (9, 3)
    fresh = decide([Instance(0, (0, 1), 6)], reports)  # from equal batches, (10, 2) is 50 % sooner
    assert fresh.instances[0].shares == (10, 2)
    # Clearly faster wins over the resized split too: at 0.5 s per sample worker 1 gets the minimum.
    moved = decide([Instance(0, (0, 1), 6, shares=(6, 2))], [report(0, 30, 1.5), report(0, 10, 5.0)])
    assert moved.instances[0].shares == (11, 1)
