"""Where documents come from: the built-in offline corpus, C4 streaming, local files and Hub datasets.

Every source ends up as a `datasets.Dataset` with one column, `"text"`, one document per row. Streamed sources are
materialised once in `datasets`' cache under a fingerprint of the request, so a second call reads them from disk.
`builtin:python-source` (module `python_source`) is built there the same way and also carries its own train/eval
split and tokenizer sample as columns.
"""

import functools
import glob
import json
import logging
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from typing import Any

import datasets

from .cache import FORMAT_VERSION, content_hash
from .python_source import BUILTIN_SOURCE_CORPUS, load_source_corpus


logger = logging.getLogger(__name__)

BUILTIN_CORPUS = "builtin:python-docs"
C4_DATASET = "allenai/c4"

_MIN_DOC_CHARS = 200
_BUILDER_BY_SUFFIX = {".json": "json", ".jsonl": "json", ".txt": "text", ".csv": "csv", ".parquet": "parquet"}
_COMPRESSION_SUFFIXES = (".gz", ".bz2", ".xz", ".zst", ".lz4")
# The program that collects the built-in corpus, run in a fresh interpreter: see its docstring.
_STDLIB_DOCS_PROGRAM = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_stdlib_docs.py")


@functools.lru_cache(maxsize=1)
def _builtin_texts() -> tuple[str, ...]:
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "docs.json")
        cmd = [sys.executable, "-I", "-S", _STDLIB_DOCS_PROGRAM, out, str(_MIN_DOC_CHARS)]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        if proc.returncode != 0 or not os.path.exists(out):
            raise RuntimeError(
                f"Collecting the standard library's docstrings with {sys.executable} failed "
                f"(exit {proc.returncode}):\n{proc.stderr[-2000:]}"
            )
        with open(out, encoding="utf-8") as f:
            return tuple(json.load(f))


def load_builtin_corpus() -> datasets.Dataset:
    """The built-in offline corpus `builtin:python-docs`: English text that every CPython carries.

    One document per entry of `pydoc_data.topics.topics` (the language reference pages `help()` shows), then one
    document per standard-library module: its docstring and those of its public classes (with their public methods
    and properties) and functions, joined with blank lines. Modules are found with `pkgutil` (top-level modules,
    built-in modules and the public submodules of packages) and imported in a separate, isolated interpreter, so the
    rows are the same, in the same order, on every call and every machine with the same Python version. Modules that
    fail to import or print when imported are skipped, each docstring is kept once, and documents shorter than 200
    characters are dropped. On CPython 3.11 this is 350 documents (79 topics, 271 modules) and 1.65 MB of text,
    about 450k tokens with a 4096-token byte-level BPE. The text is collected once per process (under a second) and
    cached.

    Returns:
        A `datasets.Dataset` with one column, `"text"`. Each call returns a new object (so `set_format` on one does
        not leak into another); its `_fingerprint` only depends on the text, which keeps downstream caches valid.
    """
    return datasets.Dataset.from_dict({"text": list(_builtin_texts())})


def load_c4(
    *, num_documents: int, split: str = "train", data_files: str | list[str] | None = None
) -> datasets.Dataset:
    """The first `num_documents` documents of C4 (`allenai/c4`, config "en"), streamed and kept as `"text"` only.

    The documents are streamed (nothing else of the 300 GB is downloaded) and written once to `datasets`' cache
    (`HF_DATASETS_CACHE`) under a fingerprint of the request, so a second call with the same arguments reads them
    from disk instead of streaming again.

    Args:
        num_documents: how many documents to take, from the start of the split.
        split: the C4 split, "train" or "validation". Not used with `data_files`.
        data_files: local JSON-lines files (or glob patterns, optionally compressed) in C4's schema (`text`,
            `timestamp`, `url`), read through the same streaming path: how tests run it offline, and how to use a
            copy of C4 on local disk (e.g. `c4/en/c4-train.0000*-of-01024.json.gz`).

    Returns:
        A `datasets.Dataset` with one column, `"text"`, and `num_documents` rows (fewer only if the source has fewer,
        with a warning).
    """
    if num_documents < 1:
        raise ValueError(f"num_documents must be >= 1, got {num_documents}")
    if data_files is None:
        stream = datasets.load_dataset(C4_DATASET, "en", split=split, streaming=True)
        source = [C4_DATASET, "en", split]
    else:
        stream = datasets.load_dataset("json", data_files=data_files, split="train", streaming=True)
        source = ["json", _files_signature(data_files)]
    return _take_documents(stream, num_documents=num_documents, text_column="text", source=source)


