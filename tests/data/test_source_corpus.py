"""Tests for `builtin:python-source`: file selection, split by file, version pins, fingerprint, corpus-owned split."""

import dataclasses
import importlib.metadata
import os

import datasets
import numpy as np
import pytest

from adloco_hf.data import (
    BUILTIN_SOURCE_CORPUS,
    build_lm_datasets,
    lm_dataset_stats,
    load_or_train_tokenizer,
    load_source_corpus,
    load_text_corpus,
    python_source,
    train_tokenizer,
)
from adloco_hf.data.python_source import (
    PINNED_VERSIONS,
    SourceFile,
    check_pinned_versions,
    corpus_fingerprint,
    read_documents,
    source_files,
)


@pytest.fixture(autouse=True)
def _isolated_datasets_cache(tmp_path, monkeypatch):
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path / "hf_datasets"))


@pytest.fixture(scope="module")
def all_files():
    return source_files()


def test_file_list_is_deterministic_sorted_unique_and_relative(all_files):
    assert source_files() == all_files
    paths = [f.path for f in all_files]
    assert paths == sorted(paths) and len(set(paths)) == len(paths)
    assert len({f.digest for f in all_files}) == len(all_files)  # identical contents are kept once
    assert {f.package for f in all_files} == set(PINNED_VERSIONS)
    for f in all_files:
        assert not f.path.startswith("/") and ".." not in f.path.split("/")
        assert f.path.endswith((".py", ".pyi")) or f.path.startswith("torch/include/torch/")
        assert 256 <= f.size <= 2 * 1024 * 1024
    assert "torch/version.py" not in paths  # build-specific (CUDA version): differs between wheels
    assert "torch/nn/functional.py" in paths and "transformers/trainer.py" in paths
    assert sum(f.size for f in all_files) > 100e6


def test_the_corpus_is_the_reference_one(all_files):
    # Fails where a pinned package's files differ from the reference install's (or a rule changed: then update
    # REFERENCE_FINGERPRINT and the numbers beside it).
    assert corpus_fingerprint(all_files) == python_source.REFERENCE_FINGERPRINT


def test_split_is_by_file_small_and_disjoint(all_files):
    train = {f.path for f in all_files if f.split == "train"}
    eval_ = {f.path for f in all_files if f.split == "eval"}
    assert train.isdisjoint(eval_) and len(train) + len(eval_) == len(all_files)
    eval_bytes = sum(f.size for f in all_files if f.split == "eval")
    assert 300_000 < eval_bytes <= 400_000 and 10 <= len(eval_) <= 100
    sample = [f for f in all_files if f.tokenizer_sample]
    assert all(f.split == "train" for f in sample)
    assert 20e6 < sum(f.size for f in sample) <= 24e6


def test_subset_split_has_both_sides_and_is_stable():
    files = source_files(["accelerate"], max_files=10)
    assert len(files) == 10 and [f.path for f in files] == sorted(f.path for f in files)
    assert {f.split for f in files} == {"train", "eval"}
    assert files == source_files(["accelerate"], max_files=10)
    with pytest.raises(ValueError, match="not packages of"):
        source_files(["numpy"])


def test_version_check_refuses_another_release(monkeypatch):
    real = python_source._installed_version
    monkeypatch.setattr(python_source, "_installed_version", lambda p: "5.22.0" if p == "transformers" else real(p))
    with pytest.raises(RuntimeError, match=r"transformers==5\.23\.0.*transformers 5\.22\.0 is installed"):
        source_files()
    with pytest.raises(RuntimeError, match="transformers"):
        load_text_corpus(BUILTIN_SOURCE_CORPUS)
    source_files(["accelerate"])  # the other packages are unaffected

    def missing(package):
        raise importlib.metadata.PackageNotFoundError(package)

    monkeypatch.setattr(python_source, "_installed_version", missing)
    with pytest.raises(RuntimeError, match=r"accelerate==1\.15\.0, which is not installed"):
        check_pinned_versions({"accelerate": "1.15.0"})


def test_version_check_ignores_the_local_label(monkeypatch):
    monkeypatch.setattr(python_source, "_installed_version", lambda p: PINNED_VERSIONS[p] + "+cu128")
    assert check_pinned_versions()["torch"] == "2.13.0+cu128"


def test_fingerprint_follows_the_rules_and_the_files(monkeypatch):
    files = source_files(["accelerate"])
    fingerprint = corpus_fingerprint(files)
    assert corpus_fingerprint(source_files(["accelerate"])) == fingerprint
    assert corpus_fingerprint(files[:-1]) != fingerprint
    flipped = [dataclasses.replace(files[0], split="eval"), *files[1:]]
    assert corpus_fingerprint(flipped) != fingerprint
    monkeypatch.setitem(python_source._RULES, "min_bytes", 512)
    assert corpus_fingerprint(files) != fingerprint
    assert corpus_fingerprint(source_files(["accelerate"])) != fingerprint


