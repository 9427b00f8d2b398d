"""A dataset whose model input is in a column of another name fails before training, naming the column and the fix
(it used to fail at step 0 inside the model, after the run's files were created)."""

import glob
import os

import pytest
from helpers import sequence_dataset, tiny_model
from transformers import default_data_collator

from adloco_hf import AdLoCoConfig, AdLoCoTrainer


def config(tmp_path, **kwargs):
    base = dict(
        output_dir=str(tmp_path / "out"), max_steps=4, inner_steps=2, per_device_train_batch_size=2,
        max_batch_size=4, use_cpu=True, report_to=[], save_strategy="no", disable_tqdm=True,
    )  # fmt: skip
    return AdLoCoConfig(**(base | kwargs))


def run_files(tmp_path) -> list[str]:
    return sorted(glob.glob(str(tmp_path / "out" / "**" / "*.jsonl"), recursive=True))


def test_a_renamed_input_column_fails_before_training_naming_the_column_and_the_fix(tmp_path):
    data = sequence_dataset(64).rename_column("input_ids", "tokens")
    trainer = AdLoCoTrainer(model=tiny_model(), args=config(tmp_path), train_dataset=data)
    with pytest.raises(ValueError) as error:
        trainer.train()
    message = str(error.value)
    assert "first training batch has no 'input_ids'" in message, message
    assert "has the columns ['tokens', 'labels']" in message and "dropped ['tokens']" in message
    assert "LlamaForCausalLM.forward takes input_ids, attention_mask" in message  # the ones the model takes
    assert "rename_column('tokens', 'input_ids')" in message  # the fixes
    assert "remove_unused_columns=False" in message and "data_collator" in message
    assert run_files(tmp_path) == []  # before the rounds file (or any other) was created
    assert trainer.state.global_step == 0


def test_the_same_data_trains_with_the_fix_the_message_gives(tmp_path):
    """remove_unused_columns=False and a collator that builds input_ids: no false alarm, the run trains."""
    data = sequence_dataset(64).rename_column("input_ids", "tokens")

    def collate(samples):
        return default_data_collator([{"input_ids": s["tokens"], "labels": s["labels"]} for s in samples])

    args = config(tmp_path, remove_unused_columns=False)
    trainer = AdLoCoTrainer(model=tiny_model(), args=args, train_dataset=data, data_collator=collate)
    trainer.train()
    assert trainer.state.global_step == 4
    assert os.path.isfile(tmp_path / "out" / "adloco_rounds.jsonl")


def test_an_evaluation_set_without_the_input_fails_before_training(tmp_path):
    """Evaluation would otherwise fail rounds into the run, at the first eval step."""
    train, evaluation = sequence_dataset(64), sequence_dataset(16, seed=2).rename_column("input_ids", "ids")
    args = config(tmp_path, eval_strategy="steps", eval_steps=2)
    trainer = AdLoCoTrainer(model=tiny_model(), args=args, train_dataset=train, eval_dataset={"held_out": evaluation})
    with pytest.raises(
        ValueError, match=r"first evaluation \('held_out'\) batch has no 'input_ids'.*rename_column\('ids'"
    ):
        trainer.train()
    assert run_files(tmp_path) == []
