"""Data for AdLoCo runs: the built-in offline corpus, C4 streaming, a byte-level BPE tokenizer, and packing.

Every source ends up as a `datasets.Dataset` with one column, `"text"`, one document per row; the same code then
splits the documents into train/eval, tokenises them and packs them into blocks of `block_size` tokens
(DESIGN §7). Nothing here downloads anything unless you ask for a Hub dataset or tokenizer by name:

- `builtin:python-docs` ([`BUILTIN_CORPUS`]) is English text every CPython carries (the `pydoc` topics and the
  standard library's docstrings, about 1.7 MB), so tests, CI and `make demo` run offline.
- `allenai/c4` streams the first N documents of C4 ("en") and keeps them on disk (`datasets`' own cache), so a second
  run does not stream again. The same code reads local JSON-lines files in C4's schema, which is how it is tested.

Example:
```python
>>> texts = load_text_corpus(BUILTIN_CORPUS)
>>> tokenizer = load_or_train_tokenizer(None, texts, vocab_size=4096, cache_dir="outputs/cache")
>>> lm = build_lm_datasets(texts, tokenizer, block_size=128, cache_dir="outputs/cache")
>>> lm_dataset_stats(lm)["train_blocks"] > 0
True
```
"""

import contextlib
import functools
import glob
import hashlib
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from itertools import chain
from typing import Any

import datasets
import numpy as np
import torch.distributed as dist
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import AutoTokenizer, PreTrainedTokenizerBase, PreTrainedTokenizerFast


__all__ = [
    "BUILTIN_CORPUS",
    "C4_DATASET",
    "EOS_TOKEN",
    "build_lm_datasets",
    "lm_dataset_stats",
    "load_builtin_corpus",
    "load_c4",
    "load_or_train_tokenizer",
    "load_text_corpus",
    "train_tokenizer",
]

logger = logging.getLogger(__name__)

BUILTIN_CORPUS = "builtin:python-docs"
C4_DATASET = "allenai/c4"
EOS_TOKEN = "<|endoftext|>"

# Bump when the corpus, tokenizer or packing recipe changes: it is part of every fingerprint, so old caches are ignored.
_FORMAT_VERSION = 1
_MIN_DOC_CHARS = 200
_TOKENIZER_FINGERPRINT_FILE = "adloco_tokenizer.json"
_LM_INFO_FILE = "adloco_lm_dataset.json"
_MAP_BATCH_SIZE = 1000
_BUILDER_BY_SUFFIX = {".json": "json", ".jsonl": "json", ".txt": "text", ".csv": "csv", ".parquet": "parquet"}
_COMPRESSION_SUFFIXES = (".gz", ".bz2", ".xz", ".zst", ".lz4")

