"""The workers' phase files read as they grow: when each worker's outer steps and merges began and ended.

`recipes/benchmarks/toolkit/worker/kills.py`'s `record_phases` appends `{"attempt", "phase", "edge", "step",
"time"}` to `phases-rank{R}.jsonl` around every outer step (`"outer"`: the pseudo-gradient's all-reduce) and merge
(`"merge"`).
"""

from recipes.benchmarks.toolkit.rank_files import RankFiles


__all__ = ["Phases"]


class Phases:
    """Every worker's phase events, read as they grow: `events` = [(time, rank, attempt, phase, edge, step)]."""

    def __init__(self, probe: str, world_size: int):
        self.probe, self.world_size = probe, world_size
        self.files = RankFiles(probe, "phases", world_size)
        self.events: list[tuple[float, int, int, str, str, int]] = []

    def read(self) -> None:
        for rank, e in self.files.new_records():
            self.events.append((e["time"], rank, e["attempt"], e["phase"], e["edge"], e["step"]))

    def first_begin(self, phase: str, step: int, attempt: int) -> float | None:
        """When the first worker of `attempt` began `phase` at step `step` or later (None: none has yet)."""
        times = [
            t for t, _, a, p, edge, s in self.events if a == attempt and p == phase and edge == "begin" and s >= step
        ]
        return min(times, default=None)

    def span(self, phase: str, step: int, attempt: int) -> tuple[float, float] | None:
        """(first begin, last end) of `phase` at exactly `step` in `attempt` over every worker; None if it never ended
        on some worker that began it."""
        begins = [t for t, _, a, p, e, s in self.events if (a, p, e, s) == (attempt, phase, "begin", step)]
        ends = [t for t, _, a, p, e, s in self.events if (a, p, e, s) == (attempt, phase, "end", step)]
        if not begins or len(ends) < len(begins):
            return None
        return min(begins), max(ends)
