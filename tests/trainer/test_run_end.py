"""A run's end (issue 55): a finished run resumed again says so in one line and leaves its results files as they
were; the config's `resume_from_checkpoint` is read; a script's run ends with the recipes' summary in one line; an
empty evaluation set is refused; the card keeps the metrics before training when there is none after."""

import json
import logging
import os

import pytest
from helpers import sequence_dataset, tiny_model, tiny_run_config

from adloco_hf import AdLoCoTrainer
from adloco_hf.reporting.model_card import NOT_EVALUATED
from adloco_hf.trainer.run_end import RUN_END_FILE


RESULTS = ("all_results.json", "train_results.json", "trainer_state.json")


def config(tmp_path, **kwargs):
    return tiny_run_config(tmp_path, **({"max_steps": 12, "save_strategy": "steps", "save_steps": 6} | kwargs))


def train_as_the_recipes_do(trainer, **kwargs):
    result = trainer.train(**kwargs)
    trainer.save_metrics("train", result.metrics)
    trainer.save_state()
    return result


def results_files(out) -> dict[str, tuple[bytes, int]]:
    return {name: (open(out / name, "rb").read(), os.stat(out / name).st_mtime_ns) for name in RESULTS}


def test_a_finished_run_resumed_again_says_so_in_one_line_and_keeps_its_results(tmp_path, records):
    """It printed nothing and rewrote all_results.json and train_results.json with train_loss 0.0 and a runtime of a
    tenth of a second (docs/resuming.md's `--resume_from_checkpoint last` run twice)."""
    data, out = sequence_dataset(128), tmp_path / "out"
    first = train_as_the_recipes_do(AdLoCoTrainer(model=tiny_model(), args=config(tmp_path), train_dataset=data))
    assert os.path.isfile(out / "checkpoint-12" / "adloco" / RUN_END_FILE)
    assert not os.path.exists(out / "checkpoint-6" / "adloco" / RUN_END_FILE)  # only a finished run's last one
    before = results_files(out)
    merged = open(out / "merged" / "model.safetensors", "rb").read()

    records.clear()
    with records.at_level(logging.INFO, logger="adloco_hf"):
        again = AdLoCoTrainer(model=tiny_model(), args=config(tmp_path), train_dataset=data)
        result = train_as_the_recipes_do(again, resume_from_checkpoint=True)
    lines = [r.getMessage() for r in records.records if r.levelno >= logging.WARNING]
    assert len(lines) == 1 and "is the end of a run that finished at step 12 (max_steps=12)" in lines[0], lines
    assert result.global_step == 12 and result.training_loss == first.training_loss and result.training_loss > 0
    assert result.metrics == first.metrics
    assert results_files(out) == before  # not even rewritten with the same bytes
    assert open(out / "merged" / "model.safetensors", "rb").read() == merged


def test_the_configs_resume_from_checkpoint_is_read_and_a_run_with_steps_left_trains_on(tmp_path):
    """As a config field it was read by nothing: `train()` started afresh, silently."""
    data, out = sequence_dataset(128), tmp_path / "out"
    AdLoCoTrainer(model=tiny_model(), args=config(tmp_path), train_dataset=data).train()
    longer = config(tmp_path, max_steps=18, resume_from_checkpoint="last")
    trainer = AdLoCoTrainer(model=tiny_model(), args=longer, train_dataset=data)
    result = trainer.train()  # no argument: the config's field
    assert trainer.ended_run is None and result.global_step == 18
    rounds = [json.loads(line) for line in open(out / "adloco_rounds.jsonl")]
    assert [line["outer_step"] for line in rounds] == [1, 2, 3]  # rounds 1 and 2 kept, round 3 trained on
    assert os.path.isfile(out / "checkpoint-18" / "adloco" / RUN_END_FILE)


def test_a_scripts_run_ends_with_the_recipes_summary_in_one_line(tmp_path, capsys):
    """The recipes print a summary; a user's own script ended without one. With the default log level (warnings
    only) the line is printed as a round's line is."""
    trainer = AdLoCoTrainer(
        model=tiny_model(), args=config(tmp_path, disable_tqdm=True), train_dataset=sequence_dataset(128)
    )
    trainer.train()
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("AdLoCo run done:")]
    out = tmp_path / "out"
    assert len(lines) == 1 and "2 rounds (step 12), instances 1 -> 1" in lines[0], lines
    assert f"Merged model: {out / 'merged'}; the table: adloco-hf summary {out}" in lines[0]


def test_an_empty_evaluation_set_is_refused_when_evaluation_is_asked_for(tmp_path):
    """It gave evaluation lines without a loss and a card without an evaluation section, without a word."""
    data = sequence_dataset(64)
    args = config(tmp_path, eval_strategy="steps", eval_steps=6)
    with pytest.raises(
        ValueError, match=r"eval_dataset has no samples, but eval_strategy='steps'.*eval_strategy='no'"
    ):
        AdLoCoTrainer(model=tiny_model(), args=args, train_dataset=data, eval_dataset=data.select([]))
    with pytest.raises(ValueError, match=r"eval_dataset\['held_out'\] has no samples"):
        AdLoCoTrainer(
            model=tiny_model(), args=args, train_dataset=data, eval_dataset={"ok": data, "held_out": data.select([])}
        )
    AdLoCoTrainer(model=tiny_model(), args=config(tmp_path), train_dataset=data, eval_dataset=data.select([]))


def test_the_merged_card_keeps_the_metrics_before_training_without_an_evaluation(tmp_path):
    """`card_details.metrics_before` was dropped from the card, without a word, when the run did not evaluate."""
    trainer = AdLoCoTrainer(model=tiny_model(), args=config(tmp_path), train_dataset=sequence_dataset(128))
    trainer.card_details.metrics_before = {"perplexity": 41.5, "loss": 3.726}
    trainer.train()
    card = open(tmp_path / "out" / "merged" / "README.md").read()
    assert "| metric | before training | after |" in card and "| perplexity | 41.5 | - |" in card, card
    assert NOT_EVALUATED in card
    trainer.record_merged_metrics({"eval_merged_perplexity": 30.25, "eval_merged_loss": 3.41})
    card = open(tmp_path / "out" / "merged" / "README.md").read()
    assert "| perplexity | 41.5 | 30.25 |" in card and NOT_EVALUATED not in card