def load_text_corpus(
    source: str,
    *,
    num_documents: int | None = None,
    data_files: str | list[str] | None = None,
    text_column: str = "text",
) -> datasets.Dataset:
    """Load documents from any supported source as a `datasets.Dataset` with a single `"text"` column.

    | source | what is loaded |
    |---|---|
    | `"builtin:python-docs"` | [`load_builtin_corpus`] (offline), the first `num_documents` rows if given |
    | `"builtin:python-source"` | [`load_source_corpus`] (offline; an export of it where `ADLOCO_SOURCE_CORPUS` is set, see [`corpus_export`]), the first `num_documents` rows if given |
    | `"allenai/c4"` or `"c4"` | [`load_c4`]; `num_documents` is required |
    | a local file | `.json`/`.jsonl` with the "json" builder, `.txt` with the "text" builder (one document per line), also `.csv`, `.parquet` and compressed `.gz`/`.bz2`/`.xz`/`.zst` |
    | a local directory | `load_dataset(directory)`, the builder inferred from the files in it |
    | anything else | a Hub dataset id: `load_dataset(source, split="train", data_files=data_files)` |

    With `num_documents`, files and Hub datasets are streamed and only the first `num_documents` documents are read
    (then kept in `datasets`' cache); without it the whole "train" split is loaded.

    Args:
        source: one of the sources above.
        num_documents: how many documents to take from the start; `None` takes all (not allowed for C4).
        data_files: data files for C4 (see [`load_c4`]) or a Hub dataset; not used otherwise.
        text_column: the column holding the documents; renamed to `"text"`, every other column is dropped.

    Returns:
        A `datasets.Dataset` with one column, `"text"`; `"builtin:python-source"` also has the columns `"split"`,
        `"tokenizer_sample"` and `"path"`: the corpus decides its own train/eval split and tokenizer sample.
    """
    if num_documents is not None and num_documents < 1:
        raise ValueError(f"num_documents must be >= 1 or None, got {num_documents}")
    if source == BUILTIN_CORPUS:
        if data_files is not None:
            raise ValueError(f"data_files is not used with {BUILTIN_CORPUS!r}; pass source='allenai/c4' or a path")
        corpus = load_builtin_corpus()
        return corpus if num_documents is None else corpus.select(range(min(num_documents, len(corpus))))
    if source == BUILTIN_SOURCE_CORPUS:
        if data_files is not None:
            raise ValueError(
                f"data_files is not used with {BUILTIN_SOURCE_CORPUS!r}; pass source='allenai/c4' or a path"
            )
        from .corpus_export import SOURCE_CORPUS_ENV, load_exported_corpus  # its CLI runs with `python -m`

        export = os.environ.get(SOURCE_CORPUS_ENV)
        corpus = load_exported_corpus(export) if export else load_source_corpus()
        return corpus if num_documents is None else corpus.select(range(min(num_documents, len(corpus))))
    if source in (C4_DATASET, "c4"):
        if num_documents is None:
            raise ValueError(
                f"num_documents is required for {C4_DATASET!r} (C4 'en' has 365M documents): "
                "pass how many documents to stream, e.g. num_documents=100_000"
            )
        if text_column != "text":
            raise ValueError(f"text_column={text_column!r} does not exist in C4, whose documents are in 'text'")
        return load_c4(num_documents=num_documents, data_files=data_files)

    if os.path.isfile(source):
        builder, builder_files = builder_for_file(source), os.path.abspath(source)
        load_args, identity = (builder,), [builder, _files_signature(builder_files)]
        load_kwargs = {"data_files": builder_files}
    elif os.path.isdir(source):
        load_args, identity = (source,), ["dir", _files_signature(os.path.join(os.path.abspath(source), "**"))]
        load_kwargs = {}
    else:
        load_args, identity = (source,), ["hub", source, _files_signature(data_files) if data_files else None]
        load_kwargs = {"data_files": data_files} if data_files is not None else {}

    if num_documents is not None:
        stream = datasets.load_dataset(*load_args, split="train", streaming=True, **load_kwargs)
        return _take_documents(stream, num_documents=num_documents, text_column=text_column, source=identity)
    dataset = datasets.load_dataset(*load_args, split="train", **load_kwargs)
    check_text_column(dataset.column_names, text_column, source)
    dataset = dataset.select_columns([text_column])
    return dataset if text_column == "text" else dataset.rename_column(text_column, "text")


