"""The goodput rule's startup profile in real runs (`batch/startup_profile.py`, `batch/profiling.py`): measuring it
changes nothing training computes; under the default settings (the rule, `goodput_timing="startup"`, the machine's
own clock) two runs of one seed are equal bit for bit and a resumed run equals the uninterrupted one, because the
profile is cached and checkpointed; two real workers fit their link and agree on one profile."""

import json
import os

import pytest
import torch
from helpers import (
    RESUME_CONFIG,
    SCRIPTS,
    StepClock,
    comparable_rounds,
    flat_params,
    launch,
    launch_failing,
    launch_run,
    merged_params,
    reports_of,
    rounds_of,
    sequence_dataset,
    tiny_model,
    tiny_run_config,
    worker_spec,
    write_c4_shards,
)

from adloco_hf import AdLoCoTrainer
from adloco_hf.batch.startup_profile import StartupProfile


WORKER = os.path.join(SCRIPTS, "adloco_worker.py")


def train(out, *, model=None, resume=None, clock=None, **settings):
    args = tiny_run_config(out, **settings)
    trainer = AdLoCoTrainer(model=model or tiny_model(), args=args, train_dataset=sequence_dataset(256))
    if clock is not None:
        clock.install(trainer)
    trainer.train(resume_from_checkpoint=resume)
    return trainer


def profile_file(out) -> dict:
    with open(os.path.join(str(out), "out", "adloco_startup_profile.json")) as f:
        return json.load(f)


def test_measuring_the_profile_changes_nothing_training_computes(tmp_path):
    """With dropout (so the passes draw from the random generators) and a request that cannot move (cap = floor),
    the run that measures a profile and one that never does (`"live"`) train the same weights bit for bit: the
    profile draws no training data, puts every generator back, and leaves no gradient or optimizer state."""
    common = dict(batch_size_target="goodput", per_device_train_batch_size=4, batch_size_cap=4, max_steps=12)
    trainers = {
        timing: train(tmp_path / timing, model=tiny_model(attention_dropout=0.3), goodput_timing=timing, **common)
        for timing in ("startup", "live")
    }
    profile = trainers["startup"].worker.rounds.startup_profile
    assert profile is not None and [n for n, _ in profile.passes] == [2, 3, 4]  # half the floor up to the cap
    assert trainers["live"].worker.rounds.startup_profile is None
    assert torch.equal(flat_params(trainers["startup"].model), flat_params(trainers["live"].model))
    assert trainers["startup"].train_sampler.state_dict() == trainers["live"].train_sampler.state_dict()


def test_with_the_default_rule_two_runs_of_a_seed_are_equal_and_a_resume_equals_the_uninterrupted_run(
    tmp_path, monkeypatch
):
    """The library's defaults (the goodput rule from its startup profile) on the machine's own clock: the first run
    measures and caches its profile, the second reads it and trains the same weights bit for bit; a run resumed from
    a checkpoint reads the profile from it and ends where the uninterrupted run did."""
    monkeypatch.setenv("ADLOCO_HF_CACHE", str(tmp_path / "cache"))
    settings = dict(per_device_train_batch_size=2, max_steps=24, batch_size_target="auto", save_strategy="steps",
                    save_steps=12, model=tiny_model(attention_dropout=0.1))  # fmt: skip
    first = train(tmp_path / "first", **settings)
    assert first.args.batch_size_target == "goodput" and first.args.goodput_timing == "startup"  # the defaults
    settings["model"] = tiny_model(attention_dropout=0.1)
    second = train(tmp_path / "second", **settings)
    measured, cached = profile_file(tmp_path / "first"), profile_file(tmp_path / "second")
    assert measured["source"] == "measured" and measured["seconds"] > 0
    assert cached["source"].startswith(str(tmp_path / "cache")) and cached["passes"] == measured["passes"]
    # The startup estimate saw the same examples and dropout masks whether the timings were measured or read.
    assert cached["first_requests"] == measured["first_requests"] and measured["first_requests"]["0"]["noise_scale"]
    assert torch.equal(flat_params(first.model), flat_params(second.model))
    assert (
        rounds_of(str(tmp_path / "first" / "out"))[-1]["next_batch_size"]
        == rounds_of(str(tmp_path / "second" / "out"))[-1]["next_batch_size"]
    )

    settings["model"] = tiny_model(attention_dropout=0.1)
    resumed = train(tmp_path / "resumed", resume=str(tmp_path / "first" / "out" / "checkpoint-12"), **settings)
    assert resumed.worker.rounds.startup_profile.source == "checkpoint"
    assert resumed.worker.rounds.startup_profile.passes == first.worker.rounds.startup_profile.passes
    gap = (flat_params(resumed.model) - flat_params(first.model)).abs().max().item()
    assert gap <= 1e-6