# Runs in a fresh interpreter started with `-I -S`: only the standard library is on sys.path, so the text depends on
# the Python version alone (not on installed packages, nor on what the caller imported or monkeypatched), and import
# side effects (atexit hooks, threads, signal handlers, output) die with the child. Modules that print are dropped.
# Skipped on purpose: modules that act when imported (`antigravity` opens a browser, `this` prints, `readline`
# writes terminal codes, `rlcompleter` imports it), GUI and IDE packages, test packages and C test modules, and
# `distutils`/`lib2to3` (deprecated, gone in 3.12/3.13). Everything is sorted and each docstring is kept once.
_STDLIB_DOCS_SCRIPT = r"""
import contextlib, importlib, inspect, io, json, pkgutil, sys, warnings

SKIP = {"__main__", "antigravity", "this", "readline", "rlcompleter", "idlelib", "tkinter", "turtle", "turtledemo",
        "test", "xxlimited", "xxlimited_35", "xxsubtype", "distutils", "lib2to3", "pydoc_data"}
SKIP_PARTS = {"test", "tests", "idle_test"}
MIN_CHARS = int(sys.argv[2])


def public(name):
    return not any(part.startswith("_") for part in name.split("."))


def quiet_import(name):
    sink = io.StringIO()
    try:
        with warnings.catch_warnings(), contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):
            warnings.simplefilter("ignore")
            module = importlib.import_module(name)
    except BaseException:
        return None
    return None if sink.getvalue() else module


def clean(doc):
    return inspect.cleandoc(doc) if isinstance(doc, str) and doc.strip() else None


def docstrings(module):
    yield clean(module.__doc__)
    exported = getattr(module, "__all__", None)
    if not (isinstance(exported, (list, tuple)) and all(isinstance(n, str) for n in exported)):
        exported = None
    for name in sorted(set(exported or (n for n in dir(module) if not n.startswith("_")))):
        obj = getattr(module, name, None)
        if not (inspect.isclass(obj) or inspect.isroutine(obj)):
            continue
        # Without __all__, only what the module defines: imported names are documented where they live.
        if exported is None and getattr(obj, "__module__", None) != module.__name__:
            continue
        yield clean(obj.__doc__)
        if inspect.isclass(obj):
            for attr, member in sorted(vars(obj).items()):
                if not attr.startswith("_") and (inspect.isroutine(member) or isinstance(member, property)):
                    yield clean(getattr(member, "__doc__", None))


import pydoc_data.topics

documents, seen = [], set()
for key in sorted(pydoc_data.topics.topics):
    text = pydoc_data.topics.topics[key].strip()
    if len(text) >= MIN_CHARS and text not in seen:
        seen.add(text)
        documents.append(text)

top_level = {m.name for m in pkgutil.iter_modules()} | set(sys.builtin_module_names)
for top in sorted(n for n in top_level if public(n) and n not in SKIP):
    module = quiet_import(top)
    if module is None:
        continue
    names = [top]
    if hasattr(module, "__path__"):
        subs = pkgutil.walk_packages(module.__path__, top + ".", onerror=lambda name: None)
        names += sorted(m.name for m in subs if public(m.name) and not SKIP_PARTS & set(m.name.split(".")))
    for name in names:
        module = quiet_import(name)
        if module is None:
            continue
        parts = []
        for doc in docstrings(module):
            if doc and doc not in seen:
                seen.add(doc)
                parts.append(doc)
        text = "\n\n".join(parts)
        if len(text) >= MIN_CHARS:
            documents.append(text)

with open(sys.argv[1], "w", encoding="utf-8") as f:
    json.dump(documents, f)
"""


# --------------------------------------------------------------------------------------------------------------------
# Sources
# --------------------------------------------------------------------------------------------------------------------


