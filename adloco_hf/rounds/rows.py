"""The rows a round's end reads and writes: `WorkerReport`, one worker's row of the round-end all-gather, and
`RoundLine`, one instance's line of `adloco_rounds.jsonl` (DESIGN §4)."""

import math
from dataclasses import asdict, dataclass, field
from typing import Any

from ..batch.size_tests import GradientStatistics
from ..batch.throughput import RoundTiming


__all__ = ["RoundLine", "WorkerReport"]


@dataclass(frozen=True)
class WorkerReport:
    """What one worker tells every other at the end of a round (one row of the round-end all-gather)."""

    instance: int
    stats: GradientStatistics
    loss_sum: float
    loss_steps: int
    samples: int
    tokens: float
    pseudo_grad_norm: float
    payload_bytes: int
    comm_seconds: float
    outer_seconds: float
    skipped: bool
    preempt: bool = False  # this worker got SIGTERM/SIGINT, or agreed to stop at this round's end
    local_sq_norm: float = math.nan  # ‖Δ_w‖² of this worker's own pseudo-gradient (nan: not measured)
    step_seconds: float = 0.0  # the round's inner steps on this process, from each step's start to its end
    # This process's step timings this round (batch_size_target="goodput" only; zeros: not measured).
    timing: RoundTiming = field(default_factory=RoundTiming)

    _SCALARS = (
        "loss_sum",
        "loss_steps",
        "samples",
        "tokens",
        "pseudo_grad_norm",
        "payload_bytes",
        "comm_seconds",
        "outer_seconds",
        "skipped",
        "preempt",
        "local_sq_norm",
        "step_seconds",
    )

    def to_row(self) -> list[float]:
        """The flat row of floats the all-gather carries."""
        scalars = (float(getattr(self, k)) for k in self._SCALARS)
        return [float(self.instance), *self.stats.as_list(), *scalars, *self.timing.as_list()]

    @classmethod
    def from_row(cls, row: list[float]) -> "WorkerReport":
        width = len(GradientStatistics.FIELDS)
        stats = GradientStatistics.from_list(row[1 : 1 + width])
        end = 1 + width + len(cls._SCALARS)
        values = dict(zip(cls._SCALARS, row[1 + width : end]))
        return cls(
            instance=int(row[0]),
            stats=stats,
            loss_sum=values["loss_sum"],
            loss_steps=int(values["loss_steps"]),
            samples=int(values["samples"]),
            tokens=values["tokens"],
            pseudo_grad_norm=values["pseudo_grad_norm"],
            payload_bytes=int(values["payload_bytes"]),
            comm_seconds=values["comm_seconds"],
            outer_seconds=values["outer_seconds"],
            skipped=bool(values["skipped"]),
            preempt=bool(values["preempt"]),
            local_sq_norm=values["local_sq_norm"],
            step_seconds=values["step_seconds"],
            timing=RoundTiming.from_list(row[end:]),
        )


@dataclass(frozen=True)
class RoundLine:
    """One line of `adloco_rounds.jsonl`: one instance in one round (the DESIGN §4 keys and a few more), built once
    by `rounds.decision.decide_round` and finished by `rounds.decision.finish_lines` (never changed in place)."""

    outer_step: int
    global_step: int
    instance: int
    workers: list[int]
    batch_size: int
    next_batch_size: int
    micro_batch_size: int
    accumulation_steps: int
    lr_factor: float
    samples: int
    tokens: int
    train_loss: float
    grad_variance: float
    grad_sq_norm: float
    grad_ip_variance: float
    grad_orth_variance: float
    stats_dof: float
    pseudo_grad_norm: float
    comm_bytes: int
    comm_seconds: float
    outer_seconds: float
    merged_from: list[int] = field(default_factory=list)
    merged_into: int | None = None  # the survivor this instance merged into at the round's end (None: it goes on)
    # The request the batch-size rule asked for the next round where the round's merge then planned another (the
    # survivor's request under `merge_batch_rule`, in `next_batch_size`); None (left out): the two agree.
    asked_batch_size: int | None = None
    skipped: bool = False
    skipped_in_a_row: int = 0  # this round included, while it is skipped
    merge_bytes: int | None = None  # the merge's bytes, on the survivor's line only
    merge_seconds: float = 0.0
    noise_scale: float | None = None  # tr Σ / ‖∇F‖² from the controller's averages (None while ‖∇F‖² ≤ 0)
    inner_steps: int = 0  # the inner steps this round ran (H; the first round after H doubled may run fewer)
    outer_noise: float | None = None  # the workers' pseudo-gradients' variance / (M ‖Δ̄‖²) (None: one worker, overlap)
    num_instances: int = 0
    total_tokens: int = 0
    elapsed_seconds: float = 0.0
    # batch_size_target="goodput" (left out of the file otherwise): the predicted goodput (samples per second at the
    # initial batch's worth, `batch/goodput.py`) of `next_batch_size` and of keeping `batch_size`, and the step-time
    # model they come from, [ω, α, β, C]: seconds per step outside forward/backward, per pass, per sample of a pass,
    # and of the round's outer step. None while the rule has no noise scale or no timing yet.
    goodput: float | None = None
    goodput_kept: float | None = None
    step_model: list[float] | None = None
    # G > 1 only (left out of the file for G = 1): the processes of each worker; `micro_batch_size` is a process's.
    processes_per_worker: int = 1
    processes: list[int] | None = None
    # G > 1: the bytes each local rank of a worker contributes to the all-reduce between workers (its slice of the
    # pseudo-gradient, about 1/G of the payload each: a node's G links share the traffic); `comm_bytes` is their
    # ring total.
    process_payload_bytes: list[int] | None = None
    # Each worker of `workers` (same order): the samples it trained per inner step this round (the request's, or its
    # share with worker_batch_split="speed"), and its seconds per sample over the round's inner steps (None: not
    # measured), the speed the next split follows.
    worker_batch_sizes: list[int] = field(default_factory=list)
    worker_sample_seconds: list[float | None] = field(default_factory=list)

    @property
    def batch_size_used(self) -> int:
        """Samples each worker of the instance used per inner step this round: the request `batch_size`, or
        `max_batch_size` (of each of its G processes) where switch mode capped it (a request above it but within
        `switch_threshold` × it)."""
        return self.batch_size if self.accumulation_steps > 1 else self.processes_per_worker * self.micro_batch_size

    def to_json(self) -> dict[str, Any]:
        line = asdict(self)
        line["batch_size_used"] = self.batch_size_used  # what ran, next to the request (`batch_size`)
        for key in ("merge_bytes", "merged_into", "asked_batch_size", "goodput", "goodput_kept", "step_model"):
            if line[key] is None:
                del line[key]
        if self.processes_per_worker == 1:
            del line["processes_per_worker"], line["processes"], line["process_payload_bytes"]
        return line
