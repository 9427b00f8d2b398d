"""AdLoCoTrainer on one worker, against plain Trainer and a hand-written DiLoCo loop."""

import json
import math
import os

import datasets
import pytest
import torch
from helpers import CONTRACT_ROUND_KEYS as ROUND_KEYS
from helpers import TINY_TRAINING, flat_params, sequence_dataset, start_worker, tiny_model, tiny_run_config
from torch import nn
from transformers import Trainer, TrainingArguments, default_data_collator

from adloco_hf import AdLoCoTrainer
from adloco_hf.batch.switch_mode import plan_batch
from adloco_hf.sampling.sampler import AdaptiveBatchSampler


def config(tmp_path, **kwargs):
    return tiny_run_config(tmp_path, **({"max_steps": 24} | kwargs))


def sampler_order(num_samples, batch_size, steps, seed):
    sampler = AdaptiveBatchSampler(num_samples, batch_size=batch_size, num_workers=1, rank=0, seed=seed)
    return [sampler.next_batch() for _ in range(steps)]


def test_one_worker_with_plain_averaging_equals_plain_trainer(tmp_path):
    data = sequence_dataset(256)
    args = config(tmp_path, outer_lr=1.0, outer_momentum=0.0, batch_size_test="none")
    adloco = AdLoCoTrainer(model=tiny_model(), args=args, train_dataset=data)
    adloco.train()

    # Plain Trainer on the same batches, in the same order.
    order = sum(sampler_order(len(data), 4, args.max_steps, args.seed), [])
    plain_args = TrainingArguments(
        **TINY_TRAINING
        | dict(output_dir=str(tmp_path / "plain"), max_steps=args.max_steps, train_sampling_strategy="sequential")
    )
    plain = Trainer(model=tiny_model(), args=plain_args, train_dataset=data.select(order))
    plain.train()
    difference = (flat_params(adloco.model) - flat_params(plain.model)).abs().max().item()
    assert difference < 1e-5
    assert (flat_params(adloco.model) - flat_params(tiny_model())).abs().max() > 1e-2  # it did train


def test_nesterov_outer_steps_equal_a_hand_written_diloco_loop(tmp_path):
    data = sequence_dataset(256)
    H, steps, outer_lr, mu = 6, 24, 0.7, 0.9
    args = config(
        tmp_path, inner_steps=H, max_steps=steps, outer_lr=outer_lr, outer_momentum=mu, batch_size_test="none",
        lr_scheduler_type="constant", max_grad_norm=1.0, pseudo_grad_dtype="bfloat16",
    )  # fmt: skip
    trainer = AdLoCoTrainer(model=tiny_model(), args=args, train_dataset=data)
    trainer.train()

    model = tiny_model()
    params = [p for p in model.parameters()]
    inner = torch.optim.AdamW(params, lr=1e-2, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0)  # kept across rounds
    phi = [p.detach().clone() for p in params]
    velocity = [torch.zeros_like(p) for p in params]
    for step, indices in enumerate(sampler_order(len(data), 4, steps, args.seed), start=1):
        batch = default_data_collator([data[i] for i in indices])
        model(**batch).loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        inner.step()
        inner.zero_grad()
        if step % H == 0:
            with torch.no_grad():
                for p, f, v in zip(params, phi, velocity):
                    delta = f - p
                    v.mul_(mu).add_(delta)
                    f.sub_(outer_lr * (delta + mu * v))
                    p.copy_(f)
    difference = (flat_params(trainer.model) - flat_params(model)).abs().max().item()
    assert difference < 1e-5


