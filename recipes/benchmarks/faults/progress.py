"""The workers' progress files read as they grow: where each attempt resumed from and every step's time."""

from recipes.benchmarks.toolkit.rank_files import RankFiles


__all__ = ["Progress", "thin_timeline"]


class Progress:
    """The workers' `progress-rank{R}.jsonl` (`toolkit/worker/kills.py`'s ProgressRecorder), read as they grow:
    `starts[attempt][rank]` = the step it resumed from; `steps[attempt][rank]` = [(step, time)]."""

    def __init__(self, probe: str, world_size: int):
        self.probe, self.world_size = probe, world_size
        self.files = RankFiles(probe, "progress", world_size)
        self.starts: dict[int, dict[int, int]] = {}
        self.steps: dict[int, dict[int, list]] = {}

    def read(self) -> None:
        for rank, entry in self.files.new_records():
            if "started_at_step" in entry:
                self.starts.setdefault(entry["attempt"], {})[rank] = entry["started_at_step"]
            else:
                self.steps.setdefault(entry["attempt"], {}).setdefault(rank, []).append((entry["step"], entry["time"]))

    def attempt(self) -> int:
        return max(self.starts, default=0)

    def first_step_time(self, attempt: int) -> float | None:
        times = [t for points in self.steps.get(attempt, {}).values() for _, t in points[:1]]
        return min(times, default=None)

    def reached(self, attempt: int) -> int | None:
        """The furthest step any worker of `attempt` completed (None: none completed one)."""
        steps = [s for points in self.steps.get(attempt, {}).values() for s, _ in points]
        return max(steps, default=None)

    def timeline(self) -> list[tuple[float, int]]:
        """(time, furthest step of its attempt) each time an attempt's furthest worker completed a step: the run's
        progress, falling back to the step resumed from after each restart."""
        points = sorted((t, s, a) for a, ranks in self.steps.items() for p in ranks.values() for s, t in p)
        out, best = [], {}
        for t, s, a in points:
            if s > best.get(a, -1):
                best[a] = s
                out.append((t, s))
        return out


def thin_timeline(points: list[tuple[float, int]], started: float, seconds: float = 1.0) -> list[list[float]]:
    """A timeline for the results file: [seconds since `started`, step], a point at most every `seconds` (a 15-minute
    run completes some 7,500 steps), every fall back to a resumed step and the last point kept."""
    out = []
    for i, (t, step) in enumerate(points):
        if not out or i == len(points) - 1 or step < out[-1][1] or t - started - out[-1][0] >= seconds:
            out.append([round(t - started, 3), step])
    return out
