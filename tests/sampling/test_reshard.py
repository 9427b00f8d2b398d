"""`adloco_hf.sampling.reshard`: a pass's remainder dealt over another number of workers (pure)."""

import pytest

from adloco_hf.sampling.reshard import bridge


def test_each_pass_is_dealt_round_robin_in_pass_order():
    parts = bridge({1: [2, 0, 3, 6], 0: [5, 1, 4]}, 2)
    # One round-robin over both passes: the 4th item (pass 1's first) goes to worker 1.
    assert parts == [[(0, [5, 4]), (1, [0, 6])], [(0, [1]), (1, [2, 3])]]


@pytest.mark.parametrize("world_size", [1, 2, 3, 5, 8])
def test_every_item_goes_to_exactly_one_worker_and_parts_differ_by_at_most_one(world_size):
    remainders = {0: list(range(7)), 3: list(range(100, 113)), 4: []}
    parts = bridge(remainders, world_size)
    assert len(parts) == world_size
    for epoch, items in remainders.items():
        dealt = [item for part in parts for e, share in part if e == epoch for item in share]
        assert sorted(dealt) == items
        sizes = [sum(len(share) for e, share in part if e == epoch) for part in parts]
        assert max(sizes) - min(sizes) <= 1
    totals = [sum(len(share) for _, share in part) for part in parts]
    assert max(totals) - min(totals) <= 1
    assert all(share for part in parts for _, share in part)  # empty shares are left out


def test_a_bad_world_size_is_refused():
    with pytest.raises(ValueError, match="world_size must be a positive integer, got 0"):
        bridge({0: [1]}, 0)
