"""Model cards: the Hub's metadata (with the final evaluation as `model-index`), readable values, a snippet that
loads the folder where it lives, the run's own plot, the data and the starting model named only as far as known, and
the batch that ran."""

import ast
import math
import os
import re

import pytest
from fake_hub import FakeHubApi
from helpers import PAPER_ROUNDS, REPO, round_rules, sequence_dataset, tiny_model
from huggingface_hub import ModelCard
from test_hub import word_tokenizer

import adloco_hf.reporting.hub as hub
from adloco_hf import AdLoCoConfig, AdLoCoTrainer
from adloco_hf.batch.size_tests import GradientStatistics
from adloco_hf.instances.table import Instance
from adloco_hf.reporting.card_details import batch_used, hub_model_id, last_round_batches
from adloco_hf.reporting.model_card import ModelKind, card_metrics, format_value, model_card
from adloco_hf.reporting.plotting import PLOT_FILE, plot_run
from adloco_hf.reporting.run_log import RunLog, load_rounds
from adloco_hf.rounds.decision import decide_round
from adloco_hf.rounds.rows import WorkerReport


SETTINGS = {"inner_steps": 200, "outer_lr": 0.7, "save_steps": 1000.0, "max_batch_size": 32, "batch_size_cap": None}
SUMMARY = {
    "tokens": 38008.0,
    "per-worker batch in the last round": {1: "8", 3: "20 (3 micro-batches of at most 7)"},
    "bytes communicated": 7_769_856,
}


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
    assert (
        "| per-worker batch in the last round | instance 1: 8, instance 3: 20 (3 micro-batches of at most 7) |" in card
    )
    assert "{1: " not in card
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
    card = model_card(title="t", settings=SETTINGS, model_id="me/m", metrics=metrics, dataset="Salesforce/wikitext")
    data = ModelCard(card).data
    assert {(r.metric_type, r.metric_value) for r in data.eval_results} == {("loss", 2.5), ("perplexity", 12.182)}
    assert {(r.task_type, r.dataset_type) for r in data.eval_results} == {("text-generation", "Salesforce/wikitext")}
    assert data.datasets == ["Salesforce/wikitext"]
    assert "model-index:" in card and "| perplexity | 12.182 |" in card


def test_data_that_is_no_hub_dataset_is_named_in_the_text_only(tmp_path):
    """Local files (which `datasets` names "json"), a corpus, or nothing given: no `datasets` metadata and no
    `model-index` (a result needs a Hub dataset); the evaluation is still a table, and no made-up name appears."""
    notes = tmp_path / "notes.jsonl"
    notes.write_text('{"text": "a"}\n')
    metrics = {"loss": 2.5, "perplexity": 12.182}
    for dataset in (str(notes), "builtin:python-docs", None):
        card = model_card(title="t", settings=SETTINGS, model_id="me/m", metrics=metrics, dataset=dataset)
        data = ModelCard(card).data
        assert data.datasets is None and data.eval_results is None and "model-index" not in card, dataset
        assert "## Evaluation\n" in card and "| perplexity | 12.182 |" in card
        assert not re.search(r"evaluation set|generator|\bjson\b(?!l)", card), card
        assert (f"Trained on `{dataset}`." in card) if dataset else "Trained on" not in card


def test_the_starting_models_evaluation_is_shown_beside_the_final_one():
    card = model_card(
        title="t", settings=SETTINGS, model_id="out/merged", metrics={"perplexity": 30.5, "loss": 3.4179},
        metrics_before={"perplexity": 80.25, "loss": 4.385},
    )  # fmt: skip
    assert "| metric | before training | after |" in card
    assert "| perplexity | 80.25 | 30.5 |" in card and "| loss | 4.385 | 3.4179 |" in card


