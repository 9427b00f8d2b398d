"""`batch_size_target="goodput"` measuring on the rounds (`goodput_timing="live"`; the startup profile's runs are in
test_startup_profile_runs.py) in real runs, timed by a deterministic clock (`helpers.StepClock`): the worker
measures the passes, the rest of each step and the outer step as the clock says; every decision is the pure rule's on
what the rounds file logs; a run stopped and resumed from a checkpoint takes the uninterrupted run's decisions (the
cost averages are in the checkpoint); and the same with 2 workers of 2 processes, 2 instances that merge (compact
merges: bf16 weights, int8 momentum blocks), switch mode and int8 pseudo-gradients; and a streamed 2-worker run
with merges stopped after its checkpoint and resumed ends as the uninterrupted one."""

import json
import os

import pytest
from helpers import (
    COMPARED_ROUND_KEYS,
    RESUME_CONFIG,
    SCRIPTS,
    StepClock,
    launch,
    launch_run,
    merged_params,
    rounds_of,
    sequence_dataset,
    tiny_model,
    tiny_run_config,
    worker_spec,
    write_c4_shards,
)

from adloco_hf import AdLoCoTrainer
from adloco_hf.batch.goodput import GoodputModel, choose_request
from adloco_hf.batch.lr_scaling import batch_ratio, lr_factor
from adloco_hf.batch.switch_mode import SwitchMode, plan_batch
from adloco_hf.batch.throughput import StepTimeModel


# The clock's costs: a pass of n samples 0.01 + 0.002 n s, 0.005 s for the rest of a step, and an outer step of 0.6,
# 0.2 and 0.4 s in turn (rounds 1, 2, 3, ...).
CLOCK = dict(per_step=0.005, per_pass=0.01, per_sample=0.002, per_round=[0.6, 0.2, 0.4])
GOODPUT = dict(
    batch_size_target="goodput", per_device_train_batch_size=2, max_batch_size=4, batch_size_cap=16,
    lr_batch_scaling="sqrt", inner_steps=5, goodput_timing="live",
)  # fmt: skip
# The goodput rule's figures: equal up to the float round-off of the clock's differences (its absolute time differs).
MEASURED_KEYS = ("goodput", "goodput_kept", "step_model", "noise_scale")