@functools.lru_cache(maxsize=1)
def _builtin_texts() -> tuple[str, ...]:
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "docs.json")
        cmd = [sys.executable, "-I", "-S", "-c", _STDLIB_DOCS_SCRIPT, out, str(_MIN_DOC_CHARS)]
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
        A `datasets.Dataset` with one column, `"text"`.
    """
    if num_documents is not None and num_documents < 1:
        raise ValueError(f"num_documents must be >= 1 or None, got {num_documents}")
    if source == BUILTIN_CORPUS:
        if data_files is not None:
            raise ValueError(f"data_files is not used with {BUILTIN_CORPUS!r}; pass source='allenai/c4' or a path")
        corpus = load_builtin_corpus()
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
        builder, builder_files = _builder_for_file(source), os.path.abspath(source)
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
    _check_text_column(dataset.column_names, text_column, source)
    dataset = dataset.select_columns([text_column])
    return dataset if text_column == "text" else dataset.rename_column(text_column, "text")


def _builder_for_file(path: str) -> str:
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


def _check_text_column(columns: list[str] | None, text_column: str, source: Any) -> None:
    if columns is not None and text_column not in columns:
        raise ValueError(
            f"text_column={text_column!r} is not a column of {source}: its columns are {columns}. "
            "Pass the column that holds the documents as text_column."
        )


def _require_text_column(texts: datasets.Dataset) -> None:
    if "text" not in texts.column_names:
        raise ValueError(
            f"texts has no 'text' column (its columns are {texts.column_names}): load it with "
            "load_text_corpus(..., text_column=...) or rename the column that holds the documents to 'text'"
        )


def _take_documents(
    stream: datasets.IterableDataset, *, num_documents: int, text_column: str, source: list[Any]
) -> datasets.Dataset:
    """Materialise the first documents of a stream into an on-disk `Dataset` (the C4 path and every streamed one)."""
    columns = stream.column_names
    if columns is None:  # features unknown until read: look at the first document
        first = next(iter(stream.take(1)), None)
        columns = None if first is None else list(first)
    _check_text_column(columns, text_column, source)
    stream = stream.select_columns([text_column])

    def documents() -> Iterator[dict[str, str]]:
        for example in stream.take(num_documents):
            yield {"text": example[text_column]}

    # An explicit fingerprint names the cache entry (and avoids hashing the stream object): same request, same rows.
    fingerprint = _hash(["documents", _FORMAT_VERSION, source, text_column, num_documents])
    features = datasets.Features({"text": datasets.Value("string")})
    dataset = datasets.Dataset.from_generator(documents, features=features, fingerprint=fingerprint)
    if len(dataset) < num_documents:
        logger.warning("%s has only %d documents, fewer than num_documents=%d", source, len(dataset), num_documents)
    return dataset


# --------------------------------------------------------------------------------------------------------------------
# Tokenizer
# --------------------------------------------------------------------------------------------------------------------


def train_tokenizer(texts: datasets.Dataset, *, vocab_size: int, save_dir: str) -> PreTrainedTokenizerFast:
    """Train a byte-level BPE tokenizer on `texts["text"]`, save it to `save_dir`, or reuse the one saved there.

    GPT-2's recipe with the `tokenizers` library: ByteLevel pre-tokenizer and decoder (every byte is in the vocabulary,
    so any text round-trips and there are no unknown tokens) and one special token, `"<|endoftext|>"`, used as
    bos/eos/unk/pad. No special token is added when encoding; [`build_lm_datasets`] appends the eos after each
    document. `save_dir` also receives `adloco_tokenizer.json`, a fingerprint of `texts` and `vocab_size`: when it
    matches, the saved tokenizer is loaded instead of trained again. Files are written to a temporary directory and
    moved into `save_dir` one by one with `os.replace`, the fingerprint last, so a reader never sees a half-written
    tokenizer; other files in `save_dir` are left alone. Under `torch.distributed`, global rank 0 trains and the
    other ranks load its result.

    Args:
        texts: documents, column `"text"`.
        vocab_size: size of the vocabulary, special token included (> 257: the 256 bytes and `"<|endoftext|>"`).
        save_dir: where the tokenizer is saved (`save_pretrained`) and looked for.

    Returns:
        The tokenizer, as loaded from `save_dir` (the same object a later call returns).
    """
    if vocab_size <= 257:
        raise ValueError(f"vocab_size must be > 257 (256 bytes + {EOS_TOKEN!r}), got {vocab_size}")
    _require_text_column(texts)
    fingerprint = _tokenizer_training_fingerprint(texts, vocab_size)
    with _main_process_first():
        if _saved_fingerprint(save_dir) != fingerprint:
            tokenizer = _train_byte_level_bpe(texts, vocab_size)
            os.makedirs(save_dir, exist_ok=True)
            with tempfile.TemporaryDirectory(dir=save_dir, prefix=".tmp-tokenizer-") as tmp:
                tokenizer.save_pretrained(tmp)
                info = {"fingerprint": fingerprint, "vocab_size": vocab_size, "num_documents": len(texts)}
                with open(os.path.join(tmp, _TOKENIZER_FINGERPRINT_FILE), "w") as f:
                    json.dump(info, f, indent=2)
                _publish_files(tmp, save_dir, last=_TOKENIZER_FINGERPRINT_FILE)
    return AutoTokenizer.from_pretrained(save_dir)


def load_or_train_tokenizer(
    tokenizer_name_or_path: str | None, texts: datasets.Dataset, *, vocab_size: int, cache_dir: str
) -> PreTrainedTokenizerBase:
    """The tokenizer of a run: a pretrained one, or a byte-level BPE trained on the corpus and cached.

    Args:
        tokenizer_name_or_path: a local path or Hub id for `AutoTokenizer.from_pretrained`; `None` trains one with
            [`train_tokenizer`] into `cache_dir/tokenizer-<fingerprint of texts and vocab_size>`.
        texts: documents, column `"text"` (only used for training).
        vocab_size: vocabulary size of a trained tokenizer (ignored for a pretrained one).
        cache_dir: where trained tokenizers are kept.

    Returns:
        The tokenizer, with `pad_token` set (to the eos token when it had none).
    """
    if tokenizer_name_or_path is None:
        fingerprint = _tokenizer_training_fingerprint(texts, vocab_size)
        save_dir = os.path.join(cache_dir, f"tokenizer-{fingerprint}")
        return train_tokenizer(texts, vocab_size=vocab_size, save_dir=save_dir)
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_name_or_path)
    if tokenizer.pad_token is None:
        if tokenizer.eos_token is None:
            raise ValueError(
                f"Tokenizer {tokenizer_name_or_path!r} has neither a pad_token nor an eos_token; packing needs an "
                "eos_token between documents: set tokenizer_name_or_path to a tokenizer that has one"
            )
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def _train_byte_level_bpe(texts: datasets.Dataset, vocab_size: int) -> PreTrainedTokenizerFast:
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOS_TOKEN],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    batches = (texts[i : i + _MAP_BATCH_SIZE]["text"] for i in range(0, len(texts), _MAP_BATCH_SIZE))
    tokenizer.train_from_iterator(batches, trainer=trainer, length=len(texts))
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        bos_token=EOS_TOKEN,
        eos_token=EOS_TOKEN,
        unk_token=EOS_TOKEN,
        pad_token=EOS_TOKEN,
        clean_up_tokenization_spaces=False,  # the default would rewrite " ." to "." and break round trips
    )


def _tokenizer_training_fingerprint(texts: datasets.Dataset, vocab_size: int) -> str:
    return _hash(["tokenizer", _FORMAT_VERSION, texts._fingerprint, vocab_size])


def _saved_fingerprint(save_dir: str) -> str | None:
    try:
        with open(os.path.join(save_dir, _TOKENIZER_FINGERPRINT_FILE)) as f:
            return json.load(f).get("fingerprint")
    except (OSError, ValueError):
        return None


def _tokenizer_fingerprint(tokenizer: PreTrainedTokenizerBase) -> str:
    """Identity of a tokenizer for the packing cache: its name, size, eos, and a hash of its full definition."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        definition = backend.to_str()
    else:  # a slow tokenizer: the vocabulary (with BPE merges where it has them) is what it is made of
        merges = getattr(tokenizer, "bpe_ranks", None)
        merges = sorted((" ".join(pair), rank) for pair, rank in merges.items()) if merges else None
        definition = json.dumps([sorted(tokenizer.get_vocab().items()), merges])
    return _hash(
        [
            tokenizer.name_or_path,
            len(tokenizer),
            tokenizer.eos_token_id,
            hashlib.sha256(definition.encode("utf-8")).hexdigest(),
        ]
    )


