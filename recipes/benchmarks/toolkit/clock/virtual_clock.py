"""A virtual clock for the benchmark worker (`--clock virtual`): every inner step priced by a device profile, every
round's outer step and merge by a link model, so that a run takes the time (and the goodput rule the decisions) it
would on that device and link, whatever machine trains it.

The library times a worker through its `Clock` (`adloco_hf.inspection.Clock`, the documented hook) and announces the
work between two readings: an inner step's passes (`passes(chunk_sizes)`), the step's rest (`step_rest()`), the
round's outer step (`outer_step(workers=, payload_bytes=)`) and a merge (`merge(sent_bytes=)`). `VirtualClock` adds
the prices in those announcements:

- a pass of n samples: the profile's `forward_backward_seconds(n)`; the step's rest: its optimizer and other per-step
  seconds (`link_model.DeviceProfile`);
- the outer step: the profile's local work (`outer_seconds`; plus `statistics_seconds` in a run that measures gradient
  statistics: what the statistics step costs beyond its passes), the ring all-reduce of the payload the round really
  sent among the instance's workers (`ring_all_reduce_seconds`: 2 (M − 1) hops of latency + payload / M each; one
  bucket), and the round end's two small collectives over all workers (`control_seconds`);
- the startup profile's probe of the links (`all_reduce(workers=, payload_bytes=)`): the ring all-reduce alone;
- a merge: the busiest rank's sent bytes on its link, plus one latency: a lower bound of the merge's link time (a
  hand-off that an all-reduce then waits for takes up to about twice it; docs/results.md, issue 25).

Evaluations, checkpoints and the final merge announce nothing: they cost no virtual time.

The bytes are priced as the profile's model would send them: a run's model stands for the profile's (its samples
cost the profile's seconds), so its payloads and merges are scaled by `bytes_scale`, the profile's parameters over
the run's (`clock_from_spec`; 1 where the profile is of the run's own model, as on the links testbed). Without it a
tiny model's 2.6 MB payload against a 300M model's step times would price a 100 Mbit/s link as a 10 Gbit/s one is
for that model.

One clock prices several links at once (`links`): each keeps its own seconds, so a run whose decisions do not read
the clock (no goodput rule, no split by speed) gives the time it takes over every bandwidth of a study from one
training run; `now()` reads the first link's, which is the one the library's decisions follow. Workers of
different instances take different batches, and the round end waits for the slowest: the worker's `VirtualRounds`
callback sets every worker's seconds to the largest of them after each round (`align`). Sums are taken in the
same order on every run, so a seed's virtual seconds repeat to the last bit.
"""

from collections.abc import Sequence

from adloco_hf.inspection import Clock
from recipes.benchmarks.toolkit.clock.link_model import DeviceProfile, Link, control_seconds, ring_all_reduce_seconds


__all__ = ["VirtualClock", "bytes_scale", "clock_from_spec"]


class VirtualClock(Clock):
    """A worker's clock priced by `profile` and `links` (module docstring).

    Args:
        profile: the device's step and round costs.
        links: the links priced side by side (each worker's own link to a non-blocking switch).
        world: the workers of the run (the round end's collectives span them all).
        statistics: whether the run measures gradient statistics (`batch_size_test` other than `"none"`): each round
            then costs the profile's `statistics_seconds` too.
        bytes_scale: the factor on every announced byte count (module docstring).
    """

    def __init__(
        self,
        profile: DeviceProfile,
        links: Sequence[Link],
        *,
        world: int,
        statistics: bool,
        bytes_scale: float = 1.0,
    ):
        super().__init__()
        if not links:
            raise ValueError("a virtual clock prices at least one link")
        if not bytes_scale > 0:
            raise ValueError(f"bytes_scale must be positive, got {bytes_scale}")
        self.profile, self.links, self.world, self.statistics = profile, tuple(links), world, statistics
        self.bytes_scale = bytes_scale
        self.seconds = [0.0] * len(self.links)
        self.compute_seconds = 0.0  # the device's share (the same on every link), for the record

    def now(self) -> float:
        return self.seconds[0]

    def _add(self, seconds: float) -> None:
        self.seconds = [s + seconds for s in self.seconds]

    def passes(self, chunk_sizes: tuple[int, ...]) -> None:
        seconds = sum(self.profile.forward_backward_seconds(n) for n in chunk_sizes)
        self.compute_seconds += seconds
        self._add(seconds)

    def step_rest(self) -> None:
        seconds = self.profile.optimizer_seconds + self.profile.step_overhead_seconds
        self.compute_seconds += seconds
        self._add(seconds)

    def outer_step(self, *, round_number: int, workers: int, payload_bytes: int) -> None:
        local = self.profile.outer_seconds + (self.profile.statistics_seconds if self.statistics else 0.0)
        self.compute_seconds += local
        payload_bytes = payload_bytes * self.bytes_scale
        self.seconds = [
            s + local + ring_all_reduce_seconds(payload_bytes, workers, link) + control_seconds(self.world, link)
            for s, link in zip(self.seconds, self.links)
        ]

    def all_reduce(self, *, workers: int, payload_bytes: int) -> None:
        payload_bytes = payload_bytes * self.bytes_scale
        self.seconds = [
            s + ring_all_reduce_seconds(payload_bytes, workers, link) for s, link in zip(self.seconds, self.links)
        ]

    def merge(self, *, round_number: int, sent_bytes: tuple[int, ...]) -> None:
        busiest = max(sent_bytes, default=0) * self.bytes_scale
        if busiest > 0:
            self.seconds = [
                s + link.latency_seconds + link.seconds(busiest) for s, link in zip(self.seconds, self.links)
            ]

    def align(self, seconds: Sequence[float]) -> None:
        """The round end waits for the slowest worker: every link's seconds become at least `seconds`'."""
        self.seconds = [max(mine, float(theirs)) for mine, theirs in zip(self.seconds, seconds)]


def bytes_scale(clock: dict, parameters: int) -> float:
    """The profile's parameters over the run's `parameters`; 1 where the profile does not name its model's size or
    the clock prices the bytes a testbed's links really carry (`"scale_bytes": false`, `links --clock virtual`)."""
    theirs = clock["profile"].get("parameters")
    return 1.0 if not theirs or clock.get("scale_bytes") is False else theirs / parameters


def clock_from_spec(clock: dict, *, world: int, statistics: bool, parameters: int) -> VirtualClock:
    """The virtual clock of a spec's `clock` entry: `{"profile": DeviceProfile JSON, "bandwidths": [bits/s, ...],
    "latency": seconds, "efficiency": payload share}`, the first bandwidth the one `now()` reads
    (`settings.virtual_clock_settings` writes it); `parameters` the run's model's, whose bytes are priced as the
    profile's model's (`bytes_scale`)."""
    profile = DeviceProfile.from_json(clock["profile"], source=clock["profile"].get("source", ""))
    links = [Link(bits, clock["latency"], clock.get("efficiency", 1.0)) for bits in clock["bandwidths"]]
    scale = bytes_scale(clock, parameters)
    return VirtualClock(profile, links, world=world, statistics=statistics, bytes_scale=scale)
