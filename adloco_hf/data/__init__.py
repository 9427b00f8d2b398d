"""Data for AdLoCo runs: the built-in offline corpus, C4 streaming, a byte-level BPE tokenizer, and packing.

Every source ends up as a `datasets.Dataset` with a column `"text"`, one document per row; the same code then
splits the documents into train/eval, tokenises them and packs them into blocks of `block_size` tokens
(DESIGN §7). Nothing here downloads anything unless you ask for a Hub dataset or tokenizer by name:

- `builtin:python-docs` ([`BUILTIN_CORPUS`]) is English text every CPython carries (the `pydoc` topics and the
  standard library's docstrings, about 1.7 MB, ~0.4 M tokens), so tests and CI run offline.
- `builtin:python-source` ([`BUILTIN_SOURCE_CORPUS`]) is the source code of the pinned transformers, torch and
  accelerate (`.py`/`.pyi` files and PyTorch's C++ headers: 6,226 files, 109 MB, 31.0 M train tokens with a
  4096-token BPE), identical on every install: the corpus of the demo and benchmarks. It carries its own split by
  file (`"split"` column, ~115 K eval tokens) and tokenizer sample (`"tokenizer_sample"`), and is built once into
  `datasets`' cache (module `python_source`).
- `allenai/c4` streams the first N documents of C4 ("en") and keeps them on disk (`datasets`' own cache), so a second
  run does not stream again. The same code reads local JSON-lines files in C4's schema, which is how it is tested.

One module per stage: `sources` (documents from the built-in corpora, C4, local files or the Hub; the docstrings are
collected by the program `_stdlib_docs.py`, the source files chosen by `python_source`), `tokenizer` (training or loading the tokenizer, fingerprints) and
`packing` (split, tokenise, pack, cache). `_cache` holds what they share: fingerprint hashing and building on global
rank 0 first under `torch.distributed`.

Example:
```python
>>> texts = load_text_corpus(BUILTIN_CORPUS)
>>> tokenizer = load_or_train_tokenizer(None, texts, vocab_size=4096, cache_dir="outputs/cache")
>>> lm = build_lm_datasets(texts, tokenizer, block_size=128, cache_dir="outputs/cache")
>>> lm_dataset_stats(lm)["train_blocks"] > 0
True
```
"""

from .packed_stream import PackedStream, build_lm_stream, load_document_stream
from .packing import build_lm_datasets, lm_dataset_stats
from .python_source import BUILTIN_SOURCE_CORPUS, load_source_corpus
from .sources import BUILTIN_CORPUS, C4_DATASET, load_builtin_corpus, load_c4, load_text_corpus
from .tokenizer import EOS_TOKEN, load_or_train_tokenizer, train_tokenizer


__all__ = [
    "BUILTIN_CORPUS",
    "BUILTIN_SOURCE_CORPUS",
    "C4_DATASET",
    "EOS_TOKEN",
    "PackedStream",
    "build_lm_datasets",
    "build_lm_stream",
    "lm_dataset_stats",
    "load_builtin_corpus",
    "load_c4",
    "load_document_stream",
    "load_or_train_tokenizer",
    "load_source_corpus",
    "load_text_corpus",
    "train_tokenizer",
]