class MeanLossModel(nn.Module):
    """A model without loss kwargs: the Trainer then divides each chunk's mean loss itself."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.embed = nn.Embedding(64, 16)
        self.head = nn.Linear(16, 64)

    def forward(self, input_ids, labels):
        logits = self.head(self.embed(input_ids))
        return {"loss": nn.functional.cross_entropy(logits.reshape(-1, 64), labels.reshape(-1))}


@pytest.mark.parametrize("model_factory", [tiny_model, MeanLossModel], ids=["num_items", "mean_loss"])
@pytest.mark.parametrize(("batch", "max_batch"), [(7, 3), (12, 4), (6, 2)])
def test_accumulated_micro_batches_give_the_whole_batch_gradient(tmp_path, model_factory, batch, max_batch):
    data = sequence_dataset(64)
    inputs = default_data_collator([data[i] for i in range(batch)])
    reference = model_factory()
    reference.train()
    reference(**inputs)["loss"].backward()
    expected = torch.cat([p.grad.reshape(-1) for p in reference.parameters()])

    args = config(
        tmp_path,
        per_device_train_batch_size=batch,
        max_batch_size=max_batch,
        switch_threshold=1.0,
        batch_size_test="none",
    )
    trainer = AdLoCoTrainer(model=model_factory(), args=args, train_dataset=data)
    start_worker(trainer)
    assert trainer.worker.plan.process == plan_batch(batch, max_batch, 1.0)  # the plan the worker made accumulates
    assert trainer.worker.plan.process.accumulation_steps > 1
    calls = []
    original = Trainer.training_step

    def counting(self, model, chunk, num_items=None):
        calls.append(len(chunk["input_ids"]))
        return original(self, model, chunk, num_items)

    Trainer.training_step = counting
    try:
        num_items = trainer._get_num_items_in_batch([inputs], trainer.args.device)
        loss = trainer.training_step(trainer.model, inputs, num_items)
    finally:
        Trainer.training_step = original
    got = torch.cat([p.grad.reshape(-1) for p in trainer.model.parameters()])
    assert sum(calls) == batch and len(calls) == trainer.worker.plan.process.accumulation_steps
    assert max(calls) <= max_batch
    assert torch.allclose(got, expected, atol=1e-6, rtol=1e-4)
    assert loss.item() == pytest.approx(reference(**inputs)["loss"].item(), rel=1e-5)


def test_statistics_step_splits_the_batch_without_changing_the_gradient(tmp_path):
    data = sequence_dataset(64)
    inputs = default_data_collator([data[i] for i in range(8)])
    reference = tiny_model()
    reference(**inputs).loss.backward()
    expected = torch.cat([p.grad.reshape(-1) for p in reference.parameters()])
    args = config(
        tmp_path, max_steps=1, inner_steps=1, per_device_train_batch_size=8, max_batch_size=8, batch_size_test="norm"
    )
    trainer = AdLoCoTrainer(model=tiny_model(), args=args, train_dataset=data)
    start_worker(trainer)
    chunks = []
    original = Trainer.training_step

    def recording(self, model, chunk, num_items=None):
        chunks.append(len(chunk["input_ids"]))
        return original(self, model, chunk, num_items)

    Trainer.training_step = recording
    try:  # the round's last step measures the statistics on two halves of its batch
        trainer.training_step(trainer.model, inputs, trainer._get_num_items_in_batch([inputs], trainer.args.device))
    finally:
        Trainer.training_step = original
    assert chunks == [4, 4]
    got = torch.cat([p.grad.reshape(-1) for p in trainer.model.parameters()])
    assert torch.allclose(got, expected, atol=1e-6, rtol=1e-4)
    stats = trainer.worker.parts.steps.round_statistics
    assert stats is not None and stats.dof == 1 and stats.samples == pytest.approx(8)
    assert stats.grad_sq_norm == pytest.approx(float(expected.double() @ expected.double()), rel=1e-4)


def test_training_learns_grows_the_batch_and_writes_the_rounds_file(tmp_path):
    data = sequence_dataset(512)
    args = config(tmp_path, max_steps=30, inner_steps=10, per_device_train_batch_size=2, max_batch_size=2, eta=0.5)
    before = flat_params(tiny_model())
    trainer = AdLoCoTrainer(model=tiny_model(), args=args, train_dataset=data)
    trainer.train()
    lines = [json.loads(line) for line in open(os.path.join(args.output_dir, "adloco_rounds.jsonl"))]
    assert [line["outer_step"] for line in lines] == [1, 2, 3]
    for line in lines:
        assert set(ROUND_KEYS) <= set(line)
    assert lines[-1]["train_loss"] < lines[0]["train_loss"]
    assert lines[-1]["batch_size"] > 2  # the norm test grew the request
    assert all(b["batch_size"] >= a["batch_size"] for a, b in zip(lines, lines[1:]))  # never shrinks
    assert any(line["accumulation_steps"] > 1 for line in lines)  # switch mode kicked in above 2 × 2
    assert trainer.train_sampler.batch_size == plan_batch(lines[-1]["next_batch_size"], 2).batch_size
    after = flat_params(trainer.model)
    assert ((after - before).abs() > 0).float().mean() > 0.99  # every trainable parameter changed
    assert torch.isfinite(after).all()
    assert os.path.isfile(os.path.join(args.output_dir, "merged", "model.safetensors"))


def test_bf16_on_cpu_runs_and_learns(tmp_path):
    data = sequence_dataset(256)
    args = config(tmp_path, bf16=True, max_steps=30, inner_steps=10)
    trainer = AdLoCoTrainer(model=tiny_model(), args=args, train_dataset=data)
    result = trainer.train()
    lines = [json.loads(line) for line in open(os.path.join(args.output_dir, "adloco_rounds.jsonl"))]
    assert lines[-1]["train_loss"] < lines[0]["train_loss"] - 0.3
    assert math.isfinite(result.training_loss)
    assert trainer.accelerator.mixed_precision == "bf16"


def test_a_missing_checkpoint_and_a_dataset_of_text_are_named_before_training(tmp_path):
    """Issue 41: a checkpoint path that does not exist was diagnosed as a folder not written by AdLoCoTrainer; a
    dataset of text got the Trainer's advice to set remove_unused_columns=False (the fix is to tokenise)."""
    args = config(tmp_path, eval_strategy="steps", eval_steps=6)
    data, text = sequence_dataset(64), datasets.Dataset.from_dict({"text": ["the cat sat on the mat"] * 64})
    trainer = AdLoCoTrainer(model=tiny_model(), args=args, train_dataset=data, eval_dataset=data)
    missing = str(tmp_path / "x" / "does-not-exist")
    with pytest.raises(FileNotFoundError, match=f"resume_from_checkpoint={missing!r} does not exist"):
        trainer.train(resume_from_checkpoint=missing)
    for train, evaluate, which in [(text, data, "training"), (data, text, "evaluation")]:
        trainer = AdLoCoTrainer(model=tiny_model(), args=args, train_dataset=train, eval_dataset=evaluate)
        with pytest.raises(ValueError) as error:
            trainer.train()
        message = str(error.value)
        assert f"the {which} dataset holds text (column(s) ['text'] of strings)" in message, message
        assert "Tokenise it first: adloco_hf.data.build_lm_datasets(" in message
    assert not os.path.exists(os.path.join(args.output_dir, "adloco_rounds.jsonl"))