def test_a_virtual_clock_prices_the_profile_and_is_never_cached(tmp_path, monkeypatch):
    """A clock that prices the work (`StepClock`, as the benchmarks' virtual clock does) sets the profile exactly —
    its passes, a run of one worker measuring no link — and its numbers are never written to the cache, which holds
    the machine's."""
    monkeypatch.setenv("ADLOCO_HF_CACHE", str(tmp_path / "cache"))
    clock = StepClock(per_pass=0.01, per_sample=0.002)
    trainer = train(tmp_path / "run", clock=clock, batch_size_target="goodput", per_device_train_batch_size=2,
                    max_steps=12)  # fmt: skip
    profile = trainer.worker.rounds.startup_profile
    assert profile.passes == tuple((n, pytest.approx(0.01 + 0.002 * n)) for n, _ in profile.passes)
    assert profile.link is None and profile.step_model(1).per_round == 0.0
    assert profile.source == "measured" and profile.seconds > 0
    assert not (tmp_path / "cache").exists()


@pytest.fixture(scope="module")
def two_workers(tmp_path_factory):
    """2 real workers (gloo), 2 instances merging at round 2, the default rule timed by a `StepClock`: run twice."""
    root = tmp_path_factory.mktemp("startup-two")
    config = dict(
        per_device_train_batch_size=2, max_batch_size=8, max_steps=24, inner_steps=6, num_instances=2,
        merge_every=2, seed=3, optim="adamw_torch", learning_rate=3e-3, save_strategy="no",
        batch_size_target="auto",
    )  # fmt: skip
    clock = dict(per_pass=0.01, per_sample=0.002, per_hop=1e-3, per_byte=1e-7)
    runs = [launch_run(WORKER, root, config, world_size=2, name=f"run{k}", step_clock=clock) for k in (1, 2)]
    return runs, clock


def test_two_workers_fit_their_link_agree_on_one_profile_and_repeat_the_run(two_workers):
    runs, clock = two_workers
    for _, probe in runs:
        assert [r["world_size"] for r in reports_of(probe, 2)] == [2, 2]
    (first, _), (second, _) = runs
    profile = StartupProfile.from_json(json.load(open(os.path.join(first, "adloco_startup_profile.json"))))
    # The link probe: a ring of the 2 workers, whose hop and byte costs the fit gives back exactly.
    assert profile.link.hop_seconds == pytest.approx(clock["per_hop"])
    assert profile.link.byte_seconds == pytest.approx(clock["per_byte"])
    assert profile.passes == tuple((n, pytest.approx(0.01 + 0.002 * n)) for n, _ in profile.passes)
    assert profile.payload_bytes > 0
    assert torch.equal(merged_params(first), merged_params(second))
    lines = rounds_of(first)
    assert [line["batch_size"] for line in lines] == [line["batch_size"] for line in rounds_of(second)]
    assert all(line["step_model"][3] == pytest.approx(profile.round_seconds(len(line["workers"]))) for line in lines)


@pytest.mark.multiprocess
def test_the_default_rule_resumes_exactly_after_a_preemption_on_streamed_data(tmp_path, monkeypatch):
    """2 workers on the machine's own clock with the library's default rule, attention dropout, a stream, 2 instances
    merging after the checkpoint: SIGTERM to the launcher at step 12 stops both workers at the round's end
    (checkpoint-15); resumed from it, the run logs the uninterrupted run's rounds and ends with its merged model. The
    first launch measured the profile and cached it; the others read it (and the resume, its checkpoint's)."""
    monkeypatch.setenv("ADLOCO_HF_CACHE", str(tmp_path / "cache"))
    shards, _ = write_c4_shards(tmp_path / "shards", 4, 10)
    config = dict(RESUME_CONFIG, batch_size_target="auto")  # the default: the goodput rule from its startup profile
    stream = {"shards": shards, "documents": 40, "block_size": 16}

    def spec(out, probe, **extra):
        return json.dumps(
            worker_spec(str(tmp_path / out), str(tmp_path / probe), 2, config, stream=stream, dropout=0.1, **extra)
        )

    launch(WORKER, spec("full", "p0"), num_processes=2)
    output = launch_failing(WORKER, spec("part", "p1", sigterm=[1, 12, "launcher"]), num_processes=2)
    assert "training was preempted" in output and (tmp_path / "part" / "checkpoint-15").is_dir()
    launch(WORKER, spec("part", "p2", resume=str(tmp_path / "part" / "checkpoint-15")), num_processes=2)
    for probe in ("p0", "p2"):
        assert [r["world_size"] for r in reports_of(tmp_path / probe, 2)] == [2, 2]
    full, part = str(tmp_path / "full"), str(tmp_path / "part")
    assert json.load(open(os.path.join(full, "adloco_startup_profile.json")))["source"] == "measured"
    assert (merged_params(part) - merged_params(full)).abs().max().item() <= 1e-6
    assert comparable_rounds(part) == comparable_rounds(full)
    assert all("goodput" in line or "noise_scale" in line for line in rounds_of(full))  # the rule decided
