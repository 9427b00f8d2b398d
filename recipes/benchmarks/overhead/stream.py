"""The streamed data of `--compare streaming` and `loader_processes`: the corpus's train documents as JSON-lines
shards in C4's schema, read through `pretrain_c4.py --streaming`'s path (`load_document_stream` → `build_lm_stream`
→ `PackedStream`), and the stream's own throughput without training."""

import json
import os
import time

from adloco_hf.data import build_lm_stream, load_document_stream, load_text_corpus
from adloco_hf.inspection import SPLIT_COLUMN


__all__ = ["EVAL_DOCUMENTS", "NUM_SHARDS", "stream_throughput", "streamed_dataset", "write_shards"]

NUM_SHARDS = 16
EVAL_DOCUMENTS = 16


def write_shards(texts, cache_dir: str, num_shards: int = NUM_SHARDS) -> list[str]:
    """The train documents of `texts` (corpus order) as `num_shards` JSON-lines files in C4's schema, contiguous
    slices of about equal size; cached under a fingerprint of the corpus."""
    train = texts
    if SPLIT_COLUMN in texts.column_names:
        train = texts.filter(lambda split: split == "train", input_columns=SPLIT_COLUMN)
    folder = os.path.join(cache_dir, f"streaming-shards-{train._fingerprint[:16]}-{num_shards}")
    files = [os.path.join(folder, f"c4-train.{i:05d}-of-{num_shards:05d}.json") for i in range(num_shards)]
    if all(os.path.isfile(f) for f in files):
        return files
    tmp = folder + ".tmp"
    os.makedirs(tmp, exist_ok=True)
    bounds = [round(i * len(train) / num_shards) for i in range(num_shards + 1)]
    for i, path in enumerate(files):
        with open(os.path.join(tmp, os.path.basename(path)), "w", encoding="utf-8") as f:
            for row, text in enumerate(train[bounds[i] : bounds[i + 1]]["text"]):
                f.write(json.dumps({"text": text, "timestamp": "", "url": f"doc-{bounds[i] + row}"}) + "\n")
    os.replace(tmp, folder)
    return files


def streamed_dataset(settings: dict, tokenizer):
    """The settings' corpus streamed from its shards, `EVAL_DOCUMENTS` held out, `tokenize_documents` documents
    tokenised whenever the carry holds less than a block."""
    files = write_shards(load_text_corpus(settings["data"]["corpus"]), settings["cache_dir"])
    streamed, _ = build_lm_stream(
        load_document_stream("allenai/c4", data_files=files),
        tokenizer,
        block_size=settings["block_size"],
        eval_documents=EVAL_DOCUMENTS,
        tokenize_documents=settings["tokenize_documents"],
    )
    return streamed


def stream_throughput(train, settings: dict, blocks: int) -> float:
    """Tokens/s of drawing blocks from a fresh part of the training stream, nothing else."""
    part = train.split_by_node(0, 1)
    part.next_example()  # opens the first file
    start = time.perf_counter()
    for _ in range(blocks):
        part.next_example()
    return blocks * settings["block_size"] / (time.perf_counter() - start)
