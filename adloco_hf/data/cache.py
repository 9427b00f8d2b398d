"""What the data stages share to cache their results: fingerprints, and building once under `torch.distributed`."""

import contextlib
import hashlib
import json
from collections.abc import Iterator
from typing import Any

import torch.distributed as dist


# Bump when the corpus, tokenizer or packing recipe changes: it is in every fingerprint, so old caches are ignored.
FORMAT_VERSION = 1
# Documents per batch of `datasets.map` (tokenisation, packing) and of tokenizer training.
MAP_BATCH_SIZE = 1000


def content_hash(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode("utf-8")).hexdigest()[:16]


@contextlib.contextmanager
def main_process_first() -> Iterator[None]:
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
