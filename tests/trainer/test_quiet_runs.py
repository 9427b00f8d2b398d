"""Warnings every run printed, fixed at their cause (issue 55): the Trainer's PAD/BOS/EOS alignment (a preset built
with Llama's own special tokens, not the tokenizer's) and torch's pin_memory (asked for where there is nothing to pin
into); and `adloco-hf --version`."""

import logging
import subprocess
import sys
import warnings

import pytest
import torch
from helpers import REPO

from adloco_hf import AdLoCoConfig, AdLoCoTrainer
from adloco_hf.data import build_lm_datasets, load_builtin_corpus, train_tokenizer
from adloco_hf.presets import build_model


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU's case")
def test_a_run_of_the_readmes_kind_prints_neither_warning(tmp_path, records):
    texts = load_builtin_corpus().select(range(30))
    tokenizer = train_tokenizer(texts, vocab_size=300, save_dir=str(tmp_path / "tokenizer"))
    lm = build_lm_datasets(texts, tokenizer, block_size=32)
    model = build_model("tiny", tokenizer=tokenizer, seed=0)
    assert model.config.vocab_size == len(tokenizer) and model.config.eos_token_id == tokenizer.eos_token_id
    # As the README's example: no use_cpu (one process), a tokenizer given to the trainer.
    args = AdLoCoConfig(
        output_dir=str(tmp_path / "out"), max_steps=4, inner_steps=2, per_device_train_batch_size=2, report_to="none",
        save_strategy="no", disable_tqdm=True,
    )  # fmt: skip
    assert not args.dataloader_pin_memory  # nothing to pin into without an accelerator
    trainer = AdLoCoTrainer(model=model, args=args, train_dataset=lm["train"], processing_class=tokenizer)
    with warnings.catch_warnings(record=True) as caught, records.at_level(logging.WARNING):
        warnings.simplefilter("always")
        trainer.train()
    shown = [str(w.message) for w in caught] + [r.getMessage() for r in records.records]
    assert not [line for line in shown if "pin_memory" in line or "PAD/BOS/EOS" in line], shown


def test_adloco_hf_version_names_the_releases_without_importing_torch():
    code = (
        "import sys\nfrom adloco_hf.cli import main\ntry:\n    main(['--version'])\nexcept SystemExit as e:\n"
        "    assert e.code == 0\nassert 'torch' not in sys.modules and 'transformers' not in sys.modules, 'imported'\n"
    )
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    line = result.stdout.strip()
    assert line.startswith("adloco-hf 0.1.0 (transformers ") and ", accelerate " in line and ", torch " in line, line
