"""The startup profile's pure parts (`batch/startup_profile.py`) and its cache (`batch/profile_cache.py`): the sizes it
times, the link fitted from two all-reduces, the costs it gives the goodput rule, and files keyed by what the
measurement depends on."""

import json

import pytest

from adloco_hf.batch import profile_cache
from adloco_hf.batch.startup_profile import LinkFit, StartupProfile, fit_link, profile_sizes
from adloco_hf.batch.throughput import fit_pass_seconds


@pytest.mark.parametrize(
    ("smallest", "largest", "expected"),
    [
        (2, 64, [2, 6, 20, 64]),
        (1, 8, [1, 2, 4, 8]),
        (2, 280, [2, 10, 54, 280]),
        (1, 2, [1, 2]),  # fewer than three sizes exist
        (3, 5, [3, 4, 5]),
        (4, 4, [4]),
        (9, 4, [4]),  # a floor above the largest pass: the largest alone
    ],
)
def test_the_profile_times_sizes_spread_in_log_from_half_the_floor_to_the_largest_pass(smallest, largest, expected):
    assert profile_sizes(smallest, largest) == expected


def test_at_least_three_distinct_sizes_whenever_three_exist():
    for smallest in range(1, 20):
        for largest in range(smallest, 300, 7):
            sizes = profile_sizes(smallest, largest)
            assert sizes == sorted(set(sizes)) and sizes[0] == smallest and sizes[-1] == largest
            assert len(sizes) >= min(3, largest - smallest + 1)


@pytest.mark.parametrize("workers", [2, 3, 4, 8])
def test_two_all_reduces_give_back_the_rings_latency_and_bandwidth(workers):
    link = LinkFit(hop_seconds=2e-4, byte_seconds=8 / 1e9)  # 1 Gbit/s
    small, large = 4096, 31_000_000
    fit = fit_link(
        (small, link.all_reduce_seconds(small, workers)), (large, link.all_reduce_seconds(large, workers)), workers
    )
    assert fit.hop_seconds == pytest.approx(2e-4) and fit.byte_seconds == pytest.approx(8e-9)
    assert fit.bits_per_second == pytest.approx(1e9)
    # A ring of M workers: 2 (M − 1) steps of a hop and 1/M of the payload each.
    assert link.all_reduce_seconds(1e6, 4) == pytest.approx(6 * (2e-4 + 0.25e6 * 8e-9))
    assert link.all_reduce_seconds(1e6, 1) == 0.0


def test_a_noisy_link_fit_never_gives_a_negative_cost():
    # The larger message came back faster (noise): no cost per byte, the mean as latency.
    flat = fit_link((4096, 0.010), (1_000_000, 0.008), 4)
    assert flat.byte_seconds == 0.0 and flat.hop_seconds == pytest.approx(0.009 / 6)
    # A line through the points would cross below 0: through the origin instead.
    through_zero = fit_link((4096, 0.0), (1_000_000, 0.06), 4)
    assert through_zero.hop_seconds == 0.0 and through_zero.byte_seconds == pytest.approx(0.06 / 6 / 250_000)
    with pytest.raises(ValueError, match="must exceed"):
        fit_link((10, 1.0), (10, 2.0), 2)
    assert fit_link((1, 1.0), (2, 2.0), 1) == LinkFit(0.0, 0.0)


def profile(**changes) -> StartupProfile:
    values = dict(
        passes=((2, 0.012), (6, 0.020), (20, 0.048), (64, 0.136)),  # 8 ms + 2 ms a sample
        link=LinkFit(1e-4, 8e-9),
        payload_bytes=500_000_000,
    )
    return StartupProfile(**(values | changes))


def test_the_rules_costs_are_the_fitted_pass_and_the_ring_for_the_instances_workers():
    p = profile()
    for workers in (1, 2, 4):
        model = p.step_model(workers)
        assert (model.per_step, model.per_pass, model.per_sample) == pytest.approx((0.0, 0.008, 0.002))
        assert model.per_round == pytest.approx(p.link.all_reduce_seconds(500_000_000, workers))
    assert p.step_model(1).per_round == 0.0  # an instance of one worker sends nothing
    assert p.step_model(4).per_round == pytest.approx(6 * (1e-4 + 125_000_000 * 8e-9))
    assert profile(link=None).round_seconds(4) == 0.0  # a run of one worker measured no link
    assert profile(passes=()).step_model(2) is None