def test_bad_input_is_refused_before_training(tmp_path):
    data = sequence_dataset(64)
    with pytest.raises(ValueError, match="eval_dataset"):
        AdLoCoTrainer(
            model=tiny_model(), args=config(tmp_path, eval_strategy="steps", eval_steps=6), train_dataset=data
        )
    with pytest.raises(TypeError, match="AdLoCoConfig"):
        AdLoCoTrainer(model=tiny_model(), args=TrainingArguments(output_dir=str(tmp_path)), train_dataset=data)
    small = AdLoCoTrainer(
        model=tiny_model(), args=config(tmp_path, per_device_train_batch_size=8), train_dataset=data.select(range(5))
    )
    before = flat_params(small.model)
    with pytest.raises(ValueError, match="fewer than per_device_train_batch_size=8"):
        small.train()
    assert torch.equal(before, flat_params(small.model))

    class Stateless(torch.utils.data.IterableDataset):  # a stream that cannot say where it stopped
        def __iter__(self):
            yield from data

    with pytest.raises(ValueError, match="without state_dict"):
        AdLoCoTrainer(model=tiny_model(), args=config(tmp_path), train_dataset=Stateless()).train()


def test_one_sample_batches_measure_noise_with_the_previous_step(tmp_path):
    data = sequence_dataset(512)
    args = config(tmp_path, max_steps=30, inner_steps=10, per_device_train_batch_size=1, max_batch_size=4, eta=0.5)
    trainer = AdLoCoTrainer(model=tiny_model(), args=args, train_dataset=data)
    trainer.train()
    lines = [json.loads(line) for line in open(os.path.join(args.output_dir, "adloco_rounds.jsonl"))]
    first = lines[0]
    assert first["batch_size"] == 1
    assert first["stats_dof"] == 1 and first["grad_variance"] is not None and first["grad_variance"] > 0
    assert first["next_batch_size"] > 1  # the noise measured from two one-sample steps grew the batch
    assert lines[1]["stats_dof"] >= 1  # from then on the batch itself is split
    assert not trainer.worker.parts.steps.collector.has_previous  # the kept gradient was released