def builder_for_file(path: str) -> str:
    name = path.lower()
    for suffix in _COMPRESSION_SUFFIXES:
        name = name.removesuffix(suffix)
    builder = _BUILDER_BY_SUFFIX.get(os.path.splitext(name)[1])
    if builder is None:
        raise ValueError(f"Cannot tell how to read {path!r}: supported extensions are {sorted(_BUILDER_BY_SUFFIX)}")
    return builder


def _files_signature(data_files: str | list[str]) -> list[Any]:
    """Paths, sizes and modification times of local files, so an edited file is read again."""
    patterns = [data_files] if isinstance(data_files, str) else list(data_files)
    signature = []
    for pattern in patterns:
        matches = sorted(p for p in glob.glob(os.path.abspath(pattern), recursive=True) if os.path.isfile(p))
        if not matches:
            signature.append(pattern)
        for path in matches:
            stat = os.stat(path)
            signature.append([path, stat.st_size, stat.st_mtime_ns])
    return signature


def check_text_column(columns: list[str] | None, text_column: str, source: Any) -> None:
    if columns is not None and text_column not in columns:
        raise ValueError(
            f"text_column={text_column!r} is not a column of {source}: its columns are {columns}. "
            "Pass the column that holds the documents as text_column."
        )


def require_text_column(texts: datasets.Dataset) -> None:
    if "text" not in texts.column_names:
        raise ValueError(
            f"texts has no 'text' column (its columns are {texts.column_names}): load it with "
            "load_text_corpus(..., text_column=...) or rename the column that holds the documents to 'text'"
        )


def select_text_column(stream: datasets.IterableDataset, text_column: str, source) -> datasets.IterableDataset:
    """The stream with only `text_column` (checked to exist, from the first document when features are unknown)."""
    columns = stream.column_names
    if columns is None:  # features unknown until read: look at the first document
        first = next(iter(stream.take(1)), None)
        columns = None if first is None else list(first)
    check_text_column(columns, text_column, source)
    stream = stream.select_columns([text_column])
    return stream


def _take_documents(
    stream: datasets.IterableDataset, *, num_documents: int, text_column: str, source: list[Any]
) -> datasets.Dataset:
    """Materialise the first documents of a stream into an on-disk `Dataset` (the C4 path and every streamed one)."""
    stream = select_text_column(stream, text_column, source)

    def documents() -> Iterator[dict[str, str]]:
        for example in stream.take(num_documents):
            yield {"text": example[text_column]}

    # An explicit fingerprint names the cache entry (and avoids hashing the stream object): same request, same rows.
    fingerprint = content_hash(["documents", FORMAT_VERSION, source, text_column, num_documents])
    features = datasets.Features({"text": datasets.Value("string")})
    dataset = datasets.Dataset.from_generator(documents, features=features, fingerprint=fingerprint)
    if len(dataset) < num_documents:
        logger.warning("%s has only %d documents, fewer than num_documents=%d", source, len(dataset), num_documents)
    return dataset