def test_timings_that_fall_with_the_batch_are_noise_and_read_as_proportional():
    """Passes timed on a busy machine can come out slower at small sizes: a negative slope over sizes that span 32 x
    is read as a pass proportional to its samples (a larger batch never cheaper per sample), never as a flat one
    (every batch free), which would send the rule to its largest request."""
    noisy = profile(passes=((2, 0.9), (6, 0.6), (20, 0.5), (64, 0.4)))
    model = noisy.step_model(1)
    assert model.per_pass == 0.0 and model.per_sample == pytest.approx(2.4 / 92)
    assert fit_pass_seconds([(n, s) for n, s in noisy.passes])[1] == 0.0  # the round's fit would have been flat


def test_startup_live_starts_the_averages_from_the_profile():
    p = profile()
    averages = p.throughput_profile(4)
    model = averages.model()
    assert (model.per_pass, model.per_sample) == pytest.approx(fit_pass_seconds([(n, s) for n, s in p.passes]))
    assert model.per_round == pytest.approx(p.round_seconds(4)) and model.per_step == 0.0
    assert averages.step == (0.0, 0.0)  # the step's rest is not measured: the first round's timing sets it


def test_the_profile_survives_json_and_every_rank_agrees_on_the_slowest():
    p = profile(seconds=1.5, source="measured", key={"device": "cpu"})
    assert StartupProfile.from_json(json.loads(json.dumps(p.to_json()))) == p
    assert StartupProfile.agreed([[1.0, 5.0, 2.0], [3.0, 4.0, 2.5]]) == [3.0, 5.0, 2.5]
    described = p.describe()
    assert "2, 6, 20, 64 samples" in described and "8 ms + 2 ms a sample" in described and "1 Gbit/s" in described


KEY = dict(
    model_config='{"hidden_size": 8}',
    device="cpu:2 threads",
    precision="fp32",
    sequence_length=32,
    compiled=False,
    workers=2,
    processes_per_worker=1,
    payload_bytes=1000,
    sizes=(1, 2, 4),
    backend="gloo",
    hosts=["b", "a", "a"],
)


def test_a_profile_is_kept_under_what_it_depends_on(tmp_path, monkeypatch):
    monkeypatch.setenv("ADLOCO_HF_CACHE", str(tmp_path / "cache"))
    key = profile_cache.profile_key(**KEY)
    assert key["hosts"] == ["a", "b"] and len(key["model"]) == 16
    assert profile_cache.load_profile(key) is None
    path = profile_cache.save_profile(profile(), key)
    assert path.startswith(str(tmp_path / "cache" / "device_profiles"))
    found = profile_cache.load_profile(key)
    assert found.source == path and found.passes == profile().passes and found.link == profile().link
    # Anything the measurement depends on is another profile.
    for field, value in (("sequence_length", 64), ("precision", "bf16"), ("sizes", (1, 2, 8)), ("hosts", ["c"])):
        assert profile_cache.load_profile(profile_cache.profile_key(**(KEY | {field: value}))) is None, field


def test_the_cache_folder_follows_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("ADLOCO_HF_CACHE", str(tmp_path / "mine"))
    assert profile_cache.cache_folder() == str(tmp_path / "mine")
    monkeypatch.delenv("ADLOCO_HF_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert profile_cache.cache_folder() == str(tmp_path / "xdg" / "adloco_hf")


def test_an_unreadable_cache_file_is_measured_again_and_an_unwritable_folder_only_warns(tmp_path, records):
    key = profile_cache.profile_key(**KEY)
    path = profile_cache.save_profile(profile(), key, tmp_path)
    with open(path, "w") as f:
        f.write("{not json")
    assert profile_cache.load_profile(key, tmp_path) is None
    assert "measuring again" in records.text
    blocked = tmp_path / "file"
    blocked.write_text("")  # a file where the folder should be
    assert profile_cache.save_profile(profile(), key, blocked) is None
    assert "measures it again" in records.text
