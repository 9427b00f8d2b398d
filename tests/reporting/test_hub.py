"""Pushing the merged model (a fake HfApi records the calls: no machine here reaches the Hub)."""

import json
import logging
import os

import pytest
from fake_hub import FakeHubApi
from helpers import SCRIPTS, hub_http, launch, sequence_dataset, tiny_model
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast

import adloco_hf.reporting.hub as hub
from adloco_hf import AdLoCoConfig, AdLoCoTrainer


@pytest.fixture
def fake_hub(monkeypatch):
    api = FakeHubApi()
    monkeypatch.setattr(hub, "get_hub_api", lambda token=None: api)
    monkeypatch.setattr(hub, "PUSH_RETRY_SECONDS", 0.001)
    return api


def word_tokenizer():
    vocab = {f"w{i}": i for i in range(63)} | {"<eos>": 63}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<eos>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>", pad_token="<eos>")


def test_push_to_hub_uploads_the_merged_folder_with_weights_tokenizer_and_card(tmp_path, fake_hub):
    args = AdLoCoConfig(
        output_dir=str(tmp_path / "run"), max_steps=10, inner_steps=5, per_device_train_batch_size=2,
        max_batch_size=4, use_cpu=True, report_to=[], save_strategy="no", push_to_hub=True,
        hub_model_id="me/adloco-tiny", hub_private_repo=True, disable_tqdm=True,
    )  # fmt: skip
    trainer = AdLoCoTrainer(
        model=tiny_model(), args=args, train_dataset=sequence_dataset(64), processing_class=word_tokenizer()
    )
    assert fake_hub.calls[0] == ("create_repo", "me/adloco-tiny", True)  # at init, through our client
    trainer.train()
    uploads = [c for c in fake_hub.calls if c[0] == "upload_folder"]
    assert len(uploads) == 1
    _, repo_id, path_in_repo, files = uploads[0]
    assert (repo_id, path_in_repo) == ("me/adloco-tiny", None)
    assert {"model.safetensors", "config.json", "README.md", "tokenizer.json"} <= set(files)
    card = files["README.md"].decode()
    assert "adloco" in card and "| `inner_steps` | `5` |" in card and "| `num_instances` | `1` |" in card
    # What was uploaded is what is on disk, and it loads.
    with open(tmp_path / "run" / "merged" / "model.safetensors", "rb") as f:
        assert f.read() == files["model.safetensors"]
    assert AutoModelForCausalLM.from_pretrained(tmp_path / "run" / "merged") is not None


def test_push_merged_to_hub_explicitly(tmp_path, fake_hub):
    args = AdLoCoConfig(
        output_dir=str(tmp_path / "run"), max_steps=5, inner_steps=5, use_cpu=True, report_to=[],
        save_strategy="no", per_device_train_batch_size=2, max_batch_size=4, disable_tqdm=True,
    )  # fmt: skip
    trainer = AdLoCoTrainer(model=tiny_model(), args=args, train_dataset=sequence_dataset(64))
    trainer.train()
    assert fake_hub.calls == []  # push_to_hub=False: nothing uploaded during training
    assert trainer.push_merged_to_hub("team/other", private=False) == "commit-sha"
    assert fake_hub.calls[0] == ("create_repo", "team/other", False)
    assert fake_hub.calls[1][1:3] == ("team/other", None)
    assert "model.safetensors" in fake_hub.calls[1][3]


def train_without_push(tmp_path, **overrides):
    args = AdLoCoConfig(
        output_dir=str(tmp_path / "run"), max_steps=5, inner_steps=5, use_cpu=True, report_to=[],
        save_strategy="no", per_device_train_batch_size=2, max_batch_size=4, disable_tqdm=True, **overrides,
    )  # fmt: skip
    trainer = AdLoCoTrainer(model=tiny_model(), args=args, train_dataset=sequence_dataset(64))
    trainer.train()
    return trainer


