import pytest

from adloco_hf.switch_mode import BatchPlan, plan_batch, split_sizes


@pytest.mark.parametrize(
    ("requested", "expected"),
    [
        (1, BatchPlan(1, 1, 1)),
        (8, BatchPlan(8, 8, 1)),  # fits
        (9, BatchPlan(8, 8, 1)),  # just above the limit: capped
        (16, BatchPlan(8, 8, 1)),  # exactly γ·m: still capped
        (17, BatchPlan(17, 6, 3)),  # above γ·m: accumulate ⌈17/8⌉ = 3 chunks of 6, 6, 5
        (64, BatchPlan(64, 8, 8)),
    ],
)
def test_plan_batch_follows_the_table(requested, expected):
    assert plan_batch(requested, 8, 2.0) == expected


def test_threshold_one_accumulates_as_soon_as_the_batch_does_not_fit():
    assert plan_batch(9, 8, 1.0) == BatchPlan(9, 5, 2)


@pytest.mark.parametrize("requested", range(1, 200))
def test_accumulated_chunks_cover_the_batch_and_fit(requested):
    plan = plan_batch(requested, 7, 2.0)
    sizes = split_sizes(plan.batch_size, plan.accumulation_steps)
    assert sum(sizes) == plan.batch_size
    assert max(sizes) == plan.micro_batch_size <= 7
    assert max(sizes) - min(sizes) <= 1
    assert plan.batch_size <= max(requested, 7)


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="requested"):
        plan_batch(0, 8)
    with pytest.raises(ValueError, match="max_batch_size"):
        plan_batch(4, 0)
    with pytest.raises(ValueError, match="switch_threshold"):
        plan_batch(4, 8, 0.5)
    with pytest.raises(ValueError):
        split_sizes(3, 4)