def test_a_local_base_model_stays_out_of_the_metadata_and_of_a_pushed_card(tmp_path):
    """PEFT records where its base was loaded from: a local folder is no `base_model`. A card on disk loads it from
    there; a card for the Hub asks for the base by name. A folder of the Hub's cache gives its repo id."""
    base = tmp_path / "base"
    base.mkdir()
    kind = ModelKind(adapter=True, base_path=str(base))
    local = model_card(title="t", settings=SETTINGS, model_id=str(tmp_path / "run" / "merged"), kind=kind)
    pushed = model_card(title="t", settings=SETTINGS, model_id="me/lora", kind=kind)
    for card in (local, pushed):
        data = ModelCard(card).data
        assert data.base_model is None and not any("base_model" in tag for tag in data.tags), data.tags
    assert f'from_pretrained("{base}")' in snippet_of(local) and f"(`{base}`)" in local
    assert str(tmp_path) not in pushed and 'from_pretrained("BASE_MODEL")' in snippet_of(pushed)
    assert "AutoPeftModel" not in pushed  # adapter_config.json names the local folder: no one-call form

    assert hub_model_id("org/base") == ("org/base", None)
    assert hub_model_id(str(base)) == (None, str(base))
    cached = tmp_path / "hub" / "models--org--base-1.5" / "snapshots" / "0123abcd"
    cached.mkdir(parents=True)
    assert hub_model_id(str(cached)) == ("org/base-1.5", str(cached))
    kind = ModelKind(adapter=True, base_model="org/base-1.5", base_path=str(cached))
    data = ModelCard(model_card(title="t", settings=SETTINGS, model_id="me/lora", kind=kind)).data
    assert data.base_model == "org/base-1.5" and "base_model:adapter:org/base-1.5" in data.tags


def worker_report(instance: int) -> WorkerReport:
    statistics = GradientStatistics(64.0, math.nan, math.nan, 1.0, 0.25, 4.0)
    return WorkerReport(
        instance=instance, stats=statistics, loss_sum=10.0, loss_steps=5, samples=20, tokens=100.0,
        pseudo_grad_norm=0.5, payload_bytes=1000, comm_seconds=0.01, outer_seconds=0.02, skipped=False,
    )  # fmt: skip


def test_the_card_reports_the_batch_that_ran_not_the_next_request(tmp_path):
    """A round's lines as the worker writes them (switch mode, max_batch_size 8): request 12 ran capped at 8, request
    20 as 3 accumulated micro-batches of at most 7; the next requests, which no step ran, are not reported."""
    rules = round_rules(**PAPER_ROUNDS, max_batch_size=8, eta=0.5, merge_every=0, per_device_train_batch_size=1)
    table = [Instance(0, (0,), 12), Instance(1, (1, 2), 20)]
    decision = decide_round(table, [worker_report(0), worker_report(1), worker_report(1)], outer_step=1,
                            global_step=10, rules=rules)  # fmt: skip
    lines = [decision.lines[i] for i in sorted(decision.lines)]
    assert lines[0].next_batch_size > 12 and [line.batch_size_used for line in lines] == [8, 20]
    log = RunLog(str(tmp_path))
    log.start(resumed_outer_step=None, resumed_global_step=None)
    log.write_rounds([line.to_json() for line in lines])
    batches = last_round_batches(load_rounds(tmp_path))
    assert batches == {0: "8", 1: "20 (3 micro-batches of at most 7)"}


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
    """The first run into a folder: its card shows the plot drawn at the end of training, from its own rounds."""
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
    trainer.card_details.dataset = "org/arithmetic-sequences"  # a Hub dataset: the card's model-index names it
    trainer.train()
    final = [entry for entry in trainer.state.log_history if "eval_merged_perplexity" in entry][-1]
    card = (out / "merged" / "README.md").read_text()
    results = {r.metric_type: r.metric_value for r in ModelCard(card).data.eval_results}
    assert results["perplexity"] == pytest.approx(final["eval_merged_perplexity"])
    assert results["loss"] == pytest.approx(final["eval_merged_loss"])
    assert ModelCard(card).data.datasets == ["org/arithmetic-sequences"]
    assert f"| `max_batch_size` | `{trainer.worker.max_batch_size}` |" in card and "`auto`" not in card
    assert not re.search(r"\| \d+\.0 \|", card)  # counts are integers
    assert f"]({PLOT_FILE})" in card and (out / "merged" / PLOT_FILE).read_bytes() == (out / PLOT_FILE).read_bytes()
    last = load_rounds(out)[-1]  # the batch that ran (switch mode), not the next request
    assert f"| per-worker batch in the last round | instance 0: {batch_used(last)} |" in card
    # The snippet loads the folder as it stands on disk.
    scope: dict = {}
    exec(snippet_of(card), scope)
    assert type(scope["model"]).__name__ == "LlamaForCausalLM" and scope["tokenizer"] is not None

    # Pushed: the card loads from the repo, shows the plot, and the plot goes along.
    trainer.push_merged_to_hub("me/adloco-tiny")
    files = [c for c in fake_hub.calls if c[0] == "upload_folder"][-1][3]
    uploaded = files["README.md"].decode()
    assert PLOT_FILE in files and f"]({PLOT_FILE})" in uploaded
    assert 'AutoModelForCausalLM.from_pretrained("me/adloco-tiny")' in uploaded and str(out) not in uploaded
    assert {r.metric_type for r in ModelCard(uploaded).data.eval_results} == {"loss", "perplexity"}
    assert os.path.isfile(out / "merged" / PLOT_FILE)


