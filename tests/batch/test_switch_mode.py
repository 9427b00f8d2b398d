import pytest

from adloco_hf.batch.switch_mode import BatchPlan, plan_batch, split_sizes


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


def test_plan_step_splits_the_last_step_of_a_round_for_statistics():
    from adloco_hf.batch.switch_mode import Statistics, StepPlan, plan_step

    whole = plan_batch(6, 8)
    kwargs = dict(measure=True, next_last_of_round=False, has_previous=False)
    assert plan_step(6, whole, last_of_round=False, **kwargs) == StepPlan((6,))
    assert plan_step(6, whole, last_of_round=True, **kwargs) == StepPlan((3, 3), Statistics.SPLIT)
    assert plan_step(6, whole, last_of_round=True, **{**kwargs, "measure": False}) == StepPlan((6,))
    # An accumulating step's chunks are its groups; they are the same chunks with or without statistics.
    accumulating = plan_batch(20, 8)
    assert plan_step(20, accumulating, last_of_round=True, **kwargs) == StepPlan((7, 7, 6), Statistics.SPLIT)
    assert plan_step(20, accumulating, last_of_round=False, **kwargs) == StepPlan((7, 7, 6))


def test_plan_step_pairs_one_sample_batches_with_the_previous_step():
    from adloco_hf.batch.switch_mode import Statistics, StepPlan, plan_step

    one = plan_batch(1, 8)
    before_last = plan_step(1, one, measure=True, last_of_round=False, next_last_of_round=True, has_previous=False)
    assert before_last == StepPlan((1,), Statistics.NONE, remember_gradient=True)
    last = plan_step(1, one, measure=True, last_of_round=True, next_last_of_round=False, has_previous=True)
    assert last == StepPlan((1,), Statistics.PREVIOUS)
    # A one-round run (the last step is also the first) has nothing to pair with.
    alone = plan_step(1, one, measure=True, last_of_round=True, next_last_of_round=True, has_previous=False)
    assert alone == StepPlan((1,), Statistics.NONE, remember_gradient=True)
