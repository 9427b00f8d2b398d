"""Pushing the merged model (a fake HfApi records the calls: no machine here reaches the Hub)."""

import os

import pytest
from helpers import sequence_dataset, tiny_model
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast

import adloco_hf.hub as hub
from adloco_hf import AdLoCoConfig, AdLoCoTrainer


class FakeHubApi:
    def __init__(self):
        self.calls = []

    def create_repo(self, repo_id, private=None, exist_ok=False, **kwargs):
        self.calls.append(("create_repo", repo_id, private))
        return type("RepoUrl", (), {"repo_id": repo_id})()

    def upload_folder(self, *, repo_id, folder_path, path_in_repo=None, commit_message=None, revision=None):
        files = {name: open(os.path.join(folder_path, name), "rb").read() for name in sorted(os.listdir(folder_path))}
        self.calls.append(("upload_folder", repo_id, path_in_repo, files))
        return "commit-sha"


@pytest.fixture
def fake_hub(monkeypatch):
    api = FakeHubApi()
    monkeypatch.setattr(hub, "get_hub_api", lambda token=None: api)
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
