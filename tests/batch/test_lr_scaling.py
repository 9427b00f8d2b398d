"""The inner learning rate that follows the batch (`lr_batch_scaling`): the rule, and what a training run does."""

import json
import logging
import math
import os

import pytest
import torch
from helpers import NORM_TEST, sequence_dataset, tiny_model

from adloco_hf import AdLoCoConfig, AdLoCoTrainer
from adloco_hf.batch import lr_scaling
from adloco_hf.batch.lr_scaling import (
    adam_hyperparameters,
    apply_adam_scaling,
    apply_lr_factor,
    batch_ratio,
    check_adam_optimizer,
    check_scheduler,
    lr_factor,
    scaled_adam_hyperparameters,
)


@pytest.mark.parametrize(
    ("rule", "batch", "initial", "expected"),
    [
        ("none", 16, 4, 1.0),
        ("sqrt", 16, 4, 2.0),
        ("sqrt", 2, 8, 0.5),
        ("linear", 12, 4, 3.0),
        ("sqrt", 4, 4, 1.0),
        ("sqrt_adam", 16, 4, 2.0),
        ("sqrt_adam", 2, 8, 0.5),
    ],
)
def test_the_rules(rule, batch, initial, expected):
    assert lr_factor(rule, batch_ratio(batch, initial)) == pytest.approx(expected)


def test_bad_rule_sizes_and_ratios_are_refused():
    with pytest.raises(ValueError, match="lr_batch_scaling"):
        lr_factor("cubic", 2.0)
    with pytest.raises(ValueError, match=">= 1"):
        batch_ratio(0, 2)
    with pytest.raises(ValueError, match=">= 1"):
        batch_ratio(4, 0)
    for ratio in (0.0, -1.0, float("nan")):
        with pytest.raises(ValueError, match="ratio must be > 0"):
            lr_factor("sqrt", ratio)
        with pytest.raises(ValueError, match="ratio must be > 0"):
            optimizer, _ = make_optimizer()
            apply_adam_scaling(optimizer, adam_hyperparameters(optimizer), ratio)


def make_optimizer(lr=0.1):
    param = torch.nn.Parameter(torch.zeros(3))
    optimizer = torch.optim.AdamW([param], lr=lr)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: min(1.0, (step + 1) / 10))
    return optimizer, scheduler


def test_the_factor_scales_the_schedule_and_the_current_rate_from_the_schedule_itself():
    optimizer, scheduler = make_optimizer()
    for _ in range(4):
        optimizer.step()
        scheduler.step()
    base = list(scheduler.base_lrs)
    optimizer.param_groups[0]["lr"] = 123.0  # e.g. state received from another worker: recomputed, not multiplied
    apply_lr_factor(optimizer, scheduler, base, 2.0)
    assert optimizer.param_groups[0]["lr"] == pytest.approx(0.1 * 2.0 * 5 / 10)
    assert scheduler.get_last_lr() == [optimizer.param_groups[0]["lr"]]
    optimizer.step()
    scheduler.step()  # the schedule goes on from the scaled base
    assert optimizer.param_groups[0]["lr"] == pytest.approx(0.1 * 2.0 * 6 / 10)


def test_a_scheduler_without_a_formula_is_refused():
    optimizer, _ = make_optimizer()
    with pytest.raises(ValueError, match="LambdaLR"):
        check_scheduler(torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer))


def run(tmp_path, rule, resume=None, **kwargs):
    settings = dict(
        output_dir=str(tmp_path / rule), max_steps=30, inner_steps=10, per_device_train_batch_size=2, max_batch_size=4,
        eta=0.5, learning_rate=3e-3, lr_scheduler_type="linear", optim="adamw_torch", use_cpu=True, report_to=[],
        save_strategy="no", disable_tqdm=True, seed=7, lr_batch_scaling=rule, **NORM_TEST,
    )  # fmt: skip
    settings.update(kwargs)
    args = AdLoCoConfig(**settings)
    trainer = AdLoCoTrainer(model=tiny_model(), args=args, train_dataset=sequence_dataset(512))
    seen = []  # (batch drawn, learning rate of this step, global step, param groups) of every inner step
    step = AdLoCoTrainer.training_step

    def recording(self, model, inputs, num_items_in_batch=None):
        groups = [{k: g[k] for k in ("lr", "betas", "eps", "weight_decay")} for g in self.optimizer.param_groups]
        seen.append((len(inputs["input_ids"]), groups[0]["lr"], self.state.global_step, groups))
        return step(self, model, inputs, num_items_in_batch)

    trainer.training_step = recording.__get__(trainer)
    trainer.train(resume_from_checkpoint=resume)
    lines = [json.loads(line) for line in open(os.path.join(args.output_dir, "adloco_rounds.jsonl"))]
    return trainer, seen, lines


