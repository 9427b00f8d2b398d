import itertools

import pytest
import torch

from adloco_hf.sampling.sampler import AdaptiveBatchSampler


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


# ---- re-split over another number of workers (elastic resume) ----
def draw_by_pass(sampler, sizes):
    """(pass, index) of every index drawn in batches of `sizes`."""
    drawn = []
    for size in sizes:
        sampler.batch_size = size
        drawn += [(epoch, index) for epoch, indices in sampler.next_batch_by_pass() for index in indices]
    return drawn


def bridge_length(state):
    return sum(state["bridge_lengths"] or [])


def full_pass(n, workers, seed, epoch):
    """What a pass under `workers` workers draws: the first workers·⌊n / workers⌋ of its permutation."""
    permutation = torch.randperm(n, generator=torch.Generator().manual_seed(seed + epoch))
    return sorted(permutation[: workers * (n // workers)].tolist())


def resharded(samplers, world_size):
    states = AdaptiveBatchSampler.reshard_sampler_states([s.state_dict() for s in samplers], world_size)
    n, seed = samplers[0].num_samples, samplers[0].seed
    new = [AdaptiveBatchSampler(n, batch_size=1, num_workers=world_size, rank=r, seed=seed) for r in range(world_size)]
    for sampler, state in zip(new, states):
        sampler.load_state_dict(state)
    return new, states


def check_passes(drawn, layouts, n, seed):
    """Every pass of `layouts` (pass → the number of workers it started with) drawn exactly once."""
    for epoch, workers in layouts.items():
        indices = [index for e, index in drawn if e == epoch]
        assert sorted(indices) == full_pass(n, workers, seed, epoch), epoch


@pytest.mark.parametrize(
    ("old", "new", "sizes"),
    [
        (4, 2, [[3, 3, 3], [3, 3, 3], [5, 5, 5], [5, 5, 5]]),  # two instances, equal positions within each
        (2, 4, [[7, 7, 9], [2, 2, 2]]),  # rank 0 in pass 1, rank 1 still in pass 0
        (3, 5, [[4, 4], [11, 12, 13], [1]]),  # three passes apart
        (4, 2, [[0], [0], [0], [0]]),  # nothing drawn yet
    ],
    ids=["4to2", "2to4", "3to5", "fresh"],
)
def test_reshard_draws_every_sample_of_the_started_passes_exactly_once(old, new, sizes):
    n, seed = 61, 5
    samplers = [AdaptiveBatchSampler(n, batch_size=1, num_workers=old, rank=r, seed=seed) for r in range(old)]
    drawn = [pair for s, rank_sizes in zip(samplers, sizes) for pair in draw_by_pass(s, [x for x in rank_sizes if x])]
    last = max(s.epoch - (s.position == 0) for s in samplers)
    new_samplers, states = resharded(samplers, new)
    lengths = [bridge_length(state) for state in states]
    assert max(lengths) - min(lengths) <= 1  # the bridge is dealt evenly
    assert all(state["epoch"] == last + 1 and state["num_workers"] == new for state in states)
    for sampler, length in zip(new_samplers, lengths):
        if length:
            drawn += draw_by_pass(sampler, [length])
    check_passes(drawn, {epoch: old for epoch in range(last + 1)}, n, seed)
    # After the bridge, the next pass is the new layout's: disjoint shards of n // new samples.
    after = [draw_by_pass(s, [n // new]) for s in new_samplers]
    assert all(e == last + 1 for part in after for e, _ in part)
    assert sorted(i for part in after for _, i in part) == full_pass(n, new, seed, last + 1)


def test_nested_reshard_4_to_2_to_3_keeps_every_pass_whole():
    n, seed = 50, 2
    samplers = [AdaptiveBatchSampler(n, batch_size=1, num_workers=4, rank=r, seed=seed) for r in range(4)]
    drawn = []
    for sampler, sizes in zip(samplers, [[5, 5], [5, 5], [9, 9], [9, 9]]):  # ranks 2, 3 are in pass 1
        drawn += draw_by_pass(sampler, sizes)
    middle, states = resharded(samplers, 2)
    assert [s["epoch"] for s in states] == [2, 2]
    # Rank 0 stops inside its bridge, rank 1 draws past its bridge into pass 2 (the layout of 2 workers).
    drawn += draw_by_pass(middle[0], [bridge_length(states[0]) - 3])
    drawn += draw_by_pass(middle[1], [bridge_length(states[1]) + 4])
    assert middle[0].state_dict()["bridge_pos"] > 0 and middle[1].state_dict()["bridge_passes"] is None
    final, final_states = resharded(middle, 3)
    assert [s["epoch"] for s in final_states] == [3, 3, 3]
    for sampler, state in zip(final, final_states):
        drawn += draw_by_pass(sampler, [bridge_length(state)])
    check_passes(drawn, {0: 4, 1: 4, 2: 2}, n, seed)


def test_a_resharded_state_resumes_exactly_inside_its_bridge():
    samplers = [AdaptiveBatchSampler(40, batch_size=3, num_workers=2, rank=r, seed=1) for r in range(2)]
    draw(samplers[0], [3, 3])
    draw(samplers[1], [6])
    new, _ = resharded(samplers, 3)
    sizes = [2, 5, 4, 9]
    reference_state = new[1].state_dict()
    expected = draw(new[1], sizes)
    again = AdaptiveBatchSampler(40, batch_size=1, num_workers=3, rank=1, seed=1)
    again.load_state_dict(reference_state)
    draw(again, sizes[:1])
    saved = again.state_dict()
    assert saved["bridge_pos"] == 2 and saved["bridge_indices"].dtype == torch.int32
    resumed = AdaptiveBatchSampler(40, batch_size=1, num_workers=3, rank=1, seed=1)
    resumed.load_state_dict(saved)
    assert draw(resumed, sizes[1:]) == expected[1:]


def test_reshard_refuses_states_of_another_run_or_too_many_workers():
    samplers = [AdaptiveBatchSampler(10, batch_size=2, num_workers=2, rank=r, seed=0) for r in range(2)]
    states = [s.state_dict() for s in samplers]
    with pytest.raises(ValueError, match="old rank 1 has rank=0, expected 1"):
        AdaptiveBatchSampler.reshard_sampler_states([states[0], states[0]], 3)
    with pytest.raises(ValueError, match="fewer than the 11 workers"):
        AdaptiveBatchSampler.reshard_sampler_states(states, 11)
