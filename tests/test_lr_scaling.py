"""The inner learning rate that follows the batch (`lr_batch_scaling`): the rule, and what a training run does."""

import json
import math
import os

import pytest
import torch
from helpers import sequence_dataset, tiny_model

from adloco_hf import AdLoCoConfig, AdLoCoTrainer
from adloco_hf.lr_scaling import apply_lr_factor, check_scheduler, lr_factor


@pytest.mark.parametrize(
    ("rule", "batch", "initial", "expected"),
    [("none", 16, 4, 1.0), ("sqrt", 16, 4, 2.0), ("sqrt", 2, 8, 0.5), ("linear", 12, 4, 3.0), ("sqrt", 4, 4, 1.0)],
)
def test_the_rules(rule, batch, initial, expected):
    assert lr_factor(rule, batch, initial) == pytest.approx(expected)


def test_bad_rule_and_sizes_are_refused():
    with pytest.raises(ValueError, match="lr_batch_scaling"):
        lr_factor("cubic", 4, 2)
    with pytest.raises(ValueError, match=">= 1"):
        lr_factor("sqrt", 0, 2)


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


def run(tmp_path, rule, **kwargs):
    settings = dict(
        output_dir=str(tmp_path / rule), max_steps=30, inner_steps=10, per_device_train_batch_size=2, max_batch_size=4,
        eta=0.5, learning_rate=3e-3, lr_scheduler_type="linear", optim="adamw_torch", use_cpu=True, report_to=[],
        save_strategy="no", disable_tqdm=True, seed=7, lr_batch_scaling=rule,
    )  # fmt: skip
    settings.update(kwargs)
    args = AdLoCoConfig(**settings)
    trainer = AdLoCoTrainer(model=tiny_model(), args=args, train_dataset=sequence_dataset(512))
    seen = []  # (batch drawn, learning rate of this step, global step) of every inner step
    step = AdLoCoTrainer.training_step

    def recording(self, model, inputs, num_items_in_batch=None):
        seen.append((len(inputs["input_ids"]), self.optimizer.param_groups[0]["lr"], self.state.global_step))
        return step(self, model, inputs, num_items_in_batch)

    trainer.training_step = recording.__get__(trainer)
    trainer.train()
    lines = [json.loads(line) for line in open(os.path.join(args.output_dir, "adloco_rounds.jsonl"))]
    return trainer, seen, lines


def test_the_learning_rate_follows_the_batch_a_worker_really_uses(tmp_path):
    trainer, seen, lines = run(tmp_path, "sqrt")
    schedule = trainer.lr_scheduler.lr_lambdas[0]
    assert lines[-1]["batch_size"] > 2, "the batch never grew"
    for batch, lr, step in seen:
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
    for _, lr, step in seen:
        assert lr == pytest.approx(3e-3 * schedule(step), rel=1e-6)
    assert all(line["lr_factor"] == 1.0 for line in lines)
