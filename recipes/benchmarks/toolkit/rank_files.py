"""Per-rank JSON-lines files that the workers append to while a benchmark watches them (`progress-rank{R}.jsonl`,
`phases-rank{R}.jsonl`): each read returns only the whole lines written since the last one."""

import json
import os
from collections.abc import Iterator


__all__ = ["RankFiles"]


class RankFiles:
    """`{prefix}-rank{R}.jsonl` in `folder` for ranks 0 to `world_size - 1`, read as they grow."""

    def __init__(self, folder: str, prefix: str, world_size: int):
        self.folder, self.prefix, self.world_size = folder, prefix, world_size
        self.offsets: dict[str, int] = {}

    def new_records(self) -> Iterator[tuple[int, dict]]:
        """(rank, record) for every line written since the last call; a file not there yet is skipped."""
        for rank in range(self.world_size):
            path = os.path.join(self.folder, f"{self.prefix}-rank{rank}.jsonl")
            if not os.path.exists(path):
                continue
            with open(path, encoding="utf-8") as f:
                f.seek(self.offsets.get(path, 0))
                while (line := f.readline()).endswith("\n"):  # a line still being written waits for the next read
                    self.offsets[path] = f.tell()
                    yield rank, json.loads(line)
