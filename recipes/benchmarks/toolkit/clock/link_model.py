"""Devices and links: a device profile (step time by micro-batch size) and the time of the message patterns the
virtual clock prices (ring all-reduces, small control collectives)."""

from collections.abc import Sequence
from dataclasses import dataclass, replace


@dataclass(frozen=True)
class Link:
    """Every worker's own link: bandwidth in bits/s each way, latency per message in seconds."""

    bandwidth_bits_per_second: float
    latency_seconds: float = 1e-4
    efficiency: float = 1.0  # payload bytes per byte on the wire (TCP/IP over Ethernet, MTU 1500: 1448/1514)

    def seconds(self, nbytes: float) -> float:
        """Serialisation time of `nbytes` of payload on the link (no latency)."""
        return 8.0 * nbytes / (self.bandwidth_bits_per_second * self.efficiency)


@dataclass(frozen=True)
class DeviceProfile:
    """Step time as a function of the micro-batch size.

    Attributes:
        micro_batch_seconds: {b: seconds of one forward/backward of b sequences}; piecewise linear in between,
            linear beyond the ends (through the two nearest points; through the origin with a single point).
        optimizer_seconds: one optimizer step (clipping, AdamW, zero_grad), once per inner step.
        step_overhead_seconds: other per-step work (data loading, the Trainer's bookkeeping).
        outer_seconds: an outer step's local work (pseudo-gradient, outer SGD, θ ← φ), once per round.
        startup_seconds: fixed time at the start of a run, before the first step.
        statistics_seconds: what a round that measures gradient statistics costs beyond its passes (the hooks'
            norms, the statistics step's bookkeeping), once per round; 0 where it was not measured.
        max_micro_batch: the largest micro-batch that fits the device (None: not stated); the virtual clock's
            runs take it as `max_batch_size`, so switch mode cuts steps as it would there.
    """

    micro_batch_seconds: dict[int, float]
    optimizer_seconds: float = 0.0
    step_overhead_seconds: float = 0.0
    outer_seconds: float = 0.0
    startup_seconds: float = 0.0
    source: str = ""
    statistics_seconds: float = 0.0
    max_micro_batch: int | None = None

    def __post_init__(self):
        if not self.micro_batch_seconds:
            raise ValueError("a device profile needs at least one micro-batch size")
        object.__setattr__(
            self, "micro_batch_seconds", {int(b): float(s) for b, s in sorted(self.micro_batch_seconds.items())}
        )

    def forward_backward_seconds(self, b: int) -> float:
        points = sorted(self.micro_batch_seconds.items())
        if len(points) == 1:
            (b0, s0) = points[0]
            return s0 * b / b0
        if b <= points[0][0]:
            (x0, y0), (x1, y1) = points[0], points[1]
        elif b >= points[-1][0]:
            (x0, y0), (x1, y1) = points[-2], points[-1]
        else:
            (x0, y0), (x1, y1) = next((p, q) for p, q in zip(points, points[1:]) if p[0] <= b <= q[0])
        return max(0.0, y0 + (y1 - y0) * (b - x0) / (x1 - x0))

    def step_seconds(self, chunks: Sequence[int]) -> float:
        """One inner step whose batch runs as these micro-batches, then one optimizer step."""
        return (
            sum(self.forward_backward_seconds(c) for c in chunks) + self.optimizer_seconds + self.step_overhead_seconds
        )

    def scaled(self, factor: float) -> "DeviceProfile":
        """Every compute time × `factor` (the startup time too)."""
        return replace(
            self,
            micro_batch_seconds={b: s * factor for b, s in self.micro_batch_seconds.items()},
            optimizer_seconds=self.optimizer_seconds * factor,
            step_overhead_seconds=self.step_overhead_seconds * factor,
            outer_seconds=self.outer_seconds * factor,
            startup_seconds=self.startup_seconds * factor,
            statistics_seconds=self.statistics_seconds * factor,
            source=f"{self.source} × {factor:.4g}",
        )

    @classmethod
    def from_json(cls, obj: dict, source: str = "") -> "DeviceProfile":
        """From `overhead`'s results.json (its `step_profile`) or a profile dict with the same keys."""
        obj = obj.get("step_profile", obj)
        return cls(
            micro_batch_seconds={int(b): float(s) for b, s in obj["micro_batch_seconds"].items()},
            optimizer_seconds=float(obj.get("optimizer_seconds", 0.0)),
            step_overhead_seconds=float(obj.get("step_overhead_seconds", 0.0)),
            outer_seconds=float(obj.get("outer_seconds", 0.0)),
            startup_seconds=float(obj.get("startup_seconds", 0.0)),
            source=source,
            statistics_seconds=float(obj.get("statistics_seconds", 0.0)),
            max_micro_batch=None if obj.get("max_micro_batch") is None else int(obj["max_micro_batch"]),
        )

    def to_json(self) -> dict:
        return {
            "micro_batch_seconds": {str(b): s for b, s in self.micro_batch_seconds.items()},
            "optimizer_seconds": self.optimizer_seconds,
            "step_overhead_seconds": self.step_overhead_seconds,
            "outer_seconds": self.outer_seconds,
            "startup_seconds": self.startup_seconds,
            "statistics_seconds": self.statistics_seconds,
            "max_micro_batch": self.max_micro_batch,
            "source": self.source,
        }


def _buckets(payload_bytes: float, bucket_bytes: float | None, first_bucket_bytes: float | None = None) -> list:
    if payload_bytes <= 0:
        return []
    sizes, left = [], float(payload_bytes)
    if first_bucket_bytes:
        sizes.append(min(left, first_bucket_bytes))
        left -= sizes[-1]
    while left > 0:
        sizes.append(min(left, bucket_bytes) if bucket_bytes else left)
        left -= sizes[-1]
    return sizes


def ring_all_reduce_seconds(
    payload_bytes: float,
    workers: int,
    link: Link,
    bucket_bytes: float | None = None,
    first_bucket_bytes: float | None = None,
) -> float:
    """Ring all-reduce of `payload_bytes` per worker over `workers` links: per bucket 2 (M − 1) steps, each
    `latency + (bucket / M) / bandwidth` (reduce-scatter, then all-gather); 0 for one worker."""
    if workers <= 1:
        return 0.0
    steps = 2 * (workers - 1)
    return sum(
        steps * (link.latency_seconds + link.seconds(size / workers))
        for size in _buckets(payload_bytes, bucket_bytes, first_bucket_bytes)
    )


def control_seconds(workers: int, link: Link, collectives: int = 2) -> float:
    """Small collectives over all workers (a barrier, an all-gather of a few numbers): (W − 1) latencies each."""
    return collectives * max(workers - 1, 0) * link.latency_seconds
