"""Tokenise documents and pack them into blocks of `block_size` tokens for causal LM training, with a disk cache."""

import functools
import json
import logging
import os
import shutil
import tempfile
from itertools import chain

import datasets
import numpy as np
import pyarrow as pa
from transformers import PreTrainedTokenizerBase

from ..common.files import replace_directory
from ..common.upstream import fingerprint as dataset_fingerprint
from .cache import FORMAT_VERSION, MAP_BATCH_SIZE, content_hash, main_process_first
from .python_source import SPLIT_COLUMN
from .sources import require_text_column
from .tokenizer import document_token_ids, tokenizer_fingerprint


logger = logging.getLogger(__name__)

_LM_INFO_FILE = "adloco_lm_dataset.json"


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
       corpus order), so no eval block shares a document with a train block. A corpus with a `"split"` column
       (`"train"`/`"eval"`, as `builtin:python-source` has) is split by it instead, and `eval_fraction`,
       `max_eval_documents` and `seed` are not used.
    2. Each document is tokenised without special tokens and followed by `tokenizer.eos_token_id`, so every
       document boundary survives packing (GPT-2's convention).
    3. Each split's token stream (its documents in order) is cut into consecutive blocks of exactly `block_size`
       tokens; only the final remainder, fewer than `block_size` tokens, is dropped. The packing map is batched,
       but a block that starts in one batch takes its tail from the next documents, so nothing is lost at batch
       (or `num_proc` shard) edges. `labels` is a copy of `input_ids`: causal LM models shift them.
    4. With `cache_dir`, the result is saved to `cache_dir/lm-<fingerprint>` through a temporary directory and
       `os.replace`, and later calls with the same inputs load it instead of tokenising again (one log line says
       which folder). The fingerprint is the content's: `texts`' fingerprint, the tokenizer's definition (never the
       path it was loaded from: `cache`, `./cache` and an absolute path share one folder), `block_size`, and for a
       corpus without its own split, `eval_fraction`, `max_eval_documents` and `seed`. Under `torch.distributed`,
       global rank 0 builds it while the other ranks wait, then they load it.

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
    require_text_column(texts)
    if len(texts) < 2:
        raise ValueError(f"texts needs at least 2 documents (one for train, one for eval), got {len(texts)}")
    if tokenizer.eos_token_id is None:
        raise ValueError("tokenizer has no eos_token: packing separates documents with it; set tokenizer.eos_token")

    # A corpus with its own split does not read the split's settings: they stay out of its key.
    own_split = SPLIT_COLUMN in texts.column_names
    split = None if own_split else [eval_fraction, max_eval_documents, seed]
    fingerprint = content_hash(
        ["lm", FORMAT_VERSION, dataset_fingerprint(texts), tokenizer_fingerprint(tokenizer), block_size, split]
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
    with main_process_first():
        if os.path.isdir(path):
            logger.info(
                "tokenised data: reusing %s (the same corpus, tokenizer %s and block_size=%d)",
                path,
                tokenizer.name_or_path,
                block_size,
            )
        else:
            logger.info("tokenised data: tokenising the corpus into blocks of %d tokens, into %s", block_size, path)
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
                replace_directory(tmp, path)
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
    documents = _split_documents(texts, eval_fraction=eval_fraction, max_eval_documents=max_eval_documents, seed=seed)
    splits = {}
    for name, indices in documents.items():
        hint = " or a larger eval_fraction/max_eval_documents." if name == "eval" else "."
        splits[name] = pack_documents(
            texts.select(indices),
            tokenizer,
            block_size=block_size,
            name=name,
            num_proc=num_proc,
            fingerprint=content_hash([fingerprint, name]),
            hint=hint,
        )
    return datasets.DatasetDict(splits)


def pack_documents(
    docs: datasets.Dataset,
    tokenizer: PreTrainedTokenizerBase,
    *,
    block_size: int,
    name: str,
    num_proc: int | None = None,
    fingerprint: str | None = None,
    hint: str = ".",
) -> datasets.Dataset:
    """Tokenise one split's documents (each followed by `eos_token_id`) and cut their token stream into blocks of
    `block_size` tokens (see [`build_lm_datasets`]); the streamed training data packs the same way (`packed_stream.py`).

    Raises:
        ValueError: when the documents hold less than one block (`hint` ends the message with what to change).
    """
    eos = tokenizer.eos_token_id
    fingerprint = fingerprint or content_hash(
        ["pack", FORMAT_VERSION, dataset_fingerprint(docs), tokenizer_fingerprint(tokenizer)]
    )

    def tokenize(batch: pa.Table) -> pa.Table:
        ids = document_token_ids(tokenizer, batch.column("text").to_pylist())
        lengths = np.fromiter((len(doc) + 1 for doc in ids), dtype=np.int64, count=len(ids))
        offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
        tokens = np.fromiter(chain.from_iterable(chain(doc, (eos,)) for doc in ids), dtype=np.int32, count=offsets[-1])
        input_ids = pa.ListArray.from_arrays(pa.array(offsets), pa.array(tokens))
        return pa.table({"input_ids": input_ids, "num_tokens": pa.array(lengths)})

    token_features = datasets.Features(
        {"input_ids": datasets.List(datasets.Value("int32")), "num_tokens": datasets.Value("int64")}
    )
    # Arrow batches in and out: the ids go from the tokenizer to the file through numpy, never as Python lists.
    tokenized = (
        docs.select_columns(["text"])
        .with_format("arrow")
        .map(
            tokenize,
            batched=True,
            batch_size=MAP_BATCH_SIZE,
            remove_columns=["text"],
            features=token_features,
            num_proc=num_proc,
            new_fingerprint=content_hash([fingerprint, "tokenize"]),
            desc=f"Tokenising {name} documents",
        )
        .with_format(None)
    )
    packed = _pack(tokenized, block_size, num_proc=num_proc, fingerprint=content_hash([fingerprint, "pack"]))
    if len(packed) == 0:
        total = int(np.sum(tokenized.data.column("num_tokens").to_numpy()))
        raise ValueError(
            f"The {name} split has {total} tokens ({len(docs)} documents), less than one block of "
            f"block_size={block_size}: lower block_size, or give more documents{hint}"
        )
    return packed


def _split_documents(
    texts: datasets.Dataset, *, eval_fraction: float, max_eval_documents: int | None, seed: int
) -> dict[str, np.ndarray]:
    """Row indices of the train and eval documents, each in corpus order: the corpus's own split when it has a
    `"split"` column (`builtin:python-source`), else a seeded permutation's first `eval_fraction` of the rows."""
    if SPLIT_COLUMN in texts.column_names:
        labels = np.asarray(texts.with_format(None)[SPLIT_COLUMN], dtype=object)
        unknown = sorted(set(labels.tolist()) - {"train", "eval"})
        if unknown:
            raise ValueError(
                f"The {SPLIT_COLUMN!r} column of texts holds {unknown}: only 'train' and 'eval' are known"
            )
        documents = {name: np.flatnonzero(labels == name) for name in ("train", "eval")}
        for name, indices in documents.items():
            if len(indices) == 0:
                raise ValueError(
                    f"texts has no {name} document in its {SPLIT_COLUMN!r} column ({len(texts)} documents): "
                    "take more documents (num_documents) or drop the column to split by eval_fraction"
                )
        return documents
    num_eval = max(1, round(eval_fraction * len(texts)))
    num_eval = min(num_eval, max_eval_documents or num_eval, len(texts) - 1)
    order = np.random.default_rng(seed).permutation(len(texts))
    return {"train": np.sort(order[num_eval:]), "eval": np.sort(order[:num_eval])}


def _pack(
    tokenized: datasets.Dataset,
    block_size: int,
    *,
    num_proc: int | None,
    fingerprint: str,
    batch_size: int = MAP_BATCH_SIZE,
) -> datasets.Dataset:
    """Cut the concatenated `input_ids` of `tokenized` into blocks of `block_size` tokens, dropping the final rest.

    Block k covers tokens [k·B, (k+1)·B) of the stream and is emitted by the map batch in which it starts; when it
    runs past the batch's last document, its tail is read from the following rows. Batches (and `num_proc` shards)
    therefore drop nothing, and the result is the stream cut into blocks, exactly.
    """
    offsets = np.concatenate([[0], np.cumsum(tokenized.data.column("num_tokens").to_numpy())])
    num_blocks = int(offsets[-1]) // block_size

    def tokens_of(rows: pa.Table) -> np.ndarray:
        return rows.column("input_ids").combine_chunks().flatten().to_numpy(zero_copy_only=False)

    def pack(batch: pa.Table, indices: list[int]) -> pa.Table:
        first, stop_row = indices[0], indices[-1] + 1
        start, end = int(offsets[first]), int(offsets[stop_row])
        first_block = -(-start // block_size)
        stop_block = min(-(-end // block_size), num_blocks)
        stream = tokens_of(batch)
        needed = stop_block * block_size
        if stop_block > first_block and needed > end:
            more_rows = int(np.searchsorted(offsets, needed, side="left"))
            stream = np.concatenate([stream, tokens_of(tokenized.data.slice(stop_row, more_rows - stop_row))])
        count = max(stop_block - first_block, 0)
        values = stream[first_block * block_size - start : first_block * block_size - start + count * block_size]
        blocks = pa.FixedSizeListArray.from_arrays(pa.array(values.astype(np.int32, copy=False)), block_size)
        return pa.table({"input_ids": blocks, "labels": blocks})

    block = datasets.List(datasets.Value("int32"), length=block_size)
    return (
        tokenized.with_format("arrow")
        .map(
            pack,
            batched=True,
            batch_size=batch_size,
            with_indices=True,
            remove_columns=tokenized.column_names,
            features=datasets.Features({"input_ids": block, "labels": block}),
            num_proc=num_proc,
            new_fingerprint=fingerprint,
            desc=f"Packing into blocks of {block_size} tokens",
        )
        .with_format(None)
    )
