"""`builtin:python-source` exported where its pins are installed and loaded where they are not (a CUDA image)."""

import json

import datasets
import pytest

from adloco_hf.data import load_source_corpus, load_text_corpus
from adloco_hf.data.corpus_export import (
    DATA_FILE,
    MANIFEST_FILE,
    SOURCE_CORPUS_ENV,
    export_source_corpus,
    load_exported_corpus,
)
from adloco_hf.data.python_source import REFERENCE_FINGERPRINT


SUBSET = {"packages": ["accelerate"], "max_files": 12}


@pytest.fixture(autouse=True)
def _isolated_datasets_cache(tmp_path, monkeypatch):
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path / "hf_datasets"))


def test_an_export_loads_back_as_the_same_rows_under_the_same_fingerprint(tmp_path):
    manifest = export_source_corpus(str(tmp_path / "export"), **SUBSET)
    source = load_source_corpus(**SUBSET)
    assert manifest["fingerprint"] == source._fingerprint and manifest["num_rows"] == len(source) == 12
    # A cache of its own: the rows must come from the parquet file, not from the source build's cache entry.
    loaded = load_exported_corpus(
        str(tmp_path / "export"), fingerprint=source._fingerprint, cache_dir=str(tmp_path / "other_cache")
    )
    assert loaded._fingerprint == source._fingerprint
    assert str(tmp_path / "other_cache") in loaded.cache_files[0]["filename"]
    assert loaded.features == source.features
    assert loaded.to_dict() == source.to_dict()


def test_a_damaged_or_foreign_export_is_refused_with_the_fix(tmp_path):
    directory = tmp_path / "export"
    with pytest.raises(FileNotFoundError, match="python -m adloco_hf.data.corpus_export"):
        load_exported_corpus(str(directory))
    manifest = export_source_corpus(str(directory), **SUBSET)
    # A subset is not the reference corpus: refused, naming both fingerprints.
    with pytest.raises(ValueError, match=f"{manifest['fingerprint']}.*{REFERENCE_FINGERPRINT}"):
        load_exported_corpus(str(directory))
    data = directory / DATA_FILE
    data.write_bytes(data.read_bytes()[:-10] + b"0123456789")
    with pytest.raises(ValueError, match="export is damaged"):
        load_exported_corpus(str(directory), fingerprint=manifest["fingerprint"])


def test_the_environment_variable_points_load_text_corpus_at_the_export(tmp_path, monkeypatch):
    directory = tmp_path / "export"
    export_source_corpus(str(directory), **SUBSET)
    manifest = json.loads((directory / MANIFEST_FILE).read_text())
    # Relabel the subset as the reference corpus (sha256 unchanged: the data file is untouched), so that what
    # load_text_corpus returns can only have come from the export.
    manifest["fingerprint"] = REFERENCE_FINGERPRINT
    (directory / MANIFEST_FILE).write_text(json.dumps(manifest))
    monkeypatch.setenv(SOURCE_CORPUS_ENV, str(directory))
    corpus = load_text_corpus("builtin:python-source", num_documents=5)
    assert len(corpus) == 5 and corpus["path"] == load_source_corpus(**SUBSET)["path"][:5]
