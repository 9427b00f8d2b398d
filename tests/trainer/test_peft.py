"""LoRA through PEFT: only the adapter travels, `merged/` is an adapter folder with a PEFT card that loads, and
`save_merged_full=True` adds `merged-full/`, the fused model that loads with `AutoModelForCausalLM` alone."""

import os
import re

import pytest
import torch
from fake_hub import FakeHubApi
from helpers import sequence_dataset, tiny_model
from transformers import AutoModelForCausalLM

import adloco_hf.reporting.hub as hub
from adloco_hf import AdLoCoConfig, AdLoCoTrainer


peft = pytest.importorskip("peft")


def lora_model(base_dir: str):
    """A tiny Llama saved to `base_dir` and loaded back (so PEFT records where its base lives), with LoRA on q/v."""
    tiny_model().save_pretrained(base_dir)
    base = AutoModelForCausalLM.from_pretrained(base_dir)
    config = peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")
    return peft.get_peft_model(base, config)


def train_lora(tmp_path, **overrides):
    model = lora_model(str(tmp_path / "base"))
    args = AdLoCoConfig(
        output_dir=str(tmp_path / "run"), max_steps=10, inner_steps=5, per_device_train_batch_size=2,
        max_batch_size=4, use_cpu=True, report_to=[], save_strategy="no", disable_tqdm=True, learning_rate=1e-2,
        **overrides,
    )  # fmt: skip
    trainer = AdLoCoTrainer(model=model, args=args, train_dataset=sequence_dataset(64))
    trainer.train()
    return trainer


def snippet_of(card: str) -> str:
    return re.search(r"```python\n(.*?)```", card, re.S).group(1)


def test_lora_merged_folder_is_an_adapter_with_a_peft_card_whose_snippet_loads(tmp_path, monkeypatch):
    trainer = train_lora(tmp_path, save_merged_full=True)
    merged = tmp_path / "run" / "merged"
    files = set(os.listdir(merged))
    assert {"adapter_config.json", "adapter_model.safetensors", "README.md"} <= files
    assert "model.safetensors" not in files  # only the adapter's weights travel and are saved
    card = (merged / "README.md").read_text()
    assert "library_name: peft" in card and "library_name: transformers" not in card
    # The base was loaded from a local folder: no Hub repo to name in the metadata; the card on disk loads it from there.
    assert "base_model" not in card.split("---")[1] and f'from_pretrained("{tmp_path / "base"}")' in snippet_of(card)
    assert "PeftModel.from_pretrained(base, " in snippet_of(card) and "path/or/repo" not in card
    # The card's snippet runs as written and gives back the trained adapter.
    scope: dict = {}
    exec(snippet_of(card), scope)
    loaded = scope["model"]
    trained = trainer.accelerator.unwrap_model(trainer.model)
    ids = torch.arange(16).reshape(2, 8)
    with torch.no_grad():
        torch.testing.assert_close(loaded(input_ids=ids).logits, trained(input_ids=ids).logits, rtol=1e-5, atol=1e-5)
    # The one-call form the snippet offers in a comment (AutoPeftModel reads the base from adapter_config.json).
    one_call = re.search(r"# or in one call .*?: (peft\.\w+\.from_pretrained\(.*\))", card).group(1)
    with torch.no_grad():
        logits = eval(one_call, {"peft": peft})(input_ids=ids).logits
        torch.testing.assert_close(logits, trained(input_ids=ids).logits, rtol=1e-5, atol=1e-5)

    # Pushed: the adapter to the repo's root, the fused model to its merged-full/, each card loading from there.
    api = FakeHubApi()
    monkeypatch.setattr(hub, "get_hub_api", lambda token=None: api)
    trainer.push_merged_to_hub("me/lora")
    uploads = {c[2]: c[3] for c in api.calls if c[0] == "upload_folder"}
    assert set(uploads) == {None, "merged-full"}
    assert "adapter_model.safetensors" in uploads[None] and "model.safetensors" in uploads["merged-full"]
    assert 'PeftModel.from_pretrained(base, "me/lora")' in uploads[None]["README.md"].decode()
    assert not any(str(tmp_path) in files["README.md"].decode() for files in uploads.values())  # no local path
    assert 'from_pretrained("me/lora", subfolder="merged-full")' in uploads["merged-full"]["README.md"].decode()

    # merged-full/: the fused model, loadable without peft, equal to merge_and_unload of the trained model.
    full = tmp_path / "run" / "merged-full"
    assert "model.safetensors" in os.listdir(full) and "adapter_config.json" not in os.listdir(full)
    full_card = (full / "README.md").read_text()
    assert "library_name: transformers" in full_card and "AutoModelForCausalLM" in snippet_of(full_card)
    fused = AutoModelForCausalLM.from_pretrained(full)
    reference = trained.merge_and_unload().state_dict()  # the trainer is done with its model
    assert set(fused.state_dict()) == set(reference)
    for name, tensor in fused.state_dict().items():
        torch.testing.assert_close(tensor, reference[name], rtol=0, atol=1e-6, msg=name)


def test_lora_without_save_merged_full_writes_the_adapter_only(tmp_path):
    train_lora(tmp_path)
    assert os.path.isdir(tmp_path / "run" / "merged")
    assert not os.path.exists(tmp_path / "run" / "merged-full")