def test_corpus_rows_are_the_files_and_an_edited_file_is_an_error():
    files = source_files(["accelerate"], max_files=12)
    corpus = load_source_corpus(["accelerate"], max_files=12)
    assert corpus.column_names == ["text", "split", "tokenizer_sample", "path"]
    assert corpus["path"] == [f.path for f in files]
    assert corpus["split"] == [f.split for f in files]
    distribution = importlib.metadata.distribution("accelerate")
    assert corpus[0]["text"] == distribution.locate_file(files[0].path).read_text(encoding="utf-8")
    assert corpus._fingerprint == corpus_fingerprint(files)
    assert load_source_corpus(["accelerate"], max_files=12)._fingerprint == corpus._fingerprint

    edited = SourceFile(package="accelerate", path=files[0].path, size=files[0].size, digest="sha256=0")
    with pytest.raises(RuntimeError, match="reinstall accelerate"):
        list(read_documents([edited]))
    with pytest.raises(ValueError, match="data_files is not used"):
        load_text_corpus(BUILTIN_SOURCE_CORPUS, data_files="x.jsonl")


def test_the_tokenizer_learns_from_the_corpus_sample_only(tmp_path):
    corpus = datasets.Dataset.from_dict({"text": ["xy " * 300, "wv " * 300], "tokenizer_sample": [True, False]})
    vocab = train_tokenizer(corpus, vocab_size=300, save_dir=str(tmp_path / "tok")).get_vocab()
    assert "xy" in vocab and "w" in vocab
    assert not any("wv" in token for token in vocab)


def test_packing_uses_the_corpus_split(tmp_path):
    texts = [f"zqk{i} " + "alpha beta gamma delta " * (20 + i) for i in range(6)]
    corpus = datasets.Dataset.from_dict({"text": texts, "split": ["train", "eval", "train", "train", "eval", "train"]})
    tokenizer = train_tokenizer(corpus, vocab_size=300, save_dir=str(tmp_path / "tok"))
    for seed, fraction in ((0, 0.5), (7, 0.2)):  # eval_fraction and seed are not used
        lm = build_lm_datasets(corpus, tokenizer, block_size=8, eval_fraction=fraction, seed=seed)
        eval_text = tokenizer.decode([t for block in lm["eval"]["input_ids"] for t in block])
        train_text = tokenizer.decode([t for block in lm["train"]["input_ids"] for t in block])
        assert "zqk1" in eval_text and "zqk4" in eval_text
        assert not any(f"zqk{i}" in eval_text for i in (0, 2, 3, 5))
        assert not any(f"zqk{i}" in train_text for i in (1, 4))

    with pytest.raises(ValueError, match="no eval document"):
        build_lm_datasets(corpus.select([0, 2]), tokenizer, block_size=8)
    with pytest.raises(ValueError, match="only 'train' and 'eval'"):
        build_lm_datasets(corpus.map(lambda r: {"split": "test"}), tokenizer, block_size=8)


@pytest.mark.slow
def test_full_corpus_holds_30m_train_tokens_and_loads_fast_from_its_cache(tmp_path):
    """Builds the whole corpus (about a minute on 2 cores, 250 MB under tmp_path)."""
    cache_dir = str(tmp_path / "cache")
    texts = load_text_corpus(BUILTIN_SOURCE_CORPUS)
    assert len(texts) > 5000
    tokenizer = load_or_train_tokenizer(None, texts, vocab_size=4096, cache_dir=cache_dir)
    lm = build_lm_datasets(texts, tokenizer, block_size=128, cache_dir=cache_dir)
    stats = lm_dataset_stats(lm)
    assert stats["train_tokens"] >= 30_000_000
    assert 50_000 <= stats["eval_tokens"] <= 200_000
    eval_rows = np.flatnonzero(np.asarray(texts["split"]) == "eval")
    assert 10 <= len(eval_rows) <= 100

    # Loaded from its cache: nothing is trained, tokenised or written again, and the blocks come from the cached folder.
    def files():
        return {
            os.path.join(d, f): os.stat(os.path.join(d, f)).st_mtime_ns for d, _, fs in os.walk(cache_dir) for f in fs
        }

    before = files()
    texts = load_text_corpus(BUILTIN_SOURCE_CORPUS)
    tokenizer = load_or_train_tokenizer(None, texts, vocab_size=4096, cache_dir=cache_dir)
    again = build_lm_datasets(texts, tokenizer, block_size=128, cache_dir=cache_dir)
    assert files() == before
    for split in ("train", "eval"):
        assert all(f["filename"].startswith(os.path.join(cache_dir, "lm-")) for f in again[split].cache_files)
    assert lm_dataset_stats(again) == stats
