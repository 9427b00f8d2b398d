"""A round's table when its members change (live recovery): workers leave and join, instances keep their total batch,
an instance whose last worker left is merged away."""

import pytest

from adloco_hf.instances.membership import table_for_members
from adloco_hf.instances.table import Instance, initial_instances


def totals(instances) -> dict[int, int]:
    return {inst.id: inst.batch_size * len(inst.workers) for inst in instances}


def test_nothing_changes_while_every_worker_is_alive():
    table = initial_instances(4, 2, 8)
    change = table_for_members(table, range(4))
    assert change.instances == tuple(table) and not change.changed


def test_a_worker_that_leaves_is_taken_out_and_its_instance_keeps_its_total_batch():
    table = [Instance(0, (0, 1, 2), 8), Instance(1, (3, 4), 6)]
    change = table_for_members(table, [0, 2, 3, 4])
    assert change.left == (1,) and change.joined is None and change.lost == ()
    first, second = change.instances
    assert first.workers == (0, 2) and first.batch_size == 12 and first.demand == 24.0
    assert second == table[1]
    assert totals(change.instances) == totals(table)


@pytest.mark.parametrize(("g", "asked", "expected"), [(1, 8, 11), (2, 8, 12), (4, 8, 12), (3, 6, 9), (2, 6, 8)])
def test_a_total_that_does_not_divide_is_rounded_up_to_whole_requests_of_every_process(g, asked, expected):
    table = [Instance(0, (0, 1, 2, 3), asked)]
    (inst,) = table_for_members(table, [0, 1, 2], processes_per_worker=g).instances
    total = 4 * asked
    assert inst.batch_size == expected and inst.batch_size % g == 0
    assert 0 <= 3 * inst.batch_size - total < 3 * g  # at most G - 1 samples more per worker


def test_an_instance_whose_last_worker_left_is_merged_away():
    table = initial_instances(4, 4, 4)
    change = table_for_members(table, [0, 1, 3])
    assert change.lost == (2,) and change.left == (2,)
    assert [inst.id for inst in change.instances] == [0, 1, 3]


def test_a_worker_that_joins_goes_to_the_live_instance_with_the_fewest_workers():
    table = [Instance(0, (0, 2), 8), Instance(1, (1,), 8), Instance(2, (3,), 8)]
    change = table_for_members(table, [0, 1, 2, 3, 7, 5])
    assert change.joined == {5: 1, 7: 2}  # fewest workers, ties to the lowest id, joiners in id order
    rows = {inst.id: inst for inst in change.instances}
    assert rows[1].workers == (1, 5) and rows[1].batch_size == 4
    assert rows[2].workers == (3, 7) and rows[2].batch_size == 4
    assert rows[0] == table[0]
    assert totals(change.instances) == totals(table)


def test_a_worker_that_returns_after_its_instance_was_lost_joins_another():
    table = initial_instances(4, 4, 4)
    gone = table_for_members(table, [0, 1, 3]).instances
    back = table_for_members(gone, [0, 1, 2, 3])
    assert back.joined == {2: 0} and back.lost == ()
    assert {w for inst in back.instances for w in inst.workers} == {0, 1, 2, 3}


def test_speed_shares_are_resized_over_the_live_workers():
    table = [Instance(0, (0, 1, 2), 8, shares=(12, 8, 4))]
    (inst,) = table_for_members(table, [0, 2]).instances
    assert inst.workers == (0, 2) and inst.batch_size == 12
    assert inst.shares == (18, 6) and inst.split(12) == (18, 6)  # 12 : 4 of the same total of 24


def test_no_live_worker_of_the_last_round_means_a_resume_from_the_checkpoint():
    with pytest.raises(ValueError, match="Resume the job from its last checkpoint"):
        table_for_members(initial_instances(2, 1, 4), [5])
    with pytest.raises(ValueError, match="at least one member"):
        table_for_members(initial_instances(2, 1, 4), [])


def test_the_statistics_of_a_kept_instance_are_kept():
    inst = Instance(0, (0, 1), 8, skipped_in_a_row=1, rounds_since_merge=3, trained=True)
    (kept,) = table_for_members([inst], [1]).instances
    assert (kept.skipped_in_a_row, kept.rounds_since_merge, kept.trained, kept.noise) == (1, 3, True, inst.noise)