def test_explicit_push_to_an_unreachable_hub_raises_one_error_naming_the_folder(tmp_path, fake_hub):
    trainer = train_without_push(tmp_path)
    fake_hub.fail_uploads = 99
    folder = os.path.join(str(tmp_path / "run"), "merged")
    with pytest.raises(hub.HubUploadError) as raised:
        trainer.push_merged_to_hub("me/adloco-tiny")
    error = raised.value
    assert (error.folder, error.repo_id) == (folder, "me/adloco-tiny")
    assert folder in str(error) and "me/adloco-tiny" in str(error) and "ConnectError" in str(error)
    assert isinstance(error.__cause__, hub_http.ConnectError)  # the original, chained
    uploads = [c for c in fake_hub.calls if c[0] == "upload_folder"]
    assert len(uploads) == hub.PUSH_ATTEMPTS  # tried a bounded number of times
    assert AutoModelForCausalLM.from_pretrained(folder) is not None  # the model is where the error says

    # No network at all: creating the repo fails the same way, with one error.
    fake_hub.fail_repos = 99
    with pytest.raises(hub.HubUploadError, match="me/adloco-tiny") as raised:
        trainer.push_merged_to_hub("me/adloco-tiny")
    assert raised.value.folder == folder and isinstance(raised.value.__cause__, hub_http.ConnectError)


def test_a_push_that_fails_once_is_retried_and_succeeds(tmp_path, fake_hub):
    trainer = train_without_push(tmp_path)
    fake_hub.fail_uploads, fake_hub.error = 1, OSError("connection reset by peer")
    assert trainer.push_merged_to_hub("me/adloco-tiny") == "commit-sha"
    uploads = [c for c in fake_hub.calls if c[0] == "upload_folder"]
    assert len(uploads) == 2 and uploads[0][3] == uploads[1][3]


def test_a_refusal_is_not_retried(tmp_path, fake_hub):
    trainer = train_without_push(tmp_path)
    refused = hub_http.HTTPStatusError(
        "401 Unauthorized", request=hub_http.Request("POST", "https://hub"), response=hub_http.Response(401)
    )
    fake_hub.fail_uploads, fake_hub.error = 99, refused
    with pytest.raises(hub.HubUploadError, match="after 1 try"):
        trainer.push_merged_to_hub("me/adloco-tiny")
    assert len([c for c in fake_hub.calls if c[0] == "upload_folder"]) == 1


def test_end_of_training_push_failure_is_raised_after_training_finished(tmp_path, fake_hub, caplog):
    fake_hub.fail_repos = fake_hub.fail_uploads = 99  # offline from the start: the repo cannot be created either
    args = AdLoCoConfig(
        output_dir=str(tmp_path / "run"), max_steps=10, inner_steps=5, per_device_train_batch_size=2,
        max_batch_size=4, use_cpu=True, report_to=[], save_strategy="no", push_to_hub=True,
        hub_model_id="me/adloco-tiny", disable_tqdm=True,
    )  # fmt: skip
    with caplog.at_level(logging.WARNING, logger="adloco_hf.reporting.hub"):
        trainer = AdLoCoTrainer(model=tiny_model(), args=args, train_dataset=sequence_dataset(64))
        with pytest.raises(hub.HubUploadError) as raised:
            trainer.train()
    assert "could not create the Hub repo me/adloco-tiny" in caplog.text  # at init: a warning, training starts
    assert trainer.state.global_step == 10 and not trainer.is_in_train  # the Trainer finished its own end
    assert raised.value.folder.endswith(os.path.join("run", "merged")) and raised.value.train_output.global_step == 10
    assert AutoModelForCausalLM.from_pretrained(raised.value.folder) is not None


@pytest.mark.multiprocess
def test_failed_merge_uploads_during_training_warn_and_training_goes_on(tmp_path):
    """Two workers, two instances merged at round 1, and a Hub that is never reached."""
    out, probe = tmp_path / "out", tmp_path / "probe"
    spec = {"output_dir": str(out), "probe_dir": str(probe)}
    launch(os.path.join(SCRIPTS, "hub_worker.py"), json.dumps(spec), num_processes=2)
    reports = [json.load(open(probe / f"report-rank{rank}.json")) for rank in range(2)]
    for report in reports:
        assert report["global_step"] == 20  # the whole run, despite every upload failing
        assert report["error"]["type"] == "HubUploadError"  # raised once by train(), on every rank
    assert reports[0]["error"]["folder"] == str(out / "merged")
    assert os.path.isdir(out / "merges" / "outer-1") and os.path.isdir(out / "merged")
    warnings = reports[0]["warnings"]
    assert any("merges/outer-1" in w and str(out / "merges" / "outer-1") in w for w in warnings)
    assert reports[1]["uploads"] == 0  # only global rank 0 talks to the Hub
    assert reports[0]["uploads"] == 2 * 3  # the merge and the merged model, 3 tries each
    # The merge's card loads it from where it was meant to go in the repo, and says what it is.
    card = (out / "merges" / "outer-1" / "README.md").read_text()
    assert 'from_pretrained("me/adloco-tiny", subfolder="merges/outer-1")' in card and "adloco_merge.json" in card
