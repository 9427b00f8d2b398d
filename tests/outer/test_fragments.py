"""Streaming DiLoCo's fragments and schedule (`outer/fragments.py`): pure functions against hand computations and a
brute-force walk over every round length."""

import pytest

from adloco_hf.outer.fragments import (
    fragment_pieces,
    fragment_ranges,
    fragments_sent_at,
    max_sync_delay,
    send_offset,
)


@pytest.mark.parametrize(
    ("numel", "parts", "expected"),
    [
        (10, 3, [(0, 4), (4, 7), (7, 10)]),  # 10 = 4 + 3 + 3: the first 10 mod 3 = 1 fragment holds one more
        (8, 4, [(0, 2), (2, 4), (4, 6), (6, 8)]),
        (83, 3, [(0, 28), (28, 56), (56, 83)]),  # the test model of test_outer_fragments.py: cuts inside its tensors
        (5, 1, [(0, 5)]),
        (3, 3, [(0, 1), (1, 2), (2, 3)]),
    ],
)
def test_fragments_are_contiguous_and_of_equal_size_within_one_element(numel, parts, expected):
    assert fragment_ranges(numel, parts) == expected


def test_fragment_ranges_cover_the_model_once_for_any_size():
    for numel in range(1, 60):
        for parts in range(1, numel + 1):
            ranges = fragment_ranges(numel, parts)
            assert ranges[0][0] == 0 and ranges[-1][1] == numel
            assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:]))  # contiguous, in order
            sizes = [end - start for start, end in ranges]
            assert min(sizes) >= 1 and max(sizes) - min(sizes) <= 1


@pytest.mark.parametrize(("numel", "parts"), [(5, 0), (2, 3)])
def test_impossible_cuts_are_refused(numel, parts):
    with pytest.raises(ValueError):
        fragment_ranges(numel, parts)


@pytest.mark.parametrize(
    ("parts", "inner_steps", "expected"),
    [
        (4, 25, [25, 6, 12, 18]),  # ⌊p·25/4⌋ for p ≥ 1, fragment 0 at the round's end
        (2, 10, [10, 5]),
        (3, 3, [3, 1, 2]),
        (1, 7, [7]),  # one fragment: the round's end, as blocking DiLoCo
        (2, 5, [5, 2]),  # the resume test's schedule (RESUME_CONFIG's H = 5)
    ],
)
def test_send_offsets_by_hand(parts, inner_steps, expected):
    assert [send_offset(p, parts, inner_steps) for p in range(parts)] == expected


def test_a_round_shorter_than_the_fragments_is_refused():
    with pytest.raises(ValueError, match="at least 4 inner steps"):
        send_offset(1, 4, 3)


def test_every_fragment_is_sent_exactly_once_per_round_for_every_round_length():
    for inner_steps in range(1, 40):
        for parts in range(1, inner_steps + 1):
            sent = [p for offset in range(1, inner_steps) for p in fragments_sent_at(offset, parts, inner_steps)]
            assert fragments_sent_at(inner_steps, parts, inner_steps) == []  # the round end sends fragment 0
            assert sorted(sent + [0]) == list(range(parts)), (inner_steps, parts)
            assert sent == sorted(sent)  # in order: fragment p at p·H/P


def test_the_largest_delay_is_the_shortest_gap_between_two_sends():
    assert max_sync_delay(4, 25) == 6 and max_sync_delay(2, 5) == 2 and max_sync_delay(1, 7) == 7
    for inner_steps in range(1, 40):
        for parts in range(1, inner_steps + 1):
            # Sends over two rounds: fragment 0 at the first round's end, then the next round's.
            steps = sorted(send_offset(p, parts, inner_steps) for p in range(parts))
            steps += [inner_steps + s for s in steps]
            gaps = [b - a for a, b in zip(steps, steps[1:])]
            assert min(gaps) == max_sync_delay(parts, inner_steps), (inner_steps, parts)


def test_pieces_of_a_shard_by_hand():
    # Two parameters of 3 rows × 2 and 2 rows × 2; this process holds rows 1-2 of the first (positions 2-5) and
    # row 1 of the second (positions 8-9); the whole model (10 elements) in 2 fragments of 5.
    assert fragment_pieces([2, 8], [4, 2], [(0, 5), (5, 10)]) == [[(0, 3)], [(3, 6)]]
    # Rows 0 of both: fragment 1 has two pieces of this process's φ, fragment 0 one.
    assert fragment_pieces([0, 6], [2, 2], [(0, 5), (5, 10)]) == [[(0, 2)], [(2, 4)]]
    assert fragment_pieces([0, 6], [2, 2], [(0, 3), (3, 7), (7, 10)]) == [[(0, 2)], [(2, 3)], [(3, 4)]]
    # A process holding the whole model gets the fragments themselves, one piece each.
    assert fragment_pieces([0, 6], [6, 4], [(0, 4), (4, 7), (7, 10)]) == [[(0, 4)], [(4, 7)], [(7, 10)]]


def test_the_shards_pieces_hold_every_element_of_every_fragment_exactly_once():
    """Row shards (`torch.chunk`'s cut, as FSDP's) of a few parameters over 1-3 processes, mapped back: each
    fragment's elements are the union of its pieces over the processes, in the model's order."""
    import torch

    shapes = [(5, 3), (4,), (7, 2), (1, 6)]
    sizes = [torch.Size(s).numel() for s in shapes]
    offsets = [sum(sizes[:i]) for i in range(len(sizes))]
    total = sum(sizes)
    for processes in (1, 2, 3):
        for parts in (1, 2, 4, 7):
            ranges = fragment_ranges(total, parts)
            found = [[] for _ in range(parts)]
            for rank in range(processes):
                starts, held, positions = [], [], []
                for shape, offset in zip(shapes, offsets):
                    rows = [len(c) for c in torch.chunk(torch.arange(shape[0]), processes)]
                    row = torch.Size(shape[1:]).numel()
                    first = sum(rows[:rank]) * row
                    count = rows[rank] * row if rank < len(rows) else 0
                    starts.append(offset + first)
                    held.append(count)
                    positions += range(offset + first, offset + first + count)
                for p, pieces in enumerate(fragment_pieces(starts, held, ranges)):
                    found[p] += [positions[i] for a, b in pieces for i in range(a, b)]
            for p, (a, b) in enumerate(ranges):
                assert sorted(found[p]) == list(range(a, b)), (processes, parts, p)
