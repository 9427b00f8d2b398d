"""`builtin:python-source` on machines that cannot install its pinned packages: export it once, load the export.

The corpus is the source of torch 2.13.0, transformers 5.23.0 and accelerate 1.15.0 ([`python_source`]), so a
machine with another torch (a CUDA image with its own build, say) cannot make it. Export it on a machine that can
and point the other at the export:

    python -m adloco_hf.data.corpus_export /path/to/export      # writes corpus.parquet (zstd, ~20 MB) + corpus.json
    export ADLOCO_SOURCE_CORPUS=/path/to/export                  # on the other machine, before training

With [`SOURCE_CORPUS_ENV`] set, `load_text_corpus("builtin:python-source")` reads the export instead of the
installed packages: the same rows, under the same fingerprint (so every cache downstream, tokenizer and packed
blocks, is shared with the machines that built it from source). The export's bytes are checked against the sha256
recorded beside them, and an export of another corpus (its fingerprint is not [`REFERENCE_FINGERPRINT`]) is
refused, naming both fingerprints.
"""

import argparse
import hashlib
import json
import os

import datasets
import pyarrow.parquet as pq

from ..common.upstream import fingerprint as dataset_fingerprint
from .python_source import (
    BUILTIN_SOURCE_CORPUS,
    PINNED_VERSIONS,
    REFERENCE_FINGERPRINT,
    load_source_corpus,
    source_corpus_features,
)


SOURCE_CORPUS_ENV = "ADLOCO_SOURCE_CORPUS"
DATA_FILE = "corpus.parquet"
MANIFEST_FILE = "corpus.json"


def _sha256(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def export_source_corpus(directory: str, packages: list[str] | None = None, max_files: int | None = None) -> dict:
    """Write the corpus (built from the installed pinned packages) to `directory` as parquet plus a manifest.

    Args:
        directory: created if missing; `corpus.parquet` and `corpus.json` are replaced.
        packages, max_files: a subset, as in [`load_source_corpus`] (for tests); `None`: the corpus.

    Returns:
        The manifest: corpus name, fingerprint, pinned versions, rows and the parquet file's sha256.
    """
    corpus = load_source_corpus(packages, max_files=max_files)
    os.makedirs(directory, exist_ok=True)
    data_path = os.path.join(directory, DATA_FILE)
    tmp = data_path + ".tmp"
    pq.write_table(corpus.data.table, tmp, compression="zstd")
    os.replace(tmp, data_path)
    manifest = {
        "corpus": BUILTIN_SOURCE_CORPUS,
        "fingerprint": dataset_fingerprint(corpus),
        "pinned_versions": PINNED_VERSIONS,
        "num_rows": len(corpus),
        "sha256": _sha256(data_path),
    }
    with open(os.path.join(directory, MANIFEST_FILE), "w", encoding="utf-8") as f:
        json.dump(manifest, f, indent=2)
    return manifest


def load_exported_corpus(
    directory: str, *, fingerprint: str = REFERENCE_FINGERPRINT, cache_dir: str | None = None
) -> datasets.Dataset:
    """The corpus from an export made by [`export_source_corpus`], with the corpus's own fingerprint.

    Args:
        directory: the export.
        fingerprint: the corpus it must hold (the reference corpus; a subset's, for tests).
        cache_dir: `datasets`' cache to build it in (default: `HF_DATASETS_CACHE`).

    Raises:
        FileNotFoundError: `directory` has no manifest or data file.
        ValueError: the data file's bytes differ from the manifest's sha256, or the export is of another corpus.
    """
    manifest_path = os.path.join(directory, MANIFEST_FILE)
    data_path = os.path.join(directory, DATA_FILE)
    for path in (manifest_path, data_path):
        if not os.path.isfile(path):
            raise FileNotFoundError(
                f"{SOURCE_CORPUS_ENV}={directory!r} has no {os.path.basename(path)}: make the export with "
                f"`python -m adloco_hf.data.corpus_export {directory}` on a machine with {PINNED_VERSIONS}"
            )
    with open(manifest_path, encoding="utf-8") as f:
        manifest = json.load(f)
    if manifest.get("fingerprint") != fingerprint:
        raise ValueError(
            f"{SOURCE_CORPUS_ENV}={directory!r} holds a corpus of fingerprint {manifest.get('fingerprint')}, not "
            f"{BUILTIN_SOURCE_CORPUS}'s {fingerprint}: export it again with this version of adloco_hf"
        )
    if _sha256(data_path) != manifest.get("sha256"):
        raise ValueError(
            f"{data_path} does not match the sha256 in {manifest_path}: the export is damaged, copy it again"
        )

    def documents():
        for batch in pq.ParquetFile(data_path).iter_batches(batch_size=256):
            yield from batch.to_pylist()

    return datasets.Dataset.from_generator(
        documents, features=source_corpus_features(), fingerprint=fingerprint, cache_dir=cache_dir
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Export builtin:python-source for machines without its pins.")
    parser.add_argument("directory", help="Where to write corpus.parquet and corpus.json.")
    manifest = export_source_corpus(parser.parse_args(argv).directory)
    print(json.dumps(manifest, indent=2))


if __name__ == "__main__":
    main()
