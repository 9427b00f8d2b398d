import pytest

from adloco_hf.instances.table import (
    Instance,
    choose_merge,
    initial_instances,
    merge_is_due,
    plan_merge,
    reassign_workers,
    redistribute,
    seat_counts,
)
from adloco_hf.instances.transfers import plan_transfers


def table(*specs):
    """(id, workers, batch) tuples → instances."""
    return [Instance(i, tuple(w), b) for i, w, b in specs]


def test_initial_assignment_is_round_robin_and_checked():
    insts = initial_instances(5, 2, 3)
    assert [i.workers for i in insts] == [(0, 2, 4), (1, 3)]
    assert [i.demand for i in insts] == [9, 6]
    with pytest.raises(ValueError, match="num_instances=6"):
        initial_instances(4, 6, 1)


def test_smallest_pair_takes_the_two_smallest_demands_and_the_larger_survives():
    insts = table((0, [0], 8), (1, [1], 3), (2, [2], 5), (3, [3], 9))
    assert choose_merge(insts, "smallest_pair") == (2, 1)


def test_demand_counts_workers_not_just_the_request():
    # instance 0 asks little per worker but has three workers: demand 3·3 = 9 > 5.
    insts = table((0, [0, 1, 2], 3), (1, [3], 5), (2, [4], 6))
    assert choose_merge(insts, "smallest_pair") == (2, 1)


def test_ties_go_to_the_lower_id():
    insts = table((0, [0], 4), (1, [1], 4), (2, [2], 4), (3, [3], 4))
    assert choose_merge(insts, "smallest_pair") == (0, 1)
    assert choose_merge(insts, "largest_smallest") == (0, 1)


def test_largest_smallest_policy():
    insts = table((0, [0], 8), (1, [1], 3), (2, [2], 5), (3, [3], 9))
    assert choose_merge(insts, "largest_smallest") == (3, 1)


def test_a_single_instance_cannot_merge():
    insts = table((0, [0, 1], 4))
    assert not merge_is_due(3, 3, len(insts))
    with pytest.raises(ValueError, match="at least two"):
        choose_merge(insts)


def test_merge_schedule():
    assert [merge_is_due(s, 2, 4) for s in range(1, 7)] == [False, True, False, True, False, True]
    assert not merge_is_due(2, 0, 4)


def test_merge_weights_are_proportional_to_demand_and_sum_to_one():
    insts = table((0, [0], 6), (1, [1], 2), (2, [2, 3], 2))
    plan = plan_merge(insts, policy="smallest_pair", num_workers=4)
    assert (plan.survivor, plan.merged) == (2, 1)  # demands 4 and 2: the two smallest
    assert plan.weights == pytest.approx((4 / 6, 2 / 6))
    assert sum(plan.weights) == pytest.approx(1.0)
    survivor = next(i for i in plan.after if i.id == 2)
    assert survivor.batch_size == 2  # keeps its own request
    assert survivor.demand == 6  # inherits both demands


def test_seat_counts_largest_remainder_with_at_least_one_each():
    assert seat_counts({0: 6, 1: 3, 2: 3}, 4) == {0: 2, 1: 1, 2: 1}
    assert seat_counts({0: 100, 1: 1, 2: 1}, 4) == {0: 2, 1: 1, 2: 1}  # the minimum of one wins over proportion
    assert seat_counts({0: 1, 1: 1, 2: 1}, 4) == {0: 2, 1: 1, 2: 1}  # tie → lower id
    assert sum(seat_counts({0: 5, 1: 7, 2: 11}, 8).values()) == 8
    with pytest.raises(ValueError):
        seat_counts({0: 1, 1: 1, 2: 1}, 2)


def test_redistribution_moves_as_few_workers_as_possible():
    insts = table((0, [0, 1, 2], 1), (1, [3], 9))  # demands 3 and 9 over 4 workers → seats 1 and 3
    after = {i.id: i.workers for i in redistribute(insts, 4)}
    assert after == {0: (0,), 1: (1, 2, 3)}  # worker 0 and 3 stay put; two released workers move


def test_workers_that_fit_their_seats_do_not_move():
    insts = table((0, [0, 2], 4), (1, [1, 3], 4))
    assert redistribute(insts, 4) == insts