def test_the_learning_rate_follows_the_batch_a_worker_really_uses(tmp_path):
    trainer, seen, lines = run(tmp_path, "sqrt")
    schedule = trainer.lr_scheduler.lr_lambdas[0]
    assert lines[-1]["batch_size"] > 2, "the batch never grew"
    for batch, lr, step, _ in seen:
        # Every step's learning rate is the schedule's times √(batch / initial batch), the batch as drawn.
        assert lr == pytest.approx(3e-3 * schedule(step) * math.sqrt(batch / 2), rel=1e-6)
    # The round's factor in the rounds file is the one of the batch the round used.
    for line in lines:
        used = line["samples"] / 10
        assert line["lr_factor"] == pytest.approx(math.sqrt(used / 2))


def test_without_scaling_the_learning_rate_ignores_the_batch(tmp_path):
    trainer, seen, lines = run(tmp_path, "none")
    schedule = trainer.lr_scheduler.lr_lambdas[0]
    assert lines[-1]["batch_size"] > 2
    for _, lr, step, _ in seen:
        assert lr == pytest.approx(3e-3 * schedule(step), rel=1e-6)
    assert all(line["lr_factor"] == 1.0 for line in lines)


# ---- lr_batch_scaling="sqrt_adam": Malladi et al.'s whole rule for Adam ----
BASE = {"betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.1, "decoupled": True}


@pytest.fixture
def clip_records(records):
    lr_scaling._clipped.clear()  # each test sees its own "once"
    return records


def clip_warnings(records, name):
    return [r for r in records.records if r.levelno == logging.WARNING and f"({name}) is clipped" in r.getMessage()]


@pytest.mark.parametrize(
    ("ratio", "betas", "eps", "weight_decay"),
    [
        (1.0, (0.9, 0.999), 1e-8, 0.1),
        (4.0, (0.6, 0.996), 5e-9, 0.05),  # 1 - β × 4, ε / 2, wd / 2
        (0.25, (0.975, 0.99975), 2e-8, 0.2),  # a batch below the initial one
        (16.0, (0.0, 0.984), 2.5e-9, 0.025),  # 16 × 0.1 ≥ 1: β1 clipped to 0
        (2000.0, (0.0, 0.0), 1e-8 / math.sqrt(2000), 0.1 / math.sqrt(2000)),  # both clipped
    ],
)
def test_sqrt_adam_values(clip_records, ratio, betas, eps, weight_decay):
    scaled = scaled_adam_hyperparameters(BASE, ratio)
    assert scaled["betas"] == pytest.approx(betas, abs=1e-12)
    assert scaled["eps"] == pytest.approx(eps, rel=1e-12)
    assert scaled["weight_decay"] == pytest.approx(weight_decay, rel=1e-12)
    # AdamW's decoupled decay of one step, lr × wd, is the unscaled one.
    assert math.sqrt(ratio) * scaled["weight_decay"] == pytest.approx(BASE["weight_decay"], rel=1e-12)
    assert bool(clip_warnings(clip_records, "adam_beta1")) == (ratio >= 10)
    assert bool(clip_warnings(clip_records, "adam_beta2")) == (ratio >= 1000)


def test_a_clipped_beta_warns_once_naming_the_field(clip_records):
    for ratio in (16.0, 32.0, 16.0):
        scaled_adam_hyperparameters(BASE, ratio)
    (warning,) = clip_warnings(clip_records, "adam_beta1")
    assert "lr_batch_scaling='sqrt_adam'" in warning.getMessage() and "from batch ratio 10 on" in warning.getMessage()
    assert not clip_warnings(clip_records, "adam_beta2")


def test_an_l2_weight_decay_in_the_gradient_is_left_alone():
    param = torch.nn.Parameter(torch.zeros(3))
    optimizer = torch.optim.Adam([param], lr=0.1, weight_decay=0.1)  # coupled: part of the loss's gradient
    base = adam_hyperparameters(optimizer)
    assert base == [{"betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.1, "decoupled": False}]
    apply_adam_scaling(optimizer, base, batch_ratio(16, 4))
    assert optimizer.param_groups[0]["weight_decay"] == 0.1
    assert optimizer.param_groups[0]["eps"] == pytest.approx(5e-9)


def test_sqrt_adam_scales_from_the_base_values_and_never_compounds():
    params = [torch.nn.Parameter(torch.zeros(3)), torch.nn.Parameter(torch.zeros(2))]
    groups = [{"params": params[:1], "weight_decay": 0.1}, {"params": params[1:], "weight_decay": 0.0}]
    optimizer = torch.optim.AdamW(groups, lr=0.1, betas=(0.9, 0.99), eps=1e-6)
    base = adam_hyperparameters(optimizer)
    for batch in (8, 8, 8, 16, 8):  # a batch applied again (every round) gives the same values
        apply_adam_scaling(optimizer, base, batch_ratio(batch, 2))
    for group, wd in zip(optimizer.param_groups, (0.1, 0.0)):
        assert group["betas"] == pytest.approx((0.6, 0.96))
        assert group["eps"] == pytest.approx(1e-6 / 2)
        assert group["weight_decay"] == pytest.approx(wd / 2)
    optimizer.param_groups[0]["betas"] = (0.1, 0.2)  # e.g. another worker's scaled values, received in a merge
    apply_adam_scaling(optimizer, base, batch_ratio(2, 2))
    assert [(g["betas"], g["eps"], g["weight_decay"]) for g in optimizer.param_groups] == [
        ((0.9, 0.99), 1e-6, 0.1),
        ((0.9, 0.99), 1e-6, 0.0),
    ]
    assert base[0]["betas"] == (0.9, 0.99)  # the base itself is never rewritten


def test_an_optimizer_without_betas_or_eps_is_refused():
    param = torch.nn.Parameter(torch.zeros(3))
    check_adam_optimizer(torch.optim.AdamW([param]))
    for optimizer in (torch.optim.SGD([param], lr=0.1), torch.optim.Adagrad([param])):
        with pytest.raises(ValueError, match="lr_batch_scaling='sqrt_adam'.*optim='adamw_torch'"):
            check_adam_optimizer(optimizer)


def test_a_trainer_with_sgd_and_sqrt_adam_refuses_before_training(tmp_path):
    args = AdLoCoConfig(
        output_dir=str(tmp_path), max_steps=10, inner_steps=5, per_device_train_batch_size=2, max_batch_size=4,
        optim="sgd", lr_scheduler_type="linear", use_cpu=True, report_to=[], save_strategy="no",
        lr_batch_scaling="sqrt_adam",
    )  # fmt: skip
    trainer = AdLoCoTrainer(model=tiny_model(), args=args, train_dataset=sequence_dataset(64))
    with pytest.raises(ValueError, match="lr_batch_scaling='sqrt_adam'.*SGD"):
        trainer.train()
    assert trainer.state.global_step == 0


def expected_groups(batch, lr, weight_decay, beta1):
    """The two AdamW groups of the Trainer (with and without decay) at a batch `batch` / 2 times the initial one."""
    ratio = batch / 2
    betas = (max(0.0, 1 - ratio * (1 - beta1)), 1 - ratio * (1 - 0.999))
    return [
        {"lr": lr, "betas": betas, "eps": 1e-8 / math.sqrt(ratio), "weight_decay": wd / math.sqrt(ratio)}
        for wd in (weight_decay, 0.0)
    ]


def check_sqrt_adam_steps(trainer, seen):
    schedule = trainer.lr_scheduler.lr_lambdas[0]
    for batch, _, step, groups in seen:
        lr = 3e-3 * schedule(step) * math.sqrt(batch / 2)
        for group, expected in zip(groups, expected_groups(batch, lr, 0.1, 0.5), strict=True):
            assert group["lr"] == pytest.approx(expected["lr"], rel=1e-6)
            assert group["betas"] == pytest.approx(expected["betas"], abs=1e-12)
            assert group["eps"] == pytest.approx(expected["eps"], rel=1e-9)
            assert group["weight_decay"] == pytest.approx(expected["weight_decay"], rel=1e-9)


def test_sqrt_adam_scales_the_trainers_adamw_as_the_batch_grows_and_after_a_resume(tmp_path, clip_records):
    # β1 = 0.5: a batch twice the initial one (4 of 2) makes 1 - β1 × 2 = 0, and clips it to 0.
    adam = dict(weight_decay=0.1, adam_beta1=0.5, save_strategy="steps", save_steps=10)
    trainer, seen, lines = run(tmp_path, "sqrt_adam", **adam)
    assert len(trainer.optimizer.param_groups) == 2  # with and without weight decay
    assert seen[0][0] == 2 and lines[-1]["batch_size"] > 2, "the batch never grew"
    check_sqrt_adam_steps(trainer, seen)
    for line in lines:
        assert line["lr_factor"] == pytest.approx(math.sqrt(line["samples"] / 10 / 2))
    state = torch.load(tmp_path / "sqrt_adam" / "checkpoint-20" / "adloco" / "rank-0.pt", weights_only=True)
    assert [(g["betas"], g["eps"], g["weight_decay"]) for g in state["base_adam"]] == [
        ((0.5, 0.999), 1e-8, 0.1),
        ((0.5, 0.999), 1e-8, 0.0),
    ]
    assert any(groups[0]["betas"][0] == 0.0 for *_, groups in seen)  # steps ran with β1 clipped
    assert len(clip_warnings(clip_records, "adam_beta1")) == 1

    # The checkpoint's optimizer holds the values scaled for step 20's batch: a resume scales the base values again.
    batch_at_20 = next(batch for batch, _, step, _ in seen if step == 20)
    assert batch_at_20 > 2
    resumed, seen_after, _ = run(tmp_path, "sqrt_adam", resume=str(tmp_path / "sqrt_adam" / "checkpoint-20"), **adam)
    assert [step for _, _, step, _ in seen_after] == list(range(20, 30))
    assert seen_after[0][0] == batch_at_20
    check_sqrt_adam_steps(resumed, seen_after)