# --------------------------------------------------------------------------------------------------------------------
# Tokenisation and packing
# --------------------------------------------------------------------------------------------------------------------


def build_lm_datasets(
    texts: datasets.Dataset,
    tokenizer: PreTrainedTokenizerBase,
    *,
    block_size: int,
    eval_fraction: float = 0.05,
    max_eval_documents: int | None = None,
    seed: int = 42,
    cache_dir: str | None = None,
    num_proc: int | None = None,
) -> datasets.DatasetDict:
    """Split documents into train/eval, tokenise them and pack each split into blocks of `block_size` tokens.

    1. Documents are split before packing (a seeded permutation picks the eval documents; both splits keep the
       corpus order), so no eval block shares a document with a train block.
    2. Each document is tokenised without special tokens and followed by `tokenizer.eos_token_id`, so every
       document boundary survives packing (GPT-2's convention).
    3. Each split's token stream (its documents in order) is cut into consecutive blocks of exactly `block_size`
       tokens; only the final remainder, fewer than `block_size` tokens, is dropped. The packing map is batched,
       but a block that starts in one batch takes its tail from the next documents, so nothing is lost at batch
       (or `num_proc` shard) edges. `labels` is a copy of `input_ids`: causal LM models shift them.
    4. With `cache_dir`, the result is saved to `cache_dir/lm-<fingerprint>` (the fingerprint covers `texts`, the
       tokenizer, `block_size`, `eval_fraction`, `max_eval_documents` and `seed`) through a temporary directory
       and `os.replace`, and later calls with the same inputs load it instead of tokenising again. Under
       `torch.distributed`, global rank 0 builds it while the other ranks wait, then they load it.

    Args:
        texts: documents, column `"text"` (see [`load_text_corpus`]).
        tokenizer: any tokenizer with an `eos_token`.
        block_size: tokens per block (the sequence length of training).
        eval_fraction: fraction of the documents held out for evaluation (at least one document).
        max_eval_documents: upper bound on the number of eval documents.
        seed: seed of the document split.
        cache_dir: where packed datasets are cached; `None` keeps the result in memory only.
        num_proc: processes for tokenisation and packing (`datasets.map`).

    Returns:
        A `datasets.DatasetDict` with `"train"` and `"eval"`, each with columns `input_ids` and `labels` (int32 lists
        of length `block_size`).
    """
    if block_size < 1:
        raise ValueError(f"block_size must be >= 1, got {block_size}")
    if not 0 < eval_fraction < 1:
        raise ValueError(f"eval_fraction must be in (0, 1), got {eval_fraction}")
    if max_eval_documents is not None and max_eval_documents < 1:
        raise ValueError(f"max_eval_documents must be >= 1 or None, got {max_eval_documents}")
    _require_text_column(texts)
    if len(texts) < 2:
        raise ValueError(f"texts needs at least 2 documents (one for train, one for eval), got {len(texts)}")
    if tokenizer.eos_token_id is None:
        raise ValueError("tokenizer has no eos_token: packing separates documents with it; set tokenizer.eos_token")

    fingerprint = _hash(
        [
            "lm",
            _FORMAT_VERSION,
            texts._fingerprint,
            _tokenizer_fingerprint(tokenizer),
            block_size,
            eval_fraction,
            max_eval_documents,
            seed,
        ]
    )
    build = functools.partial(
        _tokenize_and_pack,
        texts,
        tokenizer,
        block_size=block_size,
        eval_fraction=eval_fraction,
        max_eval_documents=max_eval_documents,
        seed=seed,
        num_proc=num_proc,
        fingerprint=fingerprint,
    )
    if cache_dir is None:
        return build()

    path = os.path.join(cache_dir, f"lm-{fingerprint}")
    with _main_process_first():
        if not os.path.isdir(path):
            lm_datasets = build()
            os.makedirs(cache_dir, exist_ok=True)
            tmp = tempfile.mkdtemp(dir=cache_dir, prefix=f".tmp-lm-{fingerprint}-")
            os.chmod(tmp, 0o755)  # mkdtemp's 0o700 would hide a shared cache from other users
            try:
                lm_datasets.save_to_disk(tmp)
                info = {"fingerprint": fingerprint, "block_size": block_size, "eval_fraction": eval_fraction}
                info |= {"max_eval_documents": max_eval_documents, "seed": seed, **lm_dataset_stats(lm_datasets)}
                with open(os.path.join(tmp, _LM_INFO_FILE), "w") as f:
                    json.dump(info, f, indent=2)
                _replace_dir(tmp, path)
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
    return datasets.load_from_disk(path)