@pytest.mark.parametrize("test", ["inner_product", "augmented_inner_product"])
def test_inner_product_tests_drive_the_batch_size(tmp_path, test):
    data = sequence_dataset(512)
    theta, nu = 0.05, 0.5
    args = config(
        tmp_path, max_steps=30, inner_steps=10, per_device_train_batch_size=2, max_batch_size=2, switch_threshold=1.0,
        batch_size_test=test, theta=theta, nu=nu, batch_size_cap=64,
    )  # fmt: skip
    trainer = AdLoCoTrainer(model=tiny_model(), args=args, train_dataset=data)
    trainer.train()
    lines = [json.loads(line) for line in open(os.path.join(args.output_dir, "adloco_rounds.jsonl"))]
    for line in lines:
        assert line["stats_dof"] >= 1
        g2 = line["grad_sq_norm"]
        wanted = math.ceil(line["grad_ip_variance"] / (theta**2 * g2**2))
        if test == "augmented_inner_product":
            wanted = max(wanted, math.ceil(line["grad_orth_variance"] / (nu**2 * g2)))
        assert line["next_batch_size"] == min(max(line["batch_size"], wanted), 64)
    assert lines[-1]["next_batch_size"] > 2
    # Accumulating more than two micro-batches: the collector pools them into two halves for the inner products.
    assert any(line["accumulation_steps"] > 2 for line in lines)


def test_evaluate_is_exact_and_keeps_compute_metrics(tmp_path):
    data = sequence_dataset(64)
    eval_data = data.select(range(13))  # an uneven last batch must not be padded or double-counted

    def compute_metrics(prediction):
        return {"n_predictions": float(len(prediction.label_ids))}

    args = config(tmp_path, per_device_eval_batch_size=4)
    trainer = AdLoCoTrainer(
        model=tiny_model(), args=args, train_dataset=data, eval_dataset=eval_data, compute_metrics=compute_metrics
    )
    metrics = trainer.evaluate()
    model = trainer.model
    with torch.no_grad():
        batch = default_data_collator([eval_data[i] for i in range(13)])
        logits = model(input_ids=batch["input_ids"]).logits[:, :-1]
        direct = nn.functional.cross_entropy(logits.reshape(-1, 64), batch["labels"][:, 1:].reshape(-1)).item()
    assert metrics["eval_loss"] == pytest.approx(direct, rel=1e-6)
    assert metrics["eval_perplexity"] == pytest.approx(math.exp(direct), rel=1e-6)
    assert metrics["eval_n_predictions"] == 13
    assert "eval_loss" in trainer.state.log_history[-1]
