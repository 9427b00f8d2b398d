"""The tokenised cache is keyed by content (issue 55): the same corpus and tokenizer reached through any spelling of a
path reuse one folder, a hit is one log line, and the fast tokenisation gives the Trainer's call's ids."""

import glob
import logging
import os

import datasets
import pytest

from adloco_hf import data
from adloco_hf.data import build_lm_datasets, load_builtin_corpus, load_or_train_tokenizer, train_tokenizer
from adloco_hf.data.python_source import SPLIT_COLUMN
from adloco_hf.data.tokenizer import document_token_ids, tokenizer_fingerprint


@pytest.fixture(autouse=True)
def _isolated_datasets_cache(tmp_path, monkeypatch):
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path / "hf_datasets"))


@pytest.fixture(scope="module")
def corpus() -> datasets.Dataset:
    return load_builtin_corpus().select(range(40))


def no_tokenisation(*args, **kwargs):
    raise AssertionError("tokenised again")


def test_the_same_corpus_through_three_spellings_of_a_path_is_one_folder(corpus, tmp_path, monkeypatch):
    """`cache`, `./cache` and the absolute path gave three tokenizer fingerprints (the tokenizer's `name_or_path` was
    in the key), so a benchmark re-tokenised what `make demo` had cached, into a second folder."""
    monkeypatch.chdir(tmp_path)
    spellings = ["cache", "./cache", str(tmp_path / "cache")]
    first = None
    for spelling in spellings:
        tokenizer = load_or_train_tokenizer(None, corpus, vocab_size=300, cache_dir=spelling)
        lm = build_lm_datasets(corpus, tokenizer, block_size=32, cache_dir=spelling)
        first = first or lm
        assert lm["train"]["input_ids"] == first["train"]["input_ids"]
        monkeypatch.setattr(data.packing, "_tokenize_and_pack", no_tokenisation)  # from the second spelling on
    assert len(glob.glob(str(tmp_path / "cache" / "lm-*"))) == 1
    assert len(glob.glob(str(tmp_path / "cache" / "tokenizer-*"))) == 1


def test_a_copied_tokenizer_keys_the_same_entry_and_a_different_one_does_not(corpus, tmp_path):
    tokenizer = train_tokenizer(corpus, vocab_size=300, save_dir=str(tmp_path / "a"))
    tokenizer.save_pretrained(tmp_path / "copy")
    copy = load_or_train_tokenizer(str(tmp_path / "copy"), corpus, vocab_size=300, cache_dir=str(tmp_path))
    assert copy.name_or_path != tokenizer.name_or_path
    assert tokenizer_fingerprint(copy) == tokenizer_fingerprint(tokenizer)
    tokenizer(["a text long enough"], truncation=True, max_length=2)  # a call that leaves truncation set
    assert tokenizer_fingerprint(tokenizer) == tokenizer_fingerprint(copy)
    other = train_tokenizer(corpus, vocab_size=301, save_dir=str(tmp_path / "b"))
    assert tokenizer_fingerprint(other) != tokenizer_fingerprint(tokenizer)


def test_a_cache_hit_is_one_log_line_and_a_corpus_with_its_own_split_ignores_the_split_settings(
    corpus, tmp_path, monkeypatch, records
):
    split = corpus.add_column(SPLIT_COLUMN, ["eval" if i % 8 == 0 else "train" for i in range(len(corpus))])
    tokenizer = train_tokenizer(corpus, vocab_size=300, save_dir=str(tmp_path / "tokenizer"))
    cache = str(tmp_path / "cache")
    build_lm_datasets(split, tokenizer, block_size=32, cache_dir=cache)
    monkeypatch.setattr(data.packing, "_tokenize_and_pack", no_tokenisation)
    with records.at_level(logging.INFO, logger="adloco_hf"):
        records.clear()
        tokenizer = train_tokenizer(corpus, vocab_size=300, save_dir=str(tmp_path / "tokenizer"))  # a hit too
        # eval_fraction and seed are not read for a corpus that carries its split: the same blocks, the same folder
        build_lm_datasets(split, tokenizer, block_size=32, cache_dir=cache, eval_fraction=0.3, seed=7)
    lines = [r.getMessage() for r in records.records if r.name.startswith("adloco_hf.data")]
    assert len(lines) == 1 and lines[0].startswith("tokenised data: reusing "), lines
    assert len(glob.glob(os.path.join(cache, "lm-*"))) == 1


def test_the_fast_tokenisation_gives_the_tokenizers_own_ids(corpus, tmp_path):
    tokenizer = train_tokenizer(corpus, vocab_size=300, save_dir=str(tmp_path / "tokenizer"))
    texts = list(corpus["text"][:10]) + ["", "<|endoftext|> inside a text"]
    expected = tokenizer(texts, add_special_tokens=False)["input_ids"]
    assert document_token_ids(tokenizer, texts) == expected
    tokenizer.backend_tokenizer.enable_truncation(4)  # a backend the plain path would not honour: the Trainer's call
    assert document_token_ids(tokenizer, texts) == tokenizer(texts, add_special_tokens=False)["input_ids"]
