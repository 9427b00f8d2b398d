"""The startup profile: what the goodput rule knows of the device and the link before the first round (pure).

Before issue 51 the goodput rule (`batch/goodput.py`) learnt its step and round costs from the run's own rounds: the
first round ran the initial request with no timing at all, and every later decision read step times that differ
from one run to the next, so two runs of one seed took different batches. The startup profile measures instead,
once, before the first round (`batch/profiling.py`):

- **passes**: a few forward/backward passes of the worker's own model on its own device at several micro-batch sizes
  (at least three, up to the largest the rule can run in one pass): α and β of `batch/throughput.py`'s line
  α + β n, agreed by every rank as the slowest process's seconds (a round waits for it);
- **the link**: an all-reduce over every worker of a small message and of 1/16 of the pseudo-gradient's payload,
  fitted as a ring of 2 (M − 1) steps of `hop_seconds` + bytes / M × `byte_seconds`, so that an instance of any
  size M prices its outer step (`round_seconds`): C(M) = 2 (M − 1) (hop + payload / M × byte);
- one gradient-statistics estimate (two halves of a batch), which sets the first request's noise scale
  (`rounds/first_round.py`); it depends on the data and the weights, so it is not part of the profile below.

The optimizer step and the outer step's local arithmetic are not timed (running them would change the weights): the
profile counts them as 0, a slight underestimate of the fixed costs that errs towards smaller requests. With
`goodput_timing="startup"` (the default) the rule decides from this profile alone for the whole run, so a run is
repeatable from its seed for a given profile: the profile is cached (`batch/profile_cache.py`) and saved in every
checkpoint, so a second run and a resumed run read the same numbers.
"""

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from .throughput import StepTimeModel, ThroughputProfile, fit_pass_seconds


__all__ = ["LinkFit", "StartupProfile", "fit_link", "profile_sizes"]

# The large link probe is this fraction of a worker's pseudo-gradient payload (and at most `MAX_PROBE_BYTES`): enough
# bytes that the bandwidth, not the latency, sets its time; 1/16 of a round's all-reduce in cost.
PROBE_FRACTION = 16
MAX_PROBE_BYTES = 64 * 2**20
SMALL_PROBE_BYTES = 4096


