"""Live recovery's data: the workers alive continue from the last committed round's sampler states, re-split when
the members change. Real samplers, rounds drawn and committed or dropped: no sample enters two committed rounds of a
pass, and none that was drawn in a dropped round is lost."""

import pytest

from adloco_hf.sampling.membership import states_for_members
from adloco_hf.sampling.sampler import AdaptiveBatchSampler


NUM_SAMPLES, SEED, INNER_STEPS = 203, 5, 3


def sampler(state: dict) -> AdaptiveBatchSampler:
    s = AdaptiveBatchSampler(
        NUM_SAMPLES, batch_size=state["batch_size"], num_workers=state["num_workers"], rank=state["rank"], seed=SEED
    )
    s.load_state_dict(state)
    return s


def draw_round(s: AdaptiveBatchSampler) -> list[tuple[int, int]]:
    """One round's inner steps: (pass, index) of every sample drawn."""
    return [(epoch, i) for _ in range(INNER_STEPS) for epoch, part in s.next_batch_by_pass() for i in part]


def test_the_same_members_continue_where_they_were():
    made = {w: AdaptiveBatchSampler(NUM_SAMPLES, batch_size=4, num_workers=2, rank=r) for r, w in enumerate((3, 7))}
    states = {w: s.state_dict() for w, s in made.items()}
    assert states_for_members(states, [7, 3]) == states


def test_rounds_through_a_death_a_dropped_round_and_a_return_commit_every_sample_at_most_once_per_pass():
    workers = [0, 1, 2, 3]
    samplers = {w: AdaptiveBatchSampler(NUM_SAMPLES, batch_size=5, num_workers=4, rank=w, seed=SEED) for w in workers}
    committed_states = {w: s.state_dict() for w, s in samplers.items()}
    committed: list[tuple[int, int]] = []
    dropped: list[tuple[int, int]] = []
    # (members of the round, whether it commits): worker 2 dies inside round 3, which every survivor drops; it comes
    # back for round 7.
    schedule = [([0, 1, 2, 3], True)] * 2 + [([0, 1, 2, 3], False)] + [([0, 1, 3], True)] * 3
    schedule += [([0, 1, 2, 3], True)] * 10
    for members, commits in schedule:
        if samplers is None or sorted(samplers) != members:  # the members changed, or the last round was dropped
            samplers = {w: sampler(s) for w, s in states_for_members(committed_states, members).items()}
        assert sorted(samplers) == members  # a world of len(members) workers
        drawn = {w: draw_round(s) for w, s in samplers.items()}
        if commits:
            committed += [sample for w in members for sample in drawn[w]]
            committed_states = {w: s.state_dict() for w, s in samplers.items()}
        else:
            dropped += [sample for w in members for sample in drawn[w]]
            samplers = None  # every member rewinds to the last committed round's states
    assert len(committed) == len(set(committed))  # no (pass, sample) committed twice
    assert set(dropped) <= set(committed)  # what the dropped round drew was drawn again
    passes = {epoch for epoch, _ in committed}
    assert len(passes) >= 3  # the run crossed passes, including re-splits inside them
    for epoch in sorted(passes)[:-1]:  # every finished pass: each sample at most once, at most 3 left out
        seen = [i for e, i in committed if e == epoch]
        assert len(seen) == len(set(seen)) and NUM_SAMPLES - len(seen) < 4


def test_a_round_without_members_is_refused():
    with pytest.raises(ValueError, match="at least one member"):
        states_for_members({0: {}}, [])
