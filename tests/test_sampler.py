import itertools

import pytest

from adloco_hf.sampler import AdaptiveBatchSampler


def draw(sampler, sizes):
    batches = []
    for size in sizes:
        sampler.batch_size = size
        batches.append(sampler.next_batch())
    return batches


def test_shards_are_disjoint_and_cover_a_pass():
    n, workers = 103, 4
    samplers = [AdaptiveBatchSampler(n, batch_size=5, num_workers=workers, rank=r, seed=3) for r in range(workers)]
    shard = n // workers
    seen = [sum(draw(s, [5] * (shard // 5)), []) for s in samplers]
    assert shard % 5 == 0
    for indices in seen:
        assert len(indices) == len(set(indices)) == shard
    for a, b in itertools.combinations(seen, 2):
        assert not set(a) & set(b)
    assert len(set().union(*map(set, seen))) == workers * shard


def test_every_pass_is_reshuffled_and_batches_cross_passes_without_loss():
    samplers = [AdaptiveBatchSampler(40, batch_size=7, num_workers=2, rank=r, seed=0) for r in range(2)]
    streams = [sum(draw(s, [7] * 6), []) for s in samplers]  # 42 samples each: two passes of 20, then 2 more
    for stream in streams:
        first, second = stream[:20], stream[20:40]
        assert len(set(first)) == len(set(second)) == 20
        assert first != second  # a new permutation, so a new shard, every pass
    for start in (0, 20):  # within each pass, the two workers' shards partition the data
        assert sorted(streams[0][start : start + 20] + streams[1][start : start + 20]) == list(range(40))
    assert samplers[0].epoch == 2 and samplers[0].position == 2


def test_batch_size_changes_apply_to_the_next_batch():
    sampler = AdaptiveBatchSampler(1000, batch_size=2, num_workers=1, rank=0)
    it = iter(sampler)
    assert len(next(it)) == 2
    sampler.batch_size = 9
    assert len(next(it)) == 9
    with pytest.raises(ValueError, match="batch_size"):
        sampler.batch_size = 0


def test_state_dict_resumes_the_same_batches():
    sizes = [3, 3, 8, 8, 13, 2, 21, 5]
    reference = AdaptiveBatchSampler(50, batch_size=3, num_workers=3, rank=2, seed=11)
    expected = draw(reference, sizes)
    first = AdaptiveBatchSampler(50, batch_size=3, num_workers=3, rank=2, seed=11)
    draw(first, sizes[:4])
    resumed = AdaptiveBatchSampler(50, batch_size=1, num_workers=3, rank=2, seed=11)
    resumed.load_state_dict(first.state_dict())
    assert resumed.batch_size == 8
    assert draw(resumed, sizes[4:]) == expected[4:]


def test_resuming_with_another_layout_is_refused():
    state = AdaptiveBatchSampler(50, batch_size=3, num_workers=2, rank=0).state_dict()
    with pytest.raises(ValueError, match="num_workers"):
        AdaptiveBatchSampler(50, batch_size=3, num_workers=4, rank=0).load_state_dict(state)


def test_fewer_samples_than_workers_is_refused():
    with pytest.raises(ValueError, match="fewer than the 4 workers"):
        AdaptiveBatchSampler(3, batch_size=1, num_workers=4, rank=0)
