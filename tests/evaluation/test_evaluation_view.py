"""The evaluation's interfaces: it reads the worker through `EvaluationView` only, and the Trainer through its public
API (the private members it needs go through `config/compat.py`'s shims)."""

import ast
import pathlib

import numpy as np
import pytest
import torch
from helpers import NORM_TEST, sequence_dataset, tiny_model
from torch import nn

from adloco_hf import AdLoCoConfig, AdLoCoTrainer
from adloco_hf.evaluation.predictions import predict_shard
from adloco_hf.evaluation.view import EvaluationView


EVALUATION = pathlib.Path(__file__).resolve().parents[2] / "adloco_hf" / "evaluation"


def _imports(tree: ast.Module) -> set[str]:
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            found |= {f"{'.' * node.level}{node.module or ''}.{alias.name}" for alias in node.names}
        elif isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
    return found


@pytest.mark.parametrize("module", ["evaluate.py", "predictions.py"])
def test_the_evaluation_reads_no_worker_internals_and_no_private_trainer_member(module):
    tree = ast.parse((EVALUATION / module).read_text())
    worker_imports = [name for name in _imports(tree) if "worker" in name.split(".")]
    assert not worker_imports, f"{module} imports the worker ({worker_imports}): read it through EvaluationView"
    private = [
        f"{module}:{node.lineno}: {ast.unparse(node)}"
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute)
        and node.attr.startswith("_")
        and not node.attr.startswith("__")
        and getattr(node.value, "id", None) == "trainer"
    ]
    assert not private, "private Trainer members outside config/compat.py's shims:\n" + "\n".join(private)


class StrictModel(nn.Module):
    """A causal LM whose forward takes `input_ids`, `labels` and the Trainer's token count only: a column left in the
    batch is an error. Its loss is summed over the tokens that count and divided by the Trainer's count of them."""

    accepts_loss_kwargs = True  # the Trainer passes `num_items_in_batch`
    loss_type = "ForCausalLM"  # ... counted over the shifted labels

    def __init__(self, vocab_size: int = 64, width: int = 16):
        super().__init__()
        torch.manual_seed(0)
        self.embed = nn.Embedding(vocab_size, width)
        self.head = nn.Linear(width, vocab_size)

    def forward(self, input_ids, labels=None, num_items_in_batch=None):
        logits = self.head(self.embed(input_ids))
        loss = None
        if labels is not None:
            target = labels[:, 1:]
            total = nn.functional.cross_entropy(
                logits[:, :-1].transpose(1, 2), target, ignore_index=-100, reduction="sum"
            )
            loss = total / (num_items_in_batch if num_items_in_batch is not None else (target != -100).sum())
        return {"loss": loss, "logits": logits}


def test_shards_predicted_apart_join_into_the_whole_sets_predictions_and_exact_loss(tmp_path):
    data = sequence_dataset(32)
    labels = np.array(data["labels"][:13])
    labels[3, 20:] = -100  # samples with fewer tokens that count: the loss is per token, not per batch
    eval_data = data.select(range(13)).remove_columns("labels").add_column("labels", labels.tolist())
    eval_data = eval_data.add_column("source_id", list(range(13)))  # a column the model does not take
    args = AdLoCoConfig(
        output_dir=str(tmp_path),
        max_steps=4,
        inner_steps=2,
        per_device_eval_batch_size=4,
        include_for_metrics=["inputs"],
        use_cpu=True,
        report_to=[],
        save_strategy="no",
        disable_tqdm=True,
    )
    trainer = AdLoCoTrainer(model=StrictModel(), args=args, train_dataset=data, eval_dataset=eval_data)
    shards = [predict_shard(trainer, eval_data, [0, 1], rank, collect=True, progress=False) for rank in (0, 1)]

    inputs = torch.tensor(eval_data["input_ids"])
    with torch.no_grad():
        logits = trainer.model(inputs)["logits"]
    target = torch.tensor(labels)[:, 1:]
    token_losses = nn.functional.cross_entropy(
        logits[:, :-1].transpose(1, 2), target, ignore_index=-100, reduction="none"
    )
    expected_loss = float(token_losses.sum() / (target != -100).sum())
    loss = sum(s.loss_sum for s in shards) / sum(s.count for s in shards)
    assert loss == pytest.approx(expected_loss, rel=1e-5)
    assert sum(s.count for s in shards) == int((target != -100).sum())  # the tokens that count, shard by shard
    assert [len(s.arrays["label_ids"]) for s in shards] == [6, 7]  # contiguous shards: 13 // 2 and the rest
    joined = {
        name: np.concatenate([s.arrays[name] for s in shards]) for name in ("predictions", "label_ids", "inputs")
    }
    np.testing.assert_allclose(joined["predictions"], logits.numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(joined["label_ids"], labels)
    np.testing.assert_array_equal(joined["inputs"], inputs.numpy())


def test_the_view_is_the_worker_as_an_evaluation_reads_it(tmp_path):
    args = AdLoCoConfig(  # the norm test's requests (NORM_TEST): the token count below assumes the batch of 8 kept
        output_dir=str(tmp_path),
        max_steps=4,
        inner_steps=2,
        use_cpu=True,
        report_to=[],
        save_strategy="no",
        **NORM_TEST,
    )
    trainer = AdLoCoTrainer(model=tiny_model(), args=args, train_dataset=sequence_dataset(16))
    view = EvaluationView.from_worker(trainer.worker)
    assert view.instances == [] and not view.final_merged and not view.sharded  # before training starts
    assert view.global_model is None and view.state.rounds == 0
    assert (view.worker_id, view.local_rank, view.num_workers) == (0, 0, 1)
    trainer.train()
    view = EvaluationView.from_worker(trainer.worker)
    assert [i.id for i in view.instances] == [0] and view.instance.workers == (0,) and view.final_merged
    assert view.global_model is trainer.worker.global_model and (view.state.rounds, view.state.tokens) == (
        2,
        4 * 8 * 32,
    )
    assert view.monitor is trainer.worker.monitor and view.run_log is trainer.worker.run_log
