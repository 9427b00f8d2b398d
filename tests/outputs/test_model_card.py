"""Model cards: the Hub's metadata (with the final evaluation as `model-index`), readable values, a snippet that
loads the folder where it lives, the run's plot."""

import os
import re

import pytest
from helpers import sequence_dataset, tiny_model
from huggingface_hub import ModelCard
from test_hub import FakeHubApi, word_tokenizer

import adloco_hf.outputs.hub as hub
from adloco_hf import AdLoCoConfig, AdLoCoTrainer
from adloco_hf.outputs.model_card import ModelKind, card_metrics, format_value, model_card
from adloco_hf.outputs.plotting import PLOT_FILE, plot_run


SETTINGS = {"inner_steps": 200, "outer_lr": 0.7, "save_steps": 1000.0, "max_batch_size": 32, "batch_size_cap": None}
SUMMARY = {"tokens": 38008.0, "final per-worker batch sizes": {1: 8, 3: 6}, "bytes communicated": 7_769_856}


@pytest.fixture
def fake_hub(monkeypatch):
    api = FakeHubApi()
    monkeypatch.setattr(hub, "get_hub_api", lambda token=None: api)
    return api


def snippet_of(card: str) -> str:
    return re.search(r"```python\n(.*?)```", card, re.S).group(1)


def test_values_are_written_for_people():
    assert format_value(38008.0) == "38008" and format_value(0.7) == "0.7" and format_value(2e-5) == "2e-05"
    assert format_value({1: 8, 3: 6}) == "instance 1: 8, instance 3: 6"
    assert format_value(None) == "-" and format_value(True) == "True" and format_value("auto") == "auto"


def test_card_has_readable_tables_and_a_snippet_for_the_repo():
    card = model_card(title="t", settings=SETTINGS, summary=SUMMARY, model_id="me/adloco-model", tokenizer=True)
    assert "| tokens | 38008 |" in card and "38008.0" not in card
    assert "| final per-worker batch sizes | instance 1: 8, instance 3: 6 |" in card and "{1: 8" not in card
    assert "| bytes communicated | 7.4 MiB (7769856 B) |" in card
    assert "| `save_steps` | `1000` |" in card and "| `max_batch_size` | `32` |" in card
    assert "path/or/repo" not in card
    snippet = snippet_of(card)
    assert 'AutoModelForCausalLM.from_pretrained("me/adloco-model")' in snippet
    assert 'AutoTokenizer.from_pretrained("me/adloco-model")' in snippet
    data = ModelCard(card).data
    assert data.library_name == "transformers" and data.pipeline_tag == "text-generation" and "adloco" in data.tags


def test_card_carries_the_evaluation_as_model_index_and_a_table():
    metrics = card_metrics(
        {"eval_merged_loss": 2.5, "eval_merged_perplexity": 12.182, "eval_merged_runtime": 1.3,
         "eval_merged_samples_per_second": 90.0, "eval_merged_instance_0_loss": 2.6, "eval_merged_accuracy": float("nan")}
    )  # fmt: skip
    assert metrics == {"loss": 2.5, "perplexity": 12.182}
    card = model_card(title="t", settings=SETTINGS, model_id="me/m", metrics=metrics, eval_dataset="wikitext")
    results = ModelCard(card).data.eval_results
    assert {(r.metric_type, r.metric_value) for r in results} == {("loss", 2.5), ("perplexity", 12.182)}
    assert {(r.task_type, r.dataset_name) for r in results} == {("text-generation", "wikitext")}
    assert "model-index:" in card and "| perplexity | 12.182 |" in card


def test_card_of_a_subfolder_a_plot_and_an_adapter():
    card = model_card(title="t", settings=SETTINGS, model_id="me/m", subfolder="merges/outer-3", plot=PLOT_FILE)
    assert 'from_pretrained("me/m", subfolder="merges/outer-3")' in card
    assert f"]({PLOT_FILE})" in card
    kind = ModelKind(adapter=True, base_model="org/base")
    card = model_card(title="t", settings=SETTINGS, model_id="out/merged", kind=kind)
    data = ModelCard(card).data
    assert (data.library_name, data.base_model) == ("peft", "org/base")
    assert "base_model:adapter:org/base" in data.tags
    snippet = snippet_of(card)
    assert 'PeftModel.from_pretrained(base, "out/merged")' in snippet and 'from_pretrained("org/base")' in snippet
    assert 'AutoPeftModelForCausalLM.from_pretrained("out/merged")' in snippet


def test_merged_card_after_a_run_has_the_final_eval_the_resolved_settings_and_the_plot(tmp_path, fake_hub):
    out = tmp_path / "run"
    args = AdLoCoConfig(
        output_dir=str(out), max_steps=10, inner_steps=5, per_device_train_batch_size=2, use_cpu=True,
        report_to=[], save_strategy="no", eval_strategy="steps", disable_tqdm=True, per_device_eval_batch_size=8,
    )  # fmt: skip
    assert args.max_batch_size == "auto"
    trainer = AdLoCoTrainer(
        model=tiny_model(), args=args, train_dataset=sequence_dataset(64),
        eval_dataset=sequence_dataset(16, seed=2), processing_class=word_tokenizer(),
    )  # fmt: skip
    trainer.train()
    final = [entry for entry in trainer.state.log_history if "eval_merged_perplexity" in entry][-1]
    card = (out / "merged" / "README.md").read_text()
    results = {r.metric_type: r.metric_value for r in ModelCard(card).data.eval_results}
    assert results["perplexity"] == pytest.approx(final["eval_merged_perplexity"])
    assert results["loss"] == pytest.approx(final["eval_merged_loss"])
    assert f"| `max_batch_size` | `{trainer.worker.max_batch_size}` |" in card and "`auto`" not in card
    assert not re.search(r"\| \d+\.0 \|", card)  # counts are integers
    # The snippet loads the folder as it stands on disk.
    scope: dict = {}
    exec(snippet_of(card), scope)
    assert type(scope["model"]).__name__ == "LlamaForCausalLM" and scope["tokenizer"] is not None

    # Plotted after training and pushed: the card loads from the repo, shows the plot, and the plot goes along.
    plot_run(out)
    trainer.push_merged_to_hub("me/adloco-tiny")
    files = [c for c in fake_hub.calls if c[0] == "upload_folder"][-1][3]
    uploaded = files["README.md"].decode()
    assert PLOT_FILE in files and f"]({PLOT_FILE})" in uploaded
    assert 'AutoModelForCausalLM.from_pretrained("me/adloco-tiny")' in uploaded and str(out) not in uploaded
    assert {r.metric_type for r in ModelCard(uploaded).data.eval_results} == {"loss", "perplexity"}
    assert os.path.isfile(out / "merged" / PLOT_FILE)