def test_merged_away_workers_follow_demand_and_survivor_workers_stay():
    insts = table((0, [0], 2), (1, [1], 2), (2, [2], 2), (3, [3], 2))
    plan = plan_merge(insts, policy="smallest_pair", num_workers=4)
    after = {i.id: i.workers for i in plan.after}
    assert (plan.survivor, plan.merged) == (0, 1)
    assert after == {0: (0, 1), 2: (2,), 3: (3,)}
    # Four instances need three merges: one per merge event, never more.
    sizes = []
    current = insts
    while len(current) > 1:
        current = list(plan_merge(current, policy="smallest_pair", num_workers=4).after)
        sizes.append(len(current))
    assert sizes == [3, 2, 1]
    assert current[0].workers == (0, 1, 2, 3)


def test_survivor_keeps_its_own_first_worker_when_seats_shrink():
    # The merged-away instance has the lower ranks; the survivor's own worker must stay in it.
    insts = table((0, [0], 5), (1, [1], 6), (2, [2], 20), (3, [3], 20))
    plan = plan_merge(insts, policy="smallest_pair", num_workers=4)
    assert (plan.survivor, plan.merged) == (1, 0)
    survivor = next(i for i in plan.after if i.id == 1)
    assert 1 in survivor.workers


def test_transfers_carry_state_to_exactly_the_workers_that_need_it():
    insts = table((0, [0], 2), (1, [1], 2), (2, [2], 3), (3, [3], 9))
    plan = plan_merge(insts, policy="smallest_pair", num_workers=4)
    assert (plan.survivor, plan.merged) == (0, 1)
    transfers = plan_transfers(plan)
    assert transfers[0].kind == "merge_input" and (transfers[0].src, transfers[0].dst) == (1, 0)
    after = {i.id: set(i.workers) for i in plan.after}
    before = {i.id: set(i.workers) for i in plan.before}
    for t in transfers[1:]:
        assert t.dst in after[t.instance]
        if t.instance != plan.survivor:
            assert t.dst not in before[t.instance]  # members that stayed already hold the state
            assert t.src in before[t.instance]
    # Every member of the survivor except its first worker receives the merged weights.
    receivers = {t.dst for t in transfers if t.kind == "global" and t.instance == 0}
    assert receivers == after[0] - {0}
    # Rank 0 writes the merge and computes it itself here: no extra save message.
    assert not [t for t in transfers if t.kind == "save"]


def test_save_transfer_reaches_the_writer_when_it_is_elsewhere():
    insts = table((0, [0], 9), (1, [1], 2), (2, [2], 2), (3, [3], 9))
    plan = plan_merge(insts, policy="smallest_pair", num_workers=4)
    assert (plan.survivor, plan.merged) == (1, 2)
    saves = [t for t in plan_transfers(plan) if t.kind == "save"]
    assert [(t.src, t.dst) for t in saves] == [(1, 0)]
    assert not [t for t in plan_transfers(plan, save=False) if t.kind == "save"]


# ---- another number of workers (elastic resume) ----
def test_reassign_to_more_workers_keeps_members_and_fills_new_ranks_by_demand():
    insts = table((0, [0], 6), (1, [1], 2))  # demands 6 and 2
    after = reassign_workers(insts, 4)
    assert [i.workers for i in after] == [(0, 2, 3), (1,)]  # seats 3:1, new ranks fill instance 0
    assert [(i.batch_size, i.demand) for i in after] == [(6, 6.0), (2, 2.0)]  # requests and demands kept
    equal = reassign_workers(table((0, [0], 4), (1, [1], 4)), 4)
    assert [i.workers for i in equal] == [(0, 2), (1, 3)]


def test_reassign_to_fewer_workers_drops_the_ranks_that_are_gone():
    insts = table((0, [0, 2], 4), (1, [1, 3], 4))
    after = reassign_workers(insts, 2)
    assert [i.workers for i in after] == [(0,), (1,)]
    assert [i.demand for i in after] == [8.0, 8.0]
    assert reassign_workers(insts, 4) == insts  # the same number of workers changes nothing


def test_an_instance_left_without_workers_gets_a_released_one():
    # Instance 1 had only ranks 2 and 3; with 3 workers instance 0 (demand 12) gives up rank 1, lowest released.
    insts = table((0, [0, 1], 6), (1, [2, 3], 2))
    after = reassign_workers(insts, 2)
    assert [i.workers for i in after] == [(0,), (1,)]
    after3 = reassign_workers(table((0, [0, 1, 2], 4), (1, [3], 4)), 3)
    assert [i.workers for i in after3] == [(0, 1), (2,)]


def test_reassign_refuses_more_instances_than_workers():
    with pytest.raises(ValueError, match="3 instances cannot share 2 workers: every instance needs a worker"):
        reassign_workers(table((0, [0], 2), (1, [1], 2), (2, [2], 2)), 2)