def check_decisions(rounds: list[dict], *, processes: int = 1, initial: int = 2, cap: int | None = 16) -> None:
    """Every logged choice is the pure rule's on the logged step model and noise scale; with `cap=None` (no
    `batch_size_cap`) in [initial, the rule's own bound]."""
    for line in rounds:
        if "goodput" not in line:
            assert line["next_batch_size"] == line["batch_size"]
            continue
        model = GoodputModel(
            times=StepTimeModel(*line["step_model"]),
            noise_scale=line["noise_scale"],
            inner_steps=line["inner_steps"],
            workers=len(line["workers"]),
            processes=processes,
            switch=SwitchMode(4, 2.0),
            reference=initial,
        )
        # Requests only grow (the default batch_size_shrink=False): the search starts at the current request.
        current = line["batch_size"]
        low = max(initial, processes * ((current if cap is None else min(current, cap)) // processes))
        high = max(low, cap) if cap is not None else model.request_bound(low, current=current)
        choice = choose_request(model, current=current, low=low, high=high, hysteresis=0.05)
        asked = line.get("asked_batch_size", line["next_batch_size"])  # a merge may have planned another
        assert (choice.request, choice.goodput, choice.kept) == pytest.approx(
            (asked, line["goodput"], line["goodput_kept"])
        ), line


def train(output_dir, *, resume=None, max_steps=30, **more):
    settings = {**GOODPUT, **more}
    args = tiny_run_config(output_dir, max_steps=max_steps, save_strategy="steps", save_steps=10, **settings)
    trainer = AdLoCoTrainer(model=tiny_model(), args=args, train_dataset=sequence_dataset(256))
    StepClock(**CLOCK).install(trainer)
    trainer.train(resume_from_checkpoint=resume)
    return trainer, rounds_of(args.output_dir)


def test_one_worker_measures_what_the_clock_says_follows_the_rule_and_resumes_exactly(tmp_path):
    full, rounds = train(tmp_path / "full")
    assert len(rounds) == 6
    # The measured model is the clock's: α and β from the passes of 2 and the statistics step's halves of 1.
    first = rounds[0]["step_model"]
    assert first == pytest.approx([0.005, 0.01, 0.002, 0.6])
    assert [line["step_model"][3] for line in rounds[:2]] == pytest.approx([0.6, (0.5 * 0.6 + 0.2) / 1.5])
    check_decisions(rounds)
    sizes = [line["batch_size"] for line in rounds]
    assert len(set(sizes)) > 1 and max(sizes) > 2  # the rule moved the request
    # The inner learning rate follows the batch the last round chose (sqrt rule, reference 2).
    last = rounds[-1]["next_batch_size"]
    used = plan_batch(last, 4, 2.0).batch_size
    assert full.worker.plan.process.batch_size == used
    schedule = full.lr_scheduler.lr_lambdas[0](full.lr_scheduler.last_epoch)
    expected_lr = full.args.learning_rate * schedule * lr_factor("sqrt", batch_ratio(used, 2))
    assert full.optimizer.param_groups[0]["lr"] == pytest.approx(expected_lr)

    # Resumed from checkpoint-10: the same decisions afterwards, which needs the cost averages of rounds 1 and 2.
    _, resumed = train(tmp_path / "resumed", resume=str(tmp_path / "full" / "out" / "checkpoint-10"))
    later = [line for line in rounds if line["outer_step"] > 2]
    assert [{k: line[k] for k in COMPARED_ROUND_KEYS} for line in resumed] == [
        {k: line[k] for k in COMPARED_ROUND_KEYS} for line in later
    ]
    for again, line in zip(resumed, later, strict=True):
        for key in MEASURED_KEYS:
            assert again.get(key) == pytest.approx(line.get(key), rel=1e-9), (key, again, line)
    state = json.load(open(os.path.join(tmp_path / "full" / "out" / "checkpoint-10", "trainer_state.json")))
    assert state["global_step"] == 10


@pytest.fixture(scope="module")
def two_by_two_goodput(tmp_path_factory):
    """2 workers of 2 processes, 2 instances merging at round 2 (compact merges), goodput, switch mode and int8
    pseudo-gradients."""
    config = dict(
        GOODPUT, per_device_train_batch_size=1, batch_size_cap=16, processes_per_worker=2, num_instances=2,
        merge_every=2, max_steps=20, seed=3, optim="adamw_torch", learning_rate=3e-3,
        pseudo_grad_compression="int8", merge_payload="compact", save_strategy="no",
    )  # fmt: skip
    return launch_run(
        os.path.join(SCRIPTS, "adloco_worker.py"),
        tmp_path_factory.mktemp("goodput"),
        config,
        world_size=4,
        step_clock=CLOCK,
    )


def test_two_workers_of_two_processes_merge_and_follow_the_rule(two_by_two_goodput):
    out, probe = two_by_two_goodput
    rounds = rounds_of(out)
    check_decisions(rounds, processes=2)
    assert all(line["next_batch_size"] % 2 == 0 for line in rounds)
    assert any(line["merged_from"] for line in rounds) and rounds[-1]["num_instances"] == 1
    # The compact merge: every process of the survivor holds the same weights (checked after every round), and
    # its bytes are the compact payload's (2 + 1 + 4/256 bytes a parameter), not float32's 8: on each of the 2 local
    # ranks a ring of 2 members sends 2 payloads.
    merge = next(line for line in rounds if line["merged_from"])
    numel = json.load(open(os.path.join(probe, "report-rank0.json")))["numel"]
    assert 2 * 2 * 3 * numel < merge["merge_bytes"] <= 2 * 2 * (3 + 4 / 256) * numel + 2 * 2 * 4 * 2
    assert any(line["next_batch_size"] != line["batch_size"] for line in rounds)
    for rank in range(4):  # every round's end checked replicas, the sampler's batch and the learning rate
        report = json.load(open(os.path.join(probe, f"report-rank{rank}.json")))
        assert report["world_size"] == 4 and report["rounds_checked"] == 4
        assert report["steps_checked_in_worker"] == 20  # the worker's 2 processes agreed after every step
        # The clock was told of the merge (the virtual clock's hook): its round, and every rank's bytes, which add
        # up to the line's merge bytes, the same on every rank.
        ((round_number, sent),) = report["clock_merges"]
        assert round_number == merge["outer_step"] and len(sent) == 4 and sum(sent) == merge["merge_bytes"]


def test_a_streamed_run_with_merges_stopped_and_resumed_takes_the_uninterrupted_runs_decisions(tmp_path):
    """2 workers reading a stream, 2 instances merging (compactly) at round 4 after the checkpoint at step 10, int8
    pseudo-gradients: stopped at step 12 and resumed from checkpoint-10, the run logs the uninterrupted run's rounds,
    goodput predictions included (the cost averages of rounds 1 and 2 come from the checkpoint), and ends with its
    merged model."""
    shards, _ = write_c4_shards(tmp_path / "shards", 4, 10)
    config = dict(RESUME_CONFIG, **GOODPUT, merge_payload="compact", pseudo_grad_compression="int8")
    stream = {"shards": shards, "documents": 40, "block_size": 16}

    def spec(out, probe, **extra):
        return json.dumps(
            worker_spec(
                str(tmp_path / out), str(tmp_path / probe), 2, config, stream=stream, step_clock=CLOCK, **extra
            )
        )

    worker = os.path.join(SCRIPTS, "adloco_worker.py")
    launch(worker, spec("full", "p0"), num_processes=2)
    launch(worker, spec("part", "p1", fail=["all", 12, 0]), num_processes=2)
    checkpoint = tmp_path / "part" / "checkpoint-10"
    assert checkpoint.is_dir() and not (tmp_path / "part" / "merged").exists()
    launch(worker, spec("part", "p2", resume=str(checkpoint)), num_processes=2)

    assert [json.load(open(tmp_path / "p2" / f"report-rank{r}.json"))["world_size"] for r in range(2)] == [2, 2]
    full, part = rounds_of(str(tmp_path / "full")), rounds_of(str(tmp_path / "part"))
    assert [{k: line[k] for k in COMPARED_ROUND_KEYS} for line in part] == [
        {k: line[k] for k in COMPARED_ROUND_KEYS} for line in full
    ]
    for again, line in zip(part, full, strict=True):
        for key in MEASURED_KEYS:  # a round without a noise scale yet logs no goodput
            expected = line.get(key)
            assert again.get(key) == (None if expected is None else pytest.approx(expected, rel=1e-9)), (key, line)
    check_decisions(full)
    assert any(line["merged_from"] for line in full if line["outer_step"] == 4)  # merged after the resume
    assert any("goodput" in line and line["next_batch_size"] != line["batch_size"] for line in full)
    gap = (merged_params(str(tmp_path / "part")) - merged_params(str(tmp_path / "full"))).abs().max().item()
    assert gap <= 1e-6


def test_without_batch_size_cap_the_rule_bounds_its_own_search(tmp_path):
    """`batch_size_target="goodput"` with no `batch_size_cap` trains (it was refused before): every choice is the
    pure rule's over [the initial request, `request_bound`], which, beyond 16, lets it choose what the capped run
    could not."""
    trainer, rounds = train(tmp_path / "free", batch_size_cap=None, max_steps=40)
    assert trainer.args.batch_size_cap is None and len(rounds) == 8
    check_decisions(rounds, cap=None)
    assert any("goodput" in line for line in rounds)
    assert max(line["next_batch_size"] for line in rounds) > GOODPUT["batch_size_cap"]