def profile_sizes(smallest: int, largest: int, points: int = 4) -> list[int]:
    """The micro-batch sizes a startup profile times: `points` sizes spaced evenly in log between `smallest` and
    `largest` (both included, rounded, distinct); every size between them when there are three or fewer.

    Example:
    ```python
    >>> profile_sizes(2, 64)
    [2, 6, 20, 64]
    >>> profile_sizes(1, 2)
    [1, 2]
    ```
    """
    largest = max(1, int(largest))
    smallest = min(max(1, int(smallest)), largest)
    if largest - smallest < 3:
        return list(range(smallest, largest + 1))
    ratio = (largest / smallest) ** (1 / (points - 1))
    sizes = {min(largest, max(smallest, round(smallest * ratio**k))) for k in range(points)}
    if len(sizes) < 3:  # rounding merged neighbours
        sizes.add((smallest + largest) // 2)
    return sorted(sizes)


@dataclass(frozen=True)
class LinkFit:
    """A ring all-reduce's cost on the workers' links: each of its 2 (M − 1) steps costs `hop_seconds` plus
    `byte_seconds` per byte of its 1/M of the payload."""

    hop_seconds: float
    byte_seconds: float

    def all_reduce_seconds(self, payload_bytes: float, workers: int) -> float:
        if workers <= 1 or payload_bytes <= 0:
            return 0.0
        return 2 * (workers - 1) * (self.hop_seconds + payload_bytes / workers * self.byte_seconds)

    @property
    def bits_per_second(self) -> float:
        return 8.0 / self.byte_seconds if self.byte_seconds > 0 else math.inf


def fit_link(small: tuple[float, float], large: tuple[float, float], workers: int) -> LinkFit:
    """The ring's costs from two all-reduces over `workers`: `(bytes, seconds)` of a small and a large message. A
    slope that comes out negative (noise) prices every byte at 0 and keeps the mean as latency; an intercept below 0
    goes through 0."""
    if workers <= 1:
        return LinkFit(0.0, 0.0)
    steps = 2 * (workers - 1)
    (b1, t1), (b2, t2) = small, large
    if b2 <= b1:
        raise ValueError(f"the large probe ({b2} bytes) must exceed the small one ({b1} bytes)")
    per_byte = (t2 - t1) / (b2 - b1) * workers / steps
    if per_byte < 0:
        return LinkFit((t1 + t2) / 2 / steps, 0.0)
    hop = t1 / steps - b1 / workers * per_byte
    if hop < 0:
        return LinkFit(0.0, t2 / steps / (b2 / workers))
    return LinkFit(hop, per_byte)


@dataclass(frozen=True)
class StartupProfile:
    """One run's measured step and link costs (module docstring), the same on every rank.

    Attributes:
        passes: `(micro-batch size, seconds of one forward/backward pass)`, the slowest process's, by size.
        link: the ring's costs on the workers' links (None for a run of one worker: no all-reduce).
        payload_bytes: what one worker sends into its instance's all-reduce of pseudo-gradients.
        seconds: what measuring took on this worker's clock (0 when it came from the cache or a checkpoint).
        source: "measured", or where it was read from (a cache file, a checkpoint).
        key: what the measurement depends on (`batch/profile_cache.py`), for the record.
    """

    passes: tuple[tuple[int, float], ...]
    link: LinkFit | None
    payload_bytes: int
    seconds: float = 0.0
    source: str = "measured"
    key: dict = field(default_factory=dict)

    def round_seconds(self, workers: int) -> float:
        """C of an instance of `workers` workers: its all-reduce of pseudo-gradients."""
        return 0.0 if self.link is None else self.link.all_reduce_seconds(self.payload_bytes, workers)

    def pass_fit(self) -> tuple[float, float] | None:
        """(α, β) of the timed passes. The sizes span a wide range, so a slope that comes out negative is noise (a
        machine busy with other work), never a device on which a larger pass is cheaper: the pass is then taken as
        proportional to its samples (α = 0), the reading under which a larger micro-batch is never cheaper per sample,
        not as flat (`fit_pass_seconds`'s choice for close sizes), under which it would be free."""
        points = [(float(n), s) for n, s in self.passes]
        fit = fit_pass_seconds(points)
        if fit is None or len(points) < 2 or fit[1] > 0:
            return fit
        return 0.0, sum(s for _, s in points) / sum(n for n, _ in points)

    def step_model(self, workers: int) -> StepTimeModel | None:
        """The goodput rule's step and round costs for an instance of `workers` workers (ω counts 0: module
        docstring); None without a measured pass."""
        fit = self.pass_fit()
        if fit is None:
            return None
        return StepTimeModel(per_step=0.0, per_pass=fit[0], per_sample=fit[1], per_round=self.round_seconds(workers))

    def throughput_profile(self, workers: int) -> ThroughputProfile:
        """The moving averages a live-measuring instance starts from (`goodput_timing="startup_live"`): each pass
        size at weight 1, the round's cost for `workers` workers, the step's rest unknown."""
        return ThroughputProfile(
            passes=tuple((float(n), s, 1.0) for n, s in self.passes),
            step=(0.0, 0.0),
            round=(self.round_seconds(workers), 1.0),
        )

    def with_origin(self, *, source: str, seconds: float = 0.0) -> "StartupProfile":
        return replace(self, source=source, seconds=seconds)

    def describe(self) -> str:
        """One line: the sizes timed, the fitted pass, the link."""
        fit = self.pass_fit()
        sizes = ", ".join(str(n) for n, _ in self.passes)
        text = f"passes of {sizes} samples"
        if fit is not None:
            text += f" ({fit[0] * 1e3:.3g} ms + {fit[1] * 1e3:.3g} ms a sample)"
        if self.link is not None:
            rate = self.link.bits_per_second
            shown = "unbounded" if math.isinf(rate) else f"{rate / 1e9:.3g} Gbit/s"
            text += f", link {shown} and {self.link.hop_seconds * 1e3:.3g} ms a hop"
        return text

    def to_json(self) -> dict:
        return {
            "passes": [[int(n), float(s)] for n, s in self.passes],
            "link": None if self.link is None else [self.link.hop_seconds, self.link.byte_seconds],
            "payload_bytes": int(self.payload_bytes),
            "seconds": float(self.seconds),
            "source": self.source,
            "key": dict(self.key),
        }

    @classmethod
    def from_json(cls, data: dict) -> "StartupProfile":
        link = data.get("link")
        return cls(
            passes=tuple((int(n), float(s)) for n, s in data["passes"]),
            link=None if link is None else LinkFit(float(link[0]), float(link[1])),
            payload_bytes=int(data["payload_bytes"]),
            seconds=float(data.get("seconds", 0.0)),
            source=str(data.get("source", "measured")),
            key=dict(data.get("key") or {}),
        )

    @staticmethod
    def agreed(rows: Sequence[Sequence[float]]) -> list[float]:
        """Every rank's measured seconds, element by element, as the slowest rank's (a round waits for it)."""
        return [max(values) for values in zip(*rows)]
