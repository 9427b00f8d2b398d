"""An instance's batch split among workers of different speeds (`batch/worker_split.py`), against brute force."""

import itertools
import random

import pytest

from adloco_hf.batch.worker_split import (
    equal_split,
    plan_worker_split,
    resize_split,
    round_seconds,
    split_by_speed,
)


def brute_force_best(total, seconds, *, unit=1, minimum=1, limit=None):
    """The smallest round time over every split of `total` (multiples of `unit`, each in [minimum, limit])."""
    high = total if limit is None else limit
    shares = range(minimum, high + 1, unit)
    best = None
    for split in itertools.product(shares, repeat=len(seconds)):
        if sum(split) == total:
            time = round_seconds(split, seconds)
            best = time if best is None else min(best, time)
    return best


CASES = [
    # (total, seconds per sample, unit, minimum, limit)
    (8, [1.0, 1.0], 1, 1, None),
    (16, [1.0, 1.0, 1.0, 4.0], 1, 1, None),
    (16, [1.0, 1.0, 1.0, 4.0], 2, 2, None),
    (12, [0.3, 2.0, 0.7], 1, 1, None),
    (12, [0.3, 2.0, 0.7], 1, 1, 5),
    (12, [0.1, 10.0], 1, 1, None),  # a worker 100 × slower keeps the minimum
    (20, [1.0, 1.5, 2.0, 2.5], 2, 4, 8),  # FSDP-like: shares of 2 per process, two processes
    (9, [1.0, 1.0, 1.0], 1, 1, None),
    (10, [2.0, 1.0, 3.0, 1.0, 5.0], 1, 1, 4),
]


@pytest.mark.parametrize("total, seconds, unit, minimum, limit", CASES)
def test_split_by_speed_ends_the_round_as_soon_as_any_split_can(total, seconds, unit, minimum, limit):
    split = split_by_speed(total, seconds, unit=unit, minimum=minimum, limit=limit)
    assert sum(split) == total
    assert all(x % unit == 0 and minimum <= x <= (limit or total) for x in split)
    assert round_seconds(split, seconds) == pytest.approx(
        brute_force_best(total, seconds, **_kw(unit, minimum, limit))
    )


def _kw(unit, minimum, limit):
    return {"unit": unit, "minimum": minimum, "limit": limit}


def test_split_by_speed_matches_brute_force_on_random_speeds():
    rng = random.Random(0)
    for _ in range(200):
        workers = rng.randint(1, 4)
        seconds = [rng.choice([0.5, 1.0, 1.0, 2.0, 4.0]) * rng.uniform(0.9, 1.1) for _ in range(workers)]
        unit = rng.choice([1, 2])
        minimum = unit * rng.choice([1, 2])
        total = unit * rng.randint(workers * minimum // unit, 12 // unit + workers)
        limit = rng.choice([None, max(minimum, total // workers + unit)])
        if limit is not None and limit * workers < total:
            limit = None
        split = split_by_speed(total, seconds, unit=unit, minimum=minimum, limit=limit)
        assert sum(split) == total
        best = brute_force_best(total, seconds, unit=unit, minimum=minimum, limit=limit)
        assert round_seconds(split, seconds) == pytest.approx(best), (total, seconds, unit, minimum, limit, split)


def test_shares_follow_speed_and_equal_speeds_split_evenly():
    assert split_by_speed(16, [1.0, 1.0, 1.0, 4.0]) == (5, 5, 5, 1)  # the docstring's example
    assert split_by_speed(12, [1.0] * 4) == (3, 3, 3, 3)
    assert split_by_speed(10, [1.0] * 4) == (3, 3, 2, 2)  # ties to the lower index
    assert split_by_speed(12, [1.0, 2.0]) == (8, 4)  # in proportion to speed
    assert split_by_speed(12, [1.0, 2.0], unit=4, minimum=4) == (8, 4)
    assert split_by_speed(100, [1.0, 1000.0]) == (99, 1)  # at least one sample each
    assert split_by_speed(8, [1.0, 1000.0], limit=5) == (5, 3)  # a full shard gives the rest to the slow worker
    assert equal_split(10, 4) == (3, 3, 2, 2)


def test_a_split_that_cannot_be_made_is_refused():
    with pytest.raises(ValueError, match="cannot be split"):
        split_by_speed(3, [1.0, 1.0, 1.0, 1.0])
    with pytest.raises(ValueError, match="cannot be split"):
        split_by_speed(12, [1.0, 1.0], limit=5)
    with pytest.raises(ValueError, match="multiples of unit"):
        split_by_speed(7, [1.0, 1.0], unit=2, minimum=2)
    with pytest.raises(ValueError, match="finite and > 0"):
        split_by_speed(8, [1.0, float("nan")])


def test_hysteresis_keeps_the_split_unless_the_round_gets_shorter_by_more_than_it():
    current = (4, 4)
    # 10 % slower: the best split (5, 3) would end the round at max(5, 3.3) = 5 against 4.4 now: no gain.
    assert plan_worker_split(8, [1.0, 1.1], current, hysteresis=0.05) == current
    # 3 × slower: (6, 2) ends at 6 against 12: 50 % sooner, above 5 % → re-split.
    assert plan_worker_split(8, [1.0, 3.0], current, hysteresis=0.05) == (6, 2)
    # ... but not above a 60 % hysteresis.
    assert plan_worker_split(8, [1.0, 3.0], current, hysteresis=0.6) == current
    # Noise around a planned split does not move it: at speeds 1 : 1.95 the best, (5, 3), ends at 5.85 against
    # 6 for (6, 2), 2.5 % sooner.
    assert plan_worker_split(8, [1.0, 1.95], (6, 2), hysteresis=0.05) == (6, 2)
    assert plan_worker_split(8, [1.0, 1.95], (6, 2), hysteresis=0.02) == (5, 3)
    # With no gain at all, hysteresis 0 keeps it too.
    assert plan_worker_split(8, [1.0, 1.0], (4, 4), hysteresis=0.0) == (4, 4)


def test_without_measurements_or_a_current_split_the_plan_is_equal_or_kept():
    nan = float("nan")
    assert plan_worker_split(8, [1.0, nan], (5, 3), hysteresis=0.05) == (5, 3)  # a worker measured nothing
    assert plan_worker_split(8, [1.0, 0.0], None, hysteresis=0.05) == (4, 4)
    assert plan_worker_split(8, [nan, nan], (6, 6), hysteresis=0.05) == (4, 4)  # (6, 6) is another total's
    assert plan_worker_split(8, [nan, nan], None, hysteresis=0.05, unit=2) == (4, 4)
    # A current split of another total (the request grew) does not hold the new one back.
    assert plan_worker_split(16, [1.0, 3.0], (5, 3), hysteresis=0.5) == split_by_speed(16, [1.0, 3.0])


def test_a_split_resized_to_another_total_keeps_its_proportions():
    assert resize_split((6, 2), 16) == (12, 4)
    assert resize_split((5, 5, 5, 1), 24) == (8, 8, 7, 1)  # 7.5, 7.5, 7.5, 1.5: remainders to the lower indices
    assert resize_split((12, 4), 12, unit=2, minimum=2) == (10, 2)  # 9 and 3 in units of 2 are 4.5 and 1.5
    assert resize_split((7, 1), 4) is None  # the slow worker's share would fall to 0
    assert resize_split((6, 2), 16, limit=10) is None  # above a worker's shard