def short_run(out, **overrides) -> AdLoCoTrainer:
    settings = dict(
        output_dir=str(out), max_steps=10, inner_steps=5, per_device_train_batch_size=2, max_batch_size=4,
        use_cpu=True, report_to=[], disable_tqdm=True, seed=3,
    )  # fmt: skip
    args = AdLoCoConfig(**settings | overrides)
    return AdLoCoTrainer(model=tiny_model(), args=args, train_dataset=sequence_dataset(64))


def test_a_run_into_an_earlier_runs_folder_is_warned_and_its_card_shows_its_own_plot(tmp_path, records):
    out = tmp_path / "run"
    short_run(out, max_steps=20, save_steps=10, learning_rate=1e-2).train()  # checkpoint-10, checkpoint-20
    (out / "merges" / "outer-3").mkdir(parents=True)  # as a merge of a run with several instances leaves it
    first_plot = (out / "merged" / PLOT_FILE).read_bytes()
    assert not [r for r in records.records if "another run's" in r.getMessage()]

    # Another run into the same folder (fewer steps, no checkpoints): warned once, before training...
    records.clear()
    short_run(out, save_strategy="no", learning_rate=3e-3).train()
    warnings = [r.getMessage() for r in records.records if "another run's" in r.getMessage()]
    assert len(warnings) == 1 and records.records[0].getMessage() == warnings[0], warnings
    assert (
        "checkpoint-10, checkpoint-20, merges/outer-3" in warnings[0] and "resume_from_checkpoint=True" in warnings[0]
    )
    # ...and its card shows its own plot: the one its rounds file draws, not the earlier run's.
    assert len(load_rounds(out)) == 2
    mine = (out / "merged" / PLOT_FILE).read_bytes()
    assert mine != first_plot and mine == open(plot_run(out, tmp_path / "this-run.png"), "rb").read()
    assert f"]({PLOT_FILE})" in (out / "merged" / "README.md").read_text()

    # Resuming from a checkpoint of the folder continues the run that wrote it: no warning.
    records.clear()
    short_run(out, max_steps=20, save_steps=10, learning_rate=1e-2).train(resume_from_checkpoint=True)
    assert not [r for r in records.records if "another run's" in r.getMessage()]


def test_plot_run_false_draws_no_plot_and_the_card_shows_none(tmp_path):
    out = tmp_path / "run"
    short_run(out, save_strategy="no", plot_run=False).train()
    assert (out / "merged" / "README.md").is_file()
    assert not (out / PLOT_FILE).exists() and not (out / "merged" / PLOT_FILE).exists()
    assert f"]({PLOT_FILE})" not in (out / "merged" / "README.md").read_text()


def test_setup_py_names_the_repository_the_cards_link_to():
    tree = ast.parse(open(os.path.join(REPO, "setup.py"), encoding="utf-8").read())
    call = next(
        node for node in ast.walk(tree) if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "setup"
    )
    keywords = {k.arg: ast.literal_eval(k.value) for k in call.keywords if k.arg in ("url", "project_urls")}
    url = keywords["url"]
    assert url.startswith("https://github.com/") and f"]({url})" in model_card(title="t", settings=SETTINGS)
    assert keywords["project_urls"]["Source"] == url