def lm_dataset_stats(lm_datasets: datasets.DatasetDict) -> dict[str, int]:
    """Blocks and tokens per split of a packed dataset, for logs.

    Args:
        lm_datasets: the result of [`build_lm_datasets`].

    Returns:
        `{"block_size", "<split>_blocks", "<split>_tokens"}` for each split (e.g. `train_blocks`, `eval_tokens`).
    """
    stats = {}
    for name, split in lm_datasets.items():
        block_size = len(split[0]["input_ids"]) if len(split) else 0
        stats["block_size"] = max(stats.get("block_size", 0), block_size)
        stats[f"{name}_blocks"] = len(split)
        stats[f"{name}_tokens"] = len(split) * block_size
    return stats


def _tokenize_and_pack(
    texts: datasets.Dataset,
    tokenizer: PreTrainedTokenizerBase,
    *,
    block_size: int,
    eval_fraction: float,
    max_eval_documents: int | None,
    seed: int,
    num_proc: int | None,
    fingerprint: str,
) -> datasets.DatasetDict:
    num_eval = max(1, round(eval_fraction * len(texts)))
    num_eval = min(num_eval, max_eval_documents or num_eval, len(texts) - 1)
    order = np.random.default_rng(seed).permutation(len(texts))
    documents = {"train": np.sort(order[num_eval:]), "eval": np.sort(order[:num_eval])}

    eos = tokenizer.eos_token_id

    def tokenize(batch: list[str]) -> dict[str, list]:
        ids = tokenizer(batch, add_special_tokens=False, return_attention_mask=False, verbose=False)["input_ids"]
        ids = [doc + [eos] for doc in ids]
        return {"input_ids": ids, "num_tokens": [len(doc) for doc in ids]}

    token_features = datasets.Features(
        {"input_ids": datasets.List(datasets.Value("int32")), "num_tokens": datasets.Value("int64")}
    )
    splits = {}
    for name, indices in documents.items():
        docs = texts.select(indices)
        tokenized = docs.map(
            tokenize,
            batched=True,
            batch_size=_MAP_BATCH_SIZE,
            input_columns="text",
            remove_columns=docs.column_names,
            features=token_features,
            num_proc=num_proc,
            new_fingerprint=_hash([fingerprint, name, "tokenize"]),
            desc=f"Tokenising {name} documents",
        )
        splits[name] = _pack(tokenized, block_size, num_proc=num_proc, fingerprint=_hash([fingerprint, name, "pack"]))
        if len(splits[name]) == 0:
            total = int(np.sum(tokenized.data.column("num_tokens").to_numpy()))
            raise ValueError(
                f"The {name} split has {total} tokens ({len(docs)} documents), less than one block of "
                f"block_size={block_size}: lower block_size, or give more documents"
                + (" or a larger eval_fraction/max_eval_documents." if name == "eval" else ".")
            )
    return datasets.DatasetDict(splits)


