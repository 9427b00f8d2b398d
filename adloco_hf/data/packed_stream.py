"""Streamed training data: documents read from a stream, tokenised and packed on the fly, with an exact position.

The map-style path (`packing.py`) tokenises and packs the whole corpus before training; this one never materialises
the training documents, so a run can read all of C4. Each worker reads its own part of the document stream
(`stream.StreamPart`: by file when there are enough files) and packs it with `build_lm_datasets`' rule: every
document tokenised without special tokens and followed by `eos_token_id`, the token stream cut into consecutive
blocks of exactly `block_size` tokens, `labels` a copy of `input_ids`. The tokens after the last whole block are
carried into the next documents (also across shard and pass edges), so nothing is dropped.

A worker's position is its part's position after the last document it tokenised, plus the carry: the tokens it
tokenised but has not yet emitted. Both are in `state_dict()`, so a resumed run emits the blocks an uninterrupted
one would. The carry cannot live inside a `datasets.map` (datasets does not restore a map function's own state),
which is why packing is done here.

Evaluation stays map-style: [`build_lm_stream`] holds the first `eval_documents` documents of the stream out (by a
hash of their text, since `.skip()` before a split by file would drop the wrong documents) and packs them as
`build_lm_datasets` does.
"""

import glob
import hashlib
import os
from collections.abc import Sequence
from itertools import chain
from typing import Any

import datasets
import numpy as np
import torch
from torch.utils.data import IterableDataset
from transformers import PreTrainedTokenizerBase

from ..sampling.reshard import check_old_states
from ..sampling.stream_parts import STATE_KIND, StreamPart, register_part_kind, worker_stream
from .packing import pack_documents
from .sources import C4_DATASET, builder_for_file, check_text_column, select_text_column
from .tokenizer import document_token_ids, tokenizer_fingerprint


__all__ = ["PackedPart", "PackedStream", "build_lm_stream", "document_key", "load_document_stream"]


PACKED_KIND = "packed"


class PackedStream(IterableDataset):
    """Blocks of `block_size` tokens packed on the fly from a stream of documents; each worker packs its own part.

    Give it to `AdLoCoTrainer` as `train_dataset`: each worker calls `split_by_node(rank, world_size)` and draws
    blocks from the [`PackedPart`] it gets. Iterating the object itself reads the whole stream, pass after pass.

    Args:
        documents: a `datasets.IterableDataset` of documents (see [`load_document_stream`]), or any stream that
            `stream.worker_stream` accepts.
        tokenizer: a tokenizer with an `eos_token` (a fast one tokenises batches in Rust).
        block_size: tokens per block.
        text_column: the column holding the documents.
        tokenize_documents: documents tokenised per call, when the carry holds less than a block.

    Example:
    ```python
    >>> train, eval_blocks = build_lm_stream(load_document_stream("allenai/c4"), tokenizer, block_size=2048,
    ...                                      eval_documents=500)
    >>> part = train.split_by_node(rank=0, world_size=4)
    >>> part.next_example()["input_ids"].shape
    torch.Size([2048])
    ```
    """

    def __init__(
        self,
        documents: Any,
        tokenizer: PreTrainedTokenizerBase,
        *,
        block_size: int,
        text_column: str = "text",
        tokenize_documents: int = 64,
    ):
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        if tokenize_documents < 1:
            raise ValueError(f"tokenize_documents must be >= 1, got {tokenize_documents}")
        if tokenizer.eos_token_id is None:
            raise ValueError(
                "tokenizer has no eos_token: packing separates documents with it; set tokenizer.eos_token"
            )
        self.documents = documents
        self.tokenizer = tokenizer
        self.block_size = block_size
        self.text_column = text_column
        self.tokenize_documents = tokenize_documents

    @property
    def num_shards(self) -> int | None:
        """The document stream's shards (files), where it tells."""
        return getattr(self.documents, "num_shards", None)

    def split_by_node(self, rank: int, world_size: int) -> "PackedPart":
        """Worker `rank`'s blocks: its part of the documents (`stream.worker_stream`), packed."""
        return PackedPart(
            worker_stream(self.documents, rank, world_size),
            self.tokenizer,
            block_size=self.block_size,
            text_column=self.text_column,
            tokenize_documents=self.tokenize_documents,
        )

    def __iter__(self):
        part = self.split_by_node(0, 1)
        while True:
            yield part.next_example()


