"""fp16 on CUDA: GradScaler handled by accelerate, statistics scale-free, overflow steps skipped cleanly."""

import json
import os

import pytest
import torch
from helpers import sequence_dataset, tiny_model

from adloco_hf import AdLoCoConfig, AdLoCoTrainer


pytestmark = pytest.mark.cuda


class OverflowOnce(AdLoCoTrainer):
    """Makes the statistics step of round 2 overflow (inf loss): the GradScaler must skip it."""

    overflow_step = 19

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        loss = super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
        if self.state.global_step == self.overflow_step:
            loss = loss * float("inf")
        return loss


def test_fp16_trains_learns_and_survives_an_overflow_step(tmp_path):
    args = AdLoCoConfig(
        output_dir=str(tmp_path), max_steps=40, inner_steps=10, fp16=True, per_device_train_batch_size=4,
        max_batch_size=8, learning_rate=3e-3, report_to=[], save_strategy="no", eta=0.5,
    )  # fmt: skip
    trainer = OverflowOnce(model=tiny_model(), args=args, train_dataset=sequence_dataset(1024))
    trainer.train()
    assert trainer.accelerator.scaler is not None and trainer.accelerator.scaler.is_enabled()
    lines = [json.loads(line) for line in open(os.path.join(tmp_path, "adloco_rounds.jsonl"))]
    print("fp16 rounds:", [(x["outer_step"], x["batch_size"], x["train_loss"], x["grad_variance"]) for x in lines])
    assert lines[-1]["train_loss"] < lines[0]["train_loss"]
    # Round 2's statistics step overflowed: no statistics, so the request stays; the round itself is not lost.
    assert lines[1]["stats_dof"] == 0 and lines[1]["next_batch_size"] == lines[1]["batch_size"]
    assert not lines[1]["skipped"]
    assert all(x["grad_variance"] is not None for i, x in enumerate(lines) if i != 1)
    assert all(torch.isfinite(p).all() for p in trainer.model.parameters())