def _pack(
    tokenized: datasets.Dataset,
    block_size: int,
    *,
    num_proc: int | None,
    fingerprint: str,
    batch_size: int = _MAP_BATCH_SIZE,
) -> datasets.Dataset:
    """Cut the concatenated `input_ids` of `tokenized` into blocks of `block_size` tokens, dropping the final rest.

    Block k covers tokens [k·B, (k+1)·B) of the stream and is emitted by the map batch in which it starts; when it
    runs past the batch's last document, its tail is read from the following rows. Batches (and `num_proc` shards)
    therefore drop nothing, and the result is the stream cut into blocks, exactly.
    """
    offsets = np.concatenate([[0], np.cumsum(tokenized.data.column("num_tokens").to_numpy())])
    num_blocks = int(offsets[-1]) // block_size

    def pack(batch: list[list[int]], indices: list[int]) -> dict[str, list]:
        first, stop_row = indices[0], indices[-1] + 1
        start, end = int(offsets[first]), int(offsets[stop_row])
        first_block = -(-start // block_size)
        stop_block = min(-(-end // block_size), num_blocks)
        if stop_block <= first_block:
            return {"input_ids": [], "labels": []}
        stream = list(chain.from_iterable(batch))
        needed = stop_block * block_size
        if needed > end:
            more_rows = int(np.searchsorted(offsets, needed, side="left"))
            stream.extend(chain.from_iterable(tokenized[stop_row:more_rows]["input_ids"]))
        blocks = [
            stream[k * block_size - start : (k + 1) * block_size - start] for k in range(first_block, stop_block)
        ]
        return {"input_ids": blocks, "labels": [list(block) for block in blocks]}

    block = datasets.List(datasets.Value("int32"), length=block_size)
    return tokenized.map(
        pack,
        batched=True,
        batch_size=batch_size,
        with_indices=True,
        input_columns="input_ids",
        remove_columns=tokenized.column_names,
        features=datasets.Features({"input_ids": block, "labels": block}),
        num_proc=num_proc,
        new_fingerprint=fingerprint,
        desc=f"Packing into blocks of {block_size} tokens",
    )


# --------------------------------------------------------------------------------------------------------------------
# Helpers
# --------------------------------------------------------------------------------------------------------------------


def _hash(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode("utf-8")).hexdigest()[:16]


@contextlib.contextmanager
def _main_process_first() -> Iterator[None]:
    """Under `torch.distributed`, global rank 0 runs the block first and the other ranks after it, finding its cache.

    This is accelerate's `PartialState().main_process_first()` on the default process group. We call the barrier
    ourselves because `PartialState` only sees the group when accelerate's own state was set up for it: created
    first (here) it would fix its options (e.g. `cpu`) before `TrainingArguments` sets them, and on a group set up by
    hand (or by `TrainingArguments` without `use_cpu` on a CPU machine) it reports one process, so every rank would
    build at once. Rank 0 reaches the second barrier even when the block raises, so the other ranks never hang on it.
    """
    if not (dist.is_available() and dist.is_initialized()):
        yield
        return
    if dist.get_rank() != 0:
        dist.barrier()
        yield
        return
    try:
        yield
    finally:
        dist.barrier()


def _replace_dir(tmp: str, path: str) -> None:
    """Move a finished directory into place; if another process got there first, keep theirs (same content)."""
    try:
        os.replace(tmp, path)
    except OSError:
        if not os.path.isdir(path):
            raise


def _publish_files(tmp: str, target: str, *, last: str) -> None:
    """Move the files of `tmp` into `target` one by one (each `os.replace` is atomic), `last` at the end."""
    with contextlib.suppress(FileNotFoundError):
        os.remove(os.path.join(target, last))  # invalidate first: a reader must not pair old files with a new marker
    names = sorted(os.listdir(tmp), key=lambda name: name == last)
    for name in names:
        os.replace(os.path.join(tmp, name), os.path.join(target, name))