class PackedPart:
    """One worker's packed blocks: `next_example()`, and `state_dict()` / `load_state_dict()` that resume exactly.

    Args:
        source: the worker's part of the document stream (`next_example`, `state_dict`, `load_state_dict`).
        tokenizer, block_size, text_column, tokenize_documents: see [`PackedStream`].
    """

    def __init__(
        self,
        source: Any,
        tokenizer: PreTrainedTokenizerBase,
        *,
        block_size: int,
        text_column: str = "text",
        tokenize_documents: int = 64,
    ):
        self.source = source
        self.tokenizer = tokenizer
        self.block_size = block_size
        self.text_column = text_column
        self.tokenize_documents = tokenize_documents
        self.blocks = 0
        self._tokens = np.empty(0, dtype=np.int32)
        self._offset = 0  # tokens of `_tokens` already emitted
        self._fingerprint = tokenizer_fingerprint(tokenizer)

    def describe(self) -> str:
        """One line for logs: the documents' layout."""
        describe = getattr(self.source, "describe", None)
        return describe() if describe is not None else type(self.source).__name__

    @property
    def reading_pass(self) -> int | None:
        """The pass over the documents that the last tokenised document belongs to (None: the source does not say)."""
        return getattr(self.source, "reading_pass", None)

    def _read_documents(self) -> None:
        texts = []
        for _ in range(self.tokenize_documents):
            example = self.source.next_example()
            if self.text_column not in example:
                check_text_column(list(example), self.text_column, "the document stream")
            texts.append(example[self.text_column])
        ids = document_token_ids(self.tokenizer, texts)
        eos = [self.tokenizer.eos_token_id]
        new = np.fromiter(chain.from_iterable(chain(doc, eos) for doc in ids), dtype=np.int32)
        self._tokens = np.concatenate([self._tokens[self._offset :], new])
        self._offset = 0

    def next_example(self) -> dict[str, torch.Tensor]:
        """The next block: `{"input_ids", "labels"}`, int64 tensors of `block_size` tokens."""
        while len(self._tokens) - self._offset < self.block_size:
            self._read_documents()
        block = torch.from_numpy(self._tokens[self._offset : self._offset + self.block_size].astype(np.int64))
        self._offset += self.block_size
        self.blocks += 1
        return {"input_ids": block, "labels": block.clone()}

    def state_dict(self) -> dict[str, Any]:
        """The documents' position after the last tokenised document, and the carry of tokens not yet emitted."""
        return {
            "kind": PACKED_KIND,
            "block_size": self.block_size,
            "tokenizer": self._fingerprint,
            "blocks": self.blocks,
            "carry": torch.from_numpy(self._tokens[self._offset :].copy()),
            "source": self.source.state_dict(),
        }

    @staticmethod
    def reshard_states(states: Sequence[dict[str, Any]], world_size: int) -> list[dict[str, Any]]:
        """The states of `world_size` new parts continuing the old parts' `states` (one per old rank, in rank order).

        The documents are re-split by `StreamPart.reshard_states`; old rank `r`'s carry (tokens it tokenised but has
        not emitted) goes to new rank `r % world_size`, after the carries of lower old ranks. So every token an old
        part tokenised is emitted once, and every document of a started pass is read once.
        """
        check_old_states(states, "packed stream", same=("kind", "block_size", "tokenizer"))
        first = states[0]
        sources = [state["source"] for state in states]
        if any(source.get("kind") != STATE_KIND for source in sources):
            raise ValueError(
                "the packed stream's documents are not a datasets stream (a user's stream keeps its own position): "
                "it cannot be re-split over another number of workers; resume with the checkpoint's number of workers"
            )
        resharded = StreamPart.reshard_states(sources, world_size)
        new_states = []
        for rank, source in enumerate(resharded):
            mine = [old for old in range(len(states)) if old % world_size == rank]
            carries = [states[old]["carry"].to(torch.int32) for old in mine]
            new_states.append({
                "kind": PACKED_KIND,
                "block_size": first["block_size"],
                "tokenizer": first["tokenizer"],
                "blocks": sum(int(states[old]["blocks"]) for old in mine),
                "carry": torch.cat(carries) if carries else torch.empty(0, dtype=torch.int32),
                "source": source,
            })  # fmt: skip
        return new_states

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from a `state_dict()` taken with the same block size and tokenizer."""
        for key, mine in (("block_size", self.block_size), ("tokenizer", self._fingerprint)):
            if state[key] != mine:
                raise ValueError(
                    f"the training stream's state was saved with another {key} ({state[key]!r}, this run has "
                    f"{mine!r}): resume with the run's own block_size and tokenizer"
                )
        self.source.load_state_dict(state["source"])
        self._tokens = state["carry"].numpy().astype(np.int32, copy=True)
        self._offset = 0
        self.blocks = int(state["blocks"])


def document_key(text: str) -> str:
    """The identity of a document for holding it out: a hash of its text."""
    return hashlib.sha1(text.encode("utf-8")).hexdigest()


def load_document_stream(
    source: str,
    *,
    data_files: str | list[str] | None = None,
    split: str = "train",
    text_column: str = "text",
) -> datasets.IterableDataset:
    """A `datasets.IterableDataset` of documents, column `"text"` only, one shard per file.

    | source | stream |
    |---|---|
    | `"allenai/c4"` or `"c4"` | C4 "en" from the Hub (1024 shards in "train"); with `data_files`, local JSON-lines files in C4's schema (globs, optionally compressed), in sorted order |
    | a local file or directory | its files, with the builder their extension names (`.json`/`.jsonl`, `.txt`, `.csv`, `.parquet`) |
    | anything else | a Hub dataset id, streamed (`data_files` passed on) |

    Args:
        source: one of the sources above.
        data_files: local files (see the table).
        split: the split to stream (C4: "train" or "validation"; not used with local files).
        text_column: the column holding the documents, renamed to `"text"`.
    """
    if source.startswith("builtin:"):
        raise ValueError(
            f"{source!r} is a built-in corpus, not a stream: train on it without streaming, or write it as JSON-lines "
            "shards (text column) and stream those with data_files"
        )
    if source in (C4_DATASET, "c4"):
        if text_column != "text":
            raise ValueError(f"text_column={text_column!r} does not exist in C4, whose documents are in 'text'")
        if data_files is None:
            stream = datasets.load_dataset(C4_DATASET, "en", split=split, streaming=True)
        else:
            stream = datasets.load_dataset("json", data_files=_expand(data_files), split="train", streaming=True)
    elif os.path.isfile(source) or os.path.isdir(source):
        files = [source] if os.path.isfile(source) else _expand(os.path.join(source, "**"))
        stream = datasets.load_dataset(builder_for_file(files[0]), data_files=files, split="train", streaming=True)
    else:
        kwargs = {"data_files": data_files} if data_files is not None else {}
        stream = datasets.load_dataset(source, split=split, streaming=True, **kwargs)
    stream = select_text_column(stream, text_column, source)
    return stream if text_column == "text" else stream.rename_column(text_column, "text")


def _expand(data_files: str | list[str]) -> list[str]:
    """Every file the patterns name, sorted (the order of the shards); a pattern naming none is an error."""
    patterns = [data_files] if isinstance(data_files, str) else list(data_files)
    files = []
    for pattern in patterns:
        matches = sorted(p for p in glob.glob(pattern, recursive=True) if os.path.isfile(p))
        if not matches:
            raise FileNotFoundError(f"data_files: no file matches {pattern!r}")
        files.extend(matches)
    return sorted(set(files))


def build_lm_stream(
    documents: datasets.IterableDataset,
    tokenizer: PreTrainedTokenizerBase,
    *,
    block_size: int,
    eval_documents: int,
    tokenize_documents: int = 64,
    num_proc: int | None = None,
) -> tuple[PackedStream, datasets.Dataset]:
    """Streamed training blocks, and a map-style eval set from documents held out of them.

    The first `eval_documents` documents of the stream are the eval set, packed as `build_lm_datasets` packs a split
    (columns `input_ids`, `labels`). The training stream leaves out every document whose text is one of theirs
    (`document_key`), whichever worker reads it.

    Args:
        documents: the documents, column `"text"` ([`load_document_stream`]).
        tokenizer: a tokenizer with an `eos_token`.
        block_size: tokens per block.
        eval_documents: documents held out for evaluation (at least 1).
        tokenize_documents: see [`PackedStream`].
        num_proc: processes for packing the eval documents.

    Returns:
        `(train, eval)`: a [`PackedStream`] and a `datasets.Dataset` of blocks.
    """
    if eval_documents < 1:
        raise ValueError(f"eval_documents must be >= 1, got {eval_documents}")
    texts = [example["text"] for example in documents.take(eval_documents + 1)]
    if len(texts) <= eval_documents:
        raise ValueError(
            f"the stream has {len(texts)} documents, not more than eval_documents={eval_documents}: none would be "
            "left for training; lower eval_documents or give more documents"
        )
    texts = texts[:eval_documents]
    eval_blocks = pack_documents(
        datasets.Dataset.from_dict({"text": texts}),
        tokenizer,
        block_size=block_size,
        name="eval",
        num_proc=num_proc,
        hint=" or a larger eval_documents.",
    )
    held_out = frozenset(document_key(text) for text in texts)
    train_documents = documents.filter(lambda example: document_key(example["text"]) not in held_out)
    train = PackedStream(train_documents, tokenizer, block_size=block_size, tokenize_documents=tokenize_documents)
    return train, eval_blocks


register_part_kind(PACKED_KIND, PackedPart)
