"""A wall-clock model: how long a run takes on a given device and link, and how long to a target perplexity.

A run's AdLoCo rounds file (`adloco_rounds.jsonl`, read with `adloco_hf.run_log`) says, per round and instance,
which workers trained, with which batch (and switch mode's plan: micro-batch and accumulation steps), for how many
inner steps, and which instances merged. Replayed here with

- a **device profile**: seconds of one forward/backward of b sequences (piecewise linear between the measured
  micro-batch sizes, linear beyond), of the optimizer step, of other per-step work and of an outer step's local
  work. Measured by `overhead.py --step_profile ...` (its `step_profile`), or given as JSON / on the command line.
  A step of a batch above the device's micro-batch limit runs as several micro-batches (switch mode's
  accumulation: the plan logged by the run, or `--device_max_micro_batch` for another device); the statistics step
  at a round's end runs as two halves when the run measured gradient statistics and did not accumulate;
- a **link**: bandwidth (bits/s) and latency (s) of every worker's own full-duplex link to a non-blocking switch.

Communication, modelled as the library sends it:

- ring all-reduce over M workers: 2 (M − 1) steps, each `latency + (payload / M) / bandwidth`, once per bucket
  (the outer step all-reduces in buckets of 2^25 elements; DDP's gradient buckets are 1 MiB, then 25 MiB).
  Instances all-reduce concurrently over disjoint workers, hence disjoint links: they do not slow each other down,
  and the round waits for the slowest instance;
- a merge: `plan_transfers` (adloco_hf.instances), the library's own message list: blocking point-to-point sends,
  each rank in the global order, each message `latency + bytes / bandwidth` per tensor (φ and the outer momentum in
  fp32; the inner AdamW state, two fp32 moments, to a worker that joins an instance); messages between disjoint
  pairs of ranks overlap, as they do with blocking sends;
- the final merge: each surviving instance's first worker sends φ (fp32) to rank 0 in turn, which broadcasts the
  result; the broadcast at the start (the initial weights, fp32, from rank 0): gloo's broadcast sends from the root
  to each rank over the root's link (`one_to_all`), NCCL's is pipelined (`pipelined`);
- control messages per round (the round-end barrier and the reports' all-gather): (W − 1) latencies each;
- DDP: one fp32 gradient all-reduce per step, after the backward (`--ddp_overlap 0`, the default) or overlapped
  with a fraction of the forward/backward time.

Per round: compute, communication and wall seconds; in total the same, and, given the run's eval curve (its
`result.json` from `_convergence_worker.py`, or `--curve`), the time to reach each `--targets` perplexity (tokens
to the target interpolated on the curve in log-perplexity, then the time at those tokens within the replay).

Validation (`--validate`) against `links.py`'s runs over rate-limited links: per method and bandwidth, predicted
against measured wall seconds (and the seconds at which each run reached links.py's target perplexities, at the
measured tokens). The device profile must not come from the run being predicted: either a step profile measured
under the same CPU contention (`overhead.py --step_profile ... --step_profile_processes 4`: 4 processes with one
thread each on the 2 cores, as the 4 workers of a launch are; a profile from one process alone would be about twice
too fast), or `--calibrate highest`: each method's compute time scaled so that its run at the highest bandwidth
(communication small) is matched; that run is then reported as `calibration`, not as a prediction. The bytes
links.py counts on the wire include Ethernet/IP/TCP headers and ACKs: `--efficiency 0.95` (the payload share of a
tbf-limited veth link measured in DESIGN §9: 12.5 MB in 1.05 s at 100 Mbit/s) applies that to the bandwidth.

The 1B/H100 scenario (`--scenario 1b-h100`): time to target for DDP, DiLoCo and AdLoCo at 0.1 to 100 Gbit/s, with
every assumption printed and stored.

    # from the repository root
    # the device profile: 4 processes on the cores, as 4 workers; the Trainer's step at batch 4 for its overhead
    python -m recipes.benchmarks.overhead --step_profile 1 2 3 4 5 6 7 8 10 12 16 --step_profile_processes 4 \\
        --step_profile_trainer_batch 4 --step_profile_only --output_dir outputs/benchmarks/wallclock/profile_4proc
    # one run, replayed over 100 Mbit/s links, with the time to two perplexities
    python -m recipes.benchmarks.wallclock --run outputs/benchmarks/convergence/adloco \\
        --profile outputs/benchmarks/wallclock/profile_4proc/results.json --bandwidth 1e8 --targets 700 600
    # against links.py's measurements, with the profile alone, then calibrated on the highest bandwidth
    python -m recipes.benchmarks.wallclock --validate outputs/benchmarks/links/results.json --efficiency 0.95 \\
        --profile outputs/benchmarks/wallclock/profile_4proc/results.json
    python -m recipes.benchmarks.wallclock --validate outputs/benchmarks/links/results.json --efficiency 0.95 \\
        --profile outputs/benchmarks/wallclock/profile_4proc/results.json --calibrate highest
    python -m recipes.benchmarks.wallclock --scenario 1b-h100 --convergence outputs/benchmarks/convergence/results.json

Outputs in `--output_dir` (default `outputs/benchmarks/wallclock`): `replay.json` (per round and total),
`validation.json` and `validation.md`, `scenario/results.json`, `scenario/table.md` and `scenario/time_to_target.png`.
"""

import argparse
import json
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from adloco_hf.instances import Instance, MergePlan, plan_merge, plan_transfers
from adloco_hf.outer import BUCKET_NUMEL
from adloco_hf.run_log import group_by_round, load_rounds
from adloco_hf.switch_mode import plan_batch, split_sizes
from recipes.benchmarks._common import REPO, human_bytes, ratio, table, write_json


__all__ = [
    "DeviceProfile",
    "Link",
    "broadcast_seconds",
    "ddp_step_seconds",
    "merge_messages",
    "micro_batches",
    "replay_adloco",
    "replay_ddp",
    "ring_all_reduce_seconds",
    "seconds_at_tokens",
    "sequential_messages_seconds",
    "tokens_to_target",
    "transfer_seconds",
    "validate",
]

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
OUTER_BUCKET_NUMEL = BUCKET_NUMEL  # elements per bucket of the outer step's all-reduce
DDP_BUCKET_BYTES = 25 * 2**20  # torch DDP's bucket_cap_mb
DDP_FIRST_BUCKET_BYTES = 2**20  # torch DDP's first bucket (dist._DEFAULT_FIRST_BUCKET_BYTES)


# ---------------------------------------------------------------- device and link
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
    """

    micro_batch_seconds: dict[int, float]
    optimizer_seconds: float = 0.0
    step_overhead_seconds: float = 0.0
    outer_seconds: float = 0.0
    startup_seconds: float = 0.0
    source: str = ""

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
            source=f"{self.source} × {factor:.4g}",
        )

    @classmethod
    def from_json(cls, obj: dict, source: str = "") -> "DeviceProfile":
        """From `overhead.py`'s results.json (its `step_profile`) or a profile dict with the same keys."""
        obj = obj.get("step_profile", obj)
        return cls(
            micro_batch_seconds={int(b): float(s) for b, s in obj["micro_batch_seconds"].items()},
            optimizer_seconds=float(obj.get("optimizer_seconds", 0.0)),
            step_overhead_seconds=float(obj.get("step_overhead_seconds", 0.0)),
            outer_seconds=float(obj.get("outer_seconds", 0.0)),
            startup_seconds=float(obj.get("startup_seconds", 0.0)),
            source=source,
        )

    def to_json(self) -> dict:
        return {
            "micro_batch_seconds": {str(b): s for b, s in self.micro_batch_seconds.items()},
            "optimizer_seconds": self.optimizer_seconds,
            "step_overhead_seconds": self.step_overhead_seconds,
            "outer_seconds": self.outer_seconds,
            "startup_seconds": self.startup_seconds,
            "source": self.source,
        }


# ---------------------------------------------------------------- communication
def transfer_seconds(nbytes: float, link: Link) -> float:
    """One point-to-point message: latency + bytes / bandwidth."""
    return link.latency_seconds + link.seconds(nbytes)


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


def broadcast_seconds(nbytes: float, workers: int, link: Link, algorithm: str = "one_to_all") -> float:
    """`nbytes` from one rank to the `workers` − 1 others: over the root's link one copy after the other
    (`one_to_all`, gloo), or pipelined along a chain (`pipelined`, NCCL: bytes once, plus a latency per hop)."""
    if workers <= 1 or nbytes <= 0:
        return 0.0
    if algorithm == "one_to_all":
        return link.latency_seconds + (workers - 1) * link.seconds(nbytes)
    if algorithm == "pipelined":
        return (workers - 1) * link.latency_seconds + link.seconds(nbytes)
    raise ValueError(f"unknown broadcast algorithm {algorithm!r}")


def control_seconds(workers: int, link: Link, collectives: int = 2) -> float:
    """Small collectives over all workers (a barrier, an all-gather of a few numbers): (W − 1) latencies each."""
    return collectives * max(workers - 1, 0) * link.latency_seconds


def sequential_messages_seconds(messages: Sequence[tuple[int, int, Sequence[float]]], link: Link) -> float:
    """Blocking point-to-point messages `(src, dst, [tensor bytes, ...])`, every rank taking its part in this order.

    A message starts once both its ends are free and keeps both busy until its last tensor has arrived (one latency
    per tensor); messages between disjoint ranks overlap. Returns the time until the last one ends.
    """
    free: dict[int, float] = {}
    end = 0.0
    for src, dst, tensors in messages:
        start = max(free.get(src, 0.0), free.get(dst, 0.0))
        finish = start + sum(transfer_seconds(b, link) for b in tensors)
        free[src] = free[dst] = finish
        end = max(end, finish)
    return end


def merge_messages(
    plan: MergePlan, *, numel: int, with_momentum: bool, inner_state_bytes: float, save: bool = False
) -> list[tuple[str, int, int, list[float]]]:
    """The messages of a merge as `merging.execute_merge` sends them: `(kind, src, dst, [tensor bytes])`.

    `merge_input` and `global`: φ (fp32) and, with outer momentum, the momentum (fp32), two sends; `inner`: the inner
    optimizer's state dict (its length, then its bytes); `save`: the merged φ to the writing rank.
    """
    phi = 4.0 * numel
    out = []
    for t in plan_transfers(plan, writer_rank=0, save=save):
        if t.kind in ("merge_input", "global"):
            tensors = [phi, phi] if with_momentum else [phi]
        elif t.kind == "inner":
            tensors = [8.0, inner_state_bytes]
        else:
            tensors = [phi]
        out.append((t.kind, t.src, t.dst, tensors))
    return out


# ---------------------------------------------------------------- compute
def micro_batches(batch: int, accumulation_steps: int = 1, device_max_micro_batch: int | None = None) -> list[int]:
    """The micro-batches one inner step of `batch` samples runs as: switch mode's `accumulation_steps` chunks, or,
    for a device that holds at most `device_max_micro_batch` sequences at once, ⌈batch / max⌉ chunks."""
    parts = max(1, accumulation_steps)
    if device_max_micro_batch is not None:
        parts = max(1, math.ceil(batch / device_max_micro_batch))
    return split_sizes(batch, min(parts, batch))


def _batch_used(line: dict) -> int:
    """What each worker ran per step (`RoundLine.batch_size_used`)."""
    return line["batch_size"] if line["accumulation_steps"] > 1 else line["micro_batch_size"]


def instance_compute_seconds(
    line: dict,
    steps: int,
    profile: DeviceProfile,
    *,
    statistics_step: bool,
    device_max_micro_batch: int | None = None,
) -> float:
    """One instance's `steps` inner steps of a round. The last one measures gradient statistics when
    `statistics_step`: without accumulation it runs as two halves (`switch_mode.plan_step`)."""
    if steps <= 0:
        return 0.0
    batch = _batch_used(line)
    chunks = micro_batches(batch, line["accumulation_steps"], device_max_micro_batch)
    total = steps * profile.step_seconds(chunks)
    if statistics_step and len(chunks) == 1 and batch >= 2:
        total += profile.step_seconds(split_sizes(batch, 2)) - profile.step_seconds(chunks)
    return total


def ddp_step_seconds(
    batch: int,
    workers: int,
    numel: int,
    profile: DeviceProfile,
    link: Link,
    *,
    grad_bytes: int = 4,
    overlap: float = 0.0,
    device_max_micro_batch: int | None = None,
) -> dict[str, float]:
    """One DDP step: forward/backward, the fp32 gradient all-reduce (DDP's buckets), the optimizer step.

    `overlap` is the fraction of the forward/backward time the all-reduce can hide behind (0: none, the
    all-reduce follows the backward; about 2/3: the backward, where DDP launches its buckets).
    """
    chunks = micro_batches(batch, 1, device_max_micro_batch)
    compute = profile.step_seconds(chunks)
    forward_backward = sum(profile.forward_backward_seconds(c) for c in chunks)
    comm = ring_all_reduce_seconds(grad_bytes * numel, workers, link, DDP_BUCKET_BYTES, DDP_FIRST_BUCKET_BYTES)
    exposed = max(0.0, comm - overlap * forward_backward)
    return {"compute_seconds": compute, "comm_seconds": exposed, "wall_seconds": compute + exposed}


# ---------------------------------------------------------------- replays
@dataclass
class RunFacts:
    """What a replay needs beyond the rounds file (from the run's spec.json / result.json, or given)."""

    numel: int
    world_size: int
    pseudo_grad_bytes: int = 2
    with_momentum: bool = True
    save_merges: bool = False
    statistics: bool = True
    inner_state_bytes: float | None = None  # default: two fp32 moments, 8 × numel
    extra: dict = field(default_factory=dict)


def _instances_of(lines: list[dict], batch_key: str) -> list[Instance]:
    return [Instance(line["instance"], tuple(line["workers"]), line[batch_key]) for line in lines]


def _merge_plan(lines: list[dict], next_lines: list[dict] | None, world_size: int) -> MergePlan:
    """The merge at the end of a round, rebuilt from its lines: the survivor's `merged_from`, the table of the next
    round where there is one (else planned again from the requests, with demands b × workers)."""
    survivor = next(line for line in lines if line["merged_from"])
    merged = survivor["merged_from"][0]
    before = _instances_of(lines, "next_batch_size")
    if next_lines:
        after = _instances_of(next_lines, "batch_size")
    else:
        after = list(plan_merge(before, policy="smallest_pair", num_workers=world_size).after)
    return MergePlan(survivor["instance"], merged, (0.5, 0.5), (0.0, 0.0), tuple(before), tuple(after))


def replay_adloco(
    lines: list[dict],
    facts: RunFacts,
    profile: DeviceProfile,
    link: Link,
    *,
    device_max_micro_batch: int | None = None,
    broadcast: str = "one_to_all",
    final_merge: bool = True,
) -> dict[str, Any]:
    """Replay an AdLoCo/DiLoCo run's rounds (`load_rounds` records) on `profile` and `link`.

    A round: every instance runs its inner steps (the round waits for the slowest), the round-end barrier, every
    instance's outer step (local work, then the all-reduce of its pseudo-gradient over its workers, concurrently),
    the reports' all-gather, then the merge if one is due. The run starts with the broadcast of the initial weights
    and ends with the final merge when more than one instance is left.
    """
    numel, world = facts.numel, facts.world_size
    inner_bytes = facts.inner_state_bytes if facts.inner_state_bytes is not None else 8.0 * numel
    rounds_by_step = group_by_round(lines)
    steps_sorted = list(rounds_by_step)
    start_comm = broadcast_seconds(4.0 * numel, world, link, broadcast)
    records, clock, previous_step, tokens = [], profile.startup_seconds + start_comm, 0, 0
    table_after = None
    for index, step in enumerate(steps_sorted):
        round_lines = rounds_by_step[step]
        global_step = round_lines[0]["global_step"]
        steps = global_step - previous_step
        previous_step = global_step
        own = [
            instance_compute_seconds(
                line, steps, profile, statistics_step=facts.statistics, device_max_micro_batch=device_max_micro_batch
            )
            for line in round_lines
        ]
        compute = max(own)
        # Instances with smaller batches finish their H steps first and wait at the round-end barrier.
        workers_in_round = sum(len(line["workers"]) for line in round_lines)
        idle = sum(len(line["workers"]) * (compute - c) for line, c in zip(round_lines, own)) / workers_in_round
        payload = facts.pseudo_grad_bytes * numel
        all_reduce = max(
            ring_all_reduce_seconds(payload, len(line["workers"]), link, OUTER_BUCKET_NUMEL * facts.pseudo_grad_bytes)
            for line in round_lines
        )
        modelled_bytes = sum(2 * (len(line["workers"]) - 1) * payload for line in round_lines)
        merge, merge_bytes = 0.0, 0.0
        if any(line["merged_from"] for line in round_lines):
            next_lines = rounds_by_step[steps_sorted[index + 1]] if index + 1 < len(steps_sorted) else None
            plan = _merge_plan(round_lines, next_lines, world)
            messages = merge_messages(
                plan,
                numel=numel,
                with_momentum=facts.with_momentum,
                inner_state_bytes=inner_bytes,
                save=facts.save_merges,
            )
            merge = sequential_messages_seconds([(s, d, t) for _, s, d, t in messages], link)
            merge_bytes = sum(sum(t) for *_, t in messages)
            merge += control_seconds(world, link, 1)  # the merge's own all-gather of bytes and seconds
            table_after = plan.after
        else:
            table_after = _instances_of(round_lines, "next_batch_size")
        control = control_seconds(world, link, 2)
        comm = all_reduce + merge + control
        wall = compute + profile.outer_seconds + comm
        round_tokens = sum(line["tokens"] for line in round_lines)
        tokens += round_tokens
        clock += wall
        logged = sum(line["comm_bytes"] for line in round_lines)
        records.append(
            {
                "outer_step": step,
                "global_step": global_step,
                "inner_steps": steps,
                "instances": len(round_lines),
                "batch_sizes": {str(line["instance"]): _batch_used(line) for line in round_lines},
                "accumulation_steps": {str(line["instance"]): line["accumulation_steps"] for line in round_lines},
                "tokens": round_tokens,
                "total_tokens": tokens,
                "compute_seconds": compute + profile.outer_seconds,
                "idle_seconds": idle,
                "all_reduce_seconds": all_reduce,
                "merge_seconds": merge,
                "control_seconds": control,
                "comm_seconds": comm,
                "wall_seconds": wall,
                "cumulative_wall_seconds": clock,
                "modelled_bytes": modelled_bytes + merge_bytes,
                "logged_bytes": logged,
            }
        )
    final, extra_bytes = 0.0, (world - 1) * 4.0 * numel  # the start broadcast
    if final_merge and table_after is not None and len(table_after) > 1:
        senders = [inst.first_worker for inst in sorted(table_after, key=lambda x: x.id) if inst.first_worker != 0]
        extra_bytes += (len(senders) + world - 1) * 4.0 * numel
        final = sequential_messages_seconds([(src, 0, [4.0 * numel]) for src in senders], link)
        final += broadcast_seconds(4.0 * numel, world, link, broadcast) + control_seconds(world, link, 1)
        records[-1]["final_merge_seconds"] = final
        records[-1]["comm_seconds"] += final
        records[-1]["wall_seconds"] += final
        records[-1]["cumulative_wall_seconds"] += final
        clock += final
    return _summarise(records, start_comm, profile.startup_seconds, clock, final, extra_bytes)


def replay_ddp(
    steps: int,
    batch: int,
    tokens_per_step: float,
    facts: RunFacts,
    profile: DeviceProfile,
    link: Link,
    *,
    steps_per_record: int | None = None,
    overlap: float = 0.0,
    grad_bytes: int = 4,
    device_max_micro_batch: int | None = None,
    broadcast: str = "one_to_all",
) -> dict[str, Any]:
    """Replay `steps` DDP steps of `batch` sequences per worker; one record per `steps_per_record` steps."""
    per_step = ddp_step_seconds(
        batch,
        facts.world_size,
        facts.numel,
        profile,
        link,
        grad_bytes=grad_bytes,
        overlap=overlap,
        device_max_micro_batch=device_max_micro_batch,
    )
    start_comm = broadcast_seconds(4.0 * facts.numel, facts.world_size, link, broadcast)
    clock, done, records, tokens = profile.startup_seconds + start_comm, 0, [], 0.0
    chunk = steps_per_record or steps
    step_bytes = 2 * (facts.world_size - 1) * grad_bytes * facts.numel
    while done < steps:
        n = min(chunk, steps - done)
        done += n
        tokens += n * tokens_per_step
        clock += n * per_step["wall_seconds"]
        records.append(
            {
                "global_step": done,
                "inner_steps": n,
                "instances": 1,
                "tokens": n * tokens_per_step,
                "total_tokens": tokens,
                "compute_seconds": n * per_step["compute_seconds"],
                "all_reduce_seconds": n * per_step["comm_seconds"],
                "merge_seconds": 0.0,
                "control_seconds": 0.0,
                "comm_seconds": n * per_step["comm_seconds"],
                "wall_seconds": n * per_step["wall_seconds"],
                "cumulative_wall_seconds": clock,
                "modelled_bytes": n * step_bytes,
            }
        )
    start_bytes = (facts.world_size - 1) * 4.0 * facts.numel
    summary = _summarise(records, start_comm, profile.startup_seconds, clock, 0.0, start_bytes)
    summary["per_step"] = per_step
    return summary


def _summarise(
    records: list[dict], start_comm: float, startup: float, clock: float, final: float, extra_bytes: float
) -> dict:
    """Totals; `modelled_bytes` counts every byte sent, the start broadcast and the final merge included."""
    return {
        "rounds": records,
        "total": {
            "compute_seconds": startup + sum(r["compute_seconds"] for r in records),
            "idle_seconds": sum(r.get("idle_seconds", 0.0) for r in records),  # inside compute_seconds
            "comm_seconds": start_comm + sum(r["comm_seconds"] for r in records),
            "wall_seconds": clock,
            "start_broadcast_seconds": start_comm,
            "final_merge_seconds": final,
            "tokens": records[-1]["total_tokens"] if records else 0,
            "modelled_bytes": extra_bytes + sum(r["modelled_bytes"] for r in records),
        },
    }


# ---------------------------------------------------------------- curves
def tokens_to_target(curve: Sequence[Sequence[float]], target: float) -> float | None:
    """The first training tokens at which a `[tokens, perplexity]` curve reaches `target` (log-perplexity linear in
    tokens between points, as `_common.interpolate_curve`), or None if it never does. A curve already at the target
    at its first point gives that point's tokens (reached then at the latest)."""
    points = sorted((float(t), float(p)) for t, p in curve if p is not None and math.isfinite(p) and p > 0)
    if not points:
        return None
    if points[0][1] <= target:
        return points[0][0]
    for (t0, p0), (t1, p1) in zip(points, points[1:]):
        if p1 <= target < p0:
            fraction = (math.log(p0) - math.log(target)) / (math.log(p0) - math.log(p1))
            return t0 + fraction * (t1 - t0)
    return None


def seconds_at_tokens(replay: dict, tokens: float) -> float | None:
    """Predicted wall seconds when the run has trained `tokens`: linear in tokens within the round that holds
    them (the round's communication included at its end); None beyond the replay's last round."""
    rounds = replay["rounds"]
    if not rounds or tokens > rounds[-1]["total_tokens"] + 1e-9:
        return None
    previous_tokens, previous_clock = 0.0, rounds[0]["cumulative_wall_seconds"] - rounds[0]["wall_seconds"]
    for r in rounds:
        if tokens <= r["total_tokens"]:
            span = r["total_tokens"] - previous_tokens
            fraction = 1.0 if span <= 0 else (tokens - previous_tokens) / span
            return previous_clock + fraction * r["wall_seconds"]
        previous_tokens, previous_clock = r["total_tokens"], r["cumulative_wall_seconds"]
    return None


# ---------------------------------------------------------------- runs on disk
def _read_json(path: str) -> dict | None:
    if not os.path.exists(path):
        return None
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def run_facts(folder: str, **overrides) -> tuple[RunFacts, dict, dict]:
    """A run folder's facts from its spec.json and result.json (`_convergence_worker.py`); overrides win."""
    spec = _read_json(os.path.join(folder, "spec.json")) or {}
    result = _read_json(os.path.join(folder, "result.json")) or {}
    adloco = spec.get("adloco", {})
    numel = overrides.get("numel") or result.get("parameters")
    world = overrides.get("world_size") or spec.get("world_size") or result.get("world_size")
    dtype = overrides.get("pseudo_grad_dtype") or adloco.get("pseudo_grad_dtype", "bfloat16")
    lines = load_rounds(folder) if spec.get("kind", "adloco") != "ddp" else []
    if world is None and lines:
        world = len({w for line in lines for w in line["workers"]})
    if numel is None and lines:  # from the logged all-reduce bytes: 2 (M − 1) × numel × dtype bytes
        line = next(x for x in lines if len(x["workers"]) > 1)
        numel = (line["comm_bytes"] - (line.get("merge_bytes") or 0)) // (2 * (len(line["workers"]) - 1))
        numel //= DTYPE_BYTES[dtype]
    if numel is None or world is None:
        raise ValueError(f"{folder}: give --parameters and --world_size (no spec.json/result.json to read them from)")
    momentum = overrides.get("outer_momentum", adloco.get("outer_momentum", 0.9))
    facts = RunFacts(
        numel=int(numel),
        world_size=int(world),
        pseudo_grad_bytes=DTYPE_BYTES[dtype],
        with_momentum=float(momentum) > 0,
        save_merges=bool(adloco.get("save_merges", False)),
        statistics=adloco.get("batch_size_test", "norm") != "none",
    )
    return facts, spec, result


def replay_folder(
    folder: str,
    profile: DeviceProfile,
    link: Link,
    *,
    ddp_overlap: float = 0.0,
    device_max_micro_batch: int | None = None,
    **overrides,
) -> dict[str, Any]:
    """Replay one method's output folder (AdLoCo/DiLoCo: its rounds file; DDP: its spec and step count)."""
    facts, spec, result = run_facts(folder, **overrides)
    if spec.get("kind") == "ddp":
        batch = spec["train"]["batch_size"]
        tokens_per_step = facts.world_size * batch * spec["block_size"]
        steps = result.get("steps") or math.ceil(result["tokens"] / tokens_per_step)
        replay = replay_ddp(
            steps,
            batch,
            tokens_per_step,
            facts,
            profile,
            link,
            steps_per_record=spec["train"].get("inner_steps"),
            overlap=ddp_overlap,
            device_max_micro_batch=device_max_micro_batch,
        )
    else:
        replay = replay_adloco(
            load_rounds(folder), facts, profile, link, device_max_micro_batch=device_max_micro_batch
        )
    replay["facts"] = facts.__dict__
    replay["curve"] = result.get("curve")
    curve = _convergence_curve(folder)
    if curve:  # convergence.py's copy starts with the initial perplexity at 0 tokens
        replay["curve"] = curve
    return replay


def _convergence_curve(folder: str) -> list | None:
    """The run's curve as convergence.py's results.json holds it (with the initial point): for `<dir>/<method>` or,
    with several seeds, `<dir>/<method>/seed-<seed>`."""
    folder = os.path.abspath(folder)
    name, seed = os.path.basename(folder), None
    if name.startswith("seed-"):
        seed, folder = name[len("seed-") :], os.path.dirname(folder)
        name = os.path.basename(folder)
    results = _read_json(os.path.join(os.path.dirname(folder), "results.json")) or {}
    method = results.get("methods", {}).get(name, {})
    if seed is None:
        return method.get("curve")
    return (method.get("seed_results", {}).get(seed) or {}).get("curve")


def _rounds_folder(folder: str) -> str | None:
    """`folder` if it holds a rounds file, else its first `seed-*` subfolder that does (convergence.py's seeds)."""
    candidates = [folder] + sorted(
        os.path.join(folder, d) for d in (os.listdir(folder) if os.path.isdir(folder) else []) if d.startswith("seed-")
    )
    return next((c for c in candidates if os.path.exists(os.path.join(c, "adloco_rounds.jsonl"))), None)


def time_to_targets(replay: dict, curve, targets: Sequence[float]) -> list[dict]:
    out = []
    for target in targets:
        tokens = tokens_to_target(curve, target) if curve else None
        out.append(
            {
                "target_ppl": target,
                "tokens": tokens,
                "seconds": None if tokens is None else seconds_at_tokens(replay, tokens),
            }
        )
    return out


# ---------------------------------------------------------------- validation
def links_entries(obj: Any, method: str | None = None) -> list[dict]:
    """Every measurement of a links.py results file: a dict with `wall_seconds` and `bandwidth_bits_per_second`,
    wherever it sits; its method is its own `method` or the key it is stored under (the nearest one)."""
    found = []
    if isinstance(obj, dict):
        if "wall_seconds" in obj and "bandwidth_bits_per_second" in obj:
            entry = dict(obj)
            entry.setdefault("method", method)
            found.append(entry)
            return found
        for key, value in obj.items():
            found += links_entries(value, key if isinstance(value, dict) and key not in ("tbf",) else method)
    elif isinstance(obj, list):
        for value in obj:
            found += links_entries(value, method)
    return found


def validate(
    links: dict,
    profile: DeviceProfile | None,
    *,
    latency: float,
    efficiency: float = 1.0,
    calibrate: str = "none",
    ddp_overlap: float = 0.0,
    base_dir: str = ".",
) -> list[dict]:
    """Predicted against measured wall seconds for every method and bandwidth of a links.py results file.

    `calibrate="highest"`: per method, the compute times are scaled so that the run at the highest bandwidth is
    matched exactly; that row is marked `calibration` and its error is not a prediction's.
    """
    entries = [e for e in links_entries(links) if e.get("wall_seconds") is not None]
    rows = []
    by_method: dict[str, list[dict]] = {}
    for entry in entries:
        by_method.setdefault(str(entry.get("method")), []).append(entry)
    for method, group in sorted(by_method.items()):
        group = sorted(group, key=lambda e: e["bandwidth_bits_per_second"])
        method_profile = profile
        reference = None
        if calibrate == "highest":
            reference = group[-1]
            link = Link(reference["bandwidth_bits_per_second"], latency, efficiency)
            base = replay_folder(_folder(reference, base_dir), profile, link, ddp_overlap=ddp_overlap)
            compute = base["total"]["compute_seconds"]
            factor = (reference["wall_seconds"] - base["total"]["comm_seconds"]) / compute
            method_profile = profile.scaled(factor)
        for entry in group:
            link = Link(entry["bandwidth_bits_per_second"], latency, efficiency)
            replay = replay_folder(_folder(entry, base_dir), method_profile, link, ddp_overlap=ddp_overlap)
            predicted, measured = replay["total"]["wall_seconds"], entry["wall_seconds"]
            targets = []
            for ppl, reached in sorted((entry.get("to_target") or {}).items(), key=lambda kv: -float(kv[0])):
                if not reached or reached.get("tokens") is None or not reached.get("seconds"):
                    continue
                at = seconds_at_tokens(replay, reached["tokens"])
                targets.append(
                    {
                        "target_ppl": float(ppl),
                        "tokens": reached["tokens"],
                        "measured_seconds": reached["seconds"],
                        "predicted_seconds": at,
                        "relative_error": None if at is None else (at - reached["seconds"]) / reached["seconds"],
                    }
                )
            rows.append(
                {
                    "method": method,
                    "bandwidth_bits_per_second": entry["bandwidth_bits_per_second"],
                    "measured_seconds": measured,
                    "predicted_seconds": predicted,
                    "predicted_compute_seconds": replay["total"]["compute_seconds"],
                    "predicted_comm_seconds": replay["total"]["comm_seconds"],
                    "relative_error": (predicted - measured) / measured,
                    "role": "calibration" if entry is reference else "prediction",
                    "link_bytes": entry.get("link_bytes_training", entry.get("link_bytes")),
                    "modelled_bytes": replay["total"]["modelled_bytes"],
                    "bytes_ratio": ratio(
                        entry.get("link_bytes_training", entry.get("link_bytes")), replay["total"]["modelled_bytes"]
                    ),
                    "folder": entry.get("folder"),
                    "to_target": targets,
                    "to_target_mean_abs_error": (
                        sum(abs(t["relative_error"]) for t in targets) / len(targets)
                        if targets and all(t["relative_error"] is not None for t in targets)
                        else None
                    ),
                }
            )
    return rows


def _folder(entry: dict, base_dir: str) -> str:
    folder = entry.get("folder")
    if not folder:
        raise ValueError(f"links entry for {entry.get('method')} has no `folder`")
    return folder if os.path.isabs(folder) else os.path.join(base_dir, folder)


def _mbit(bits: float) -> str:
    return f"{bits / 1e6:g} Mbit/s" if bits < 1e9 else f"{bits / 1e9:g} Gbit/s"


def format_validation(rows: list[dict]) -> str:
    shown = [
        {
            **r,
            "bandwidth": _mbit(r["bandwidth_bits_per_second"]),
            "error %": 100 * r["relative_error"],
            "to-target error %": None
            if r.get("to_target_mean_abs_error") is None
            else 100 * r["to_target_mean_abs_error"],
            "link/modelled bytes": r["bytes_ratio"],
        }
        for r in rows
    ]
    columns = [
        "method",
        "bandwidth",
        "measured_seconds",
        "predicted_seconds",
        "predicted_compute_seconds",
        "predicted_comm_seconds",
        "error %",
        "to-target error %",
        "role",
        "link/modelled bytes",
    ]
    lines = [table(shown, columns)]
    errors = [abs(r["relative_error"]) for r in rows if r["role"] == "prediction"]
    if errors:
        lines.append(
            f"\n|relative error| over {len(errors)} predictions: mean {100 * sum(errors) / len(errors):.1f}%, "
            f"max {100 * max(errors):.1f}%"
        )
    lines.append(
        "to-target error %: mean |relative error| of the predicted seconds at which the run reached links.py's "
        "target perplexities (at the measured tokens), against the measured ones."
    )
    return "\n".join(lines)


# ---------------------------------------------------------------- the 1B / H100 scenario
H100_BF16_DENSE_FLOPS = 989e12


@dataclass(frozen=True)
class Scenario:
    """A 1B-parameter model on H100s; every number here is printed with the results."""

    params: float = 1.0e9
    sequence_length: int = 2048
    # Sequences per forward/backward on one H100 (max_batch_size): 16 × 2048 tokens of a 1B model in bf16 need about
    # 16 GB of fp32 weights, gradients and AdamW moments plus ~2 GB of activations per sequence. Twice the initial
    # batch, as in convergence.py's CPU runs (max_batch_size 8, batch 4), so switch mode acts as it did there.
    micro_batch: int = 16
    batch: int = 8  # per-worker batch of DDP and DiLoCo, AdLoCo's initial request
    workers: int = 8
    mfu: float = 0.40
    peak_flops: float = H100_BF16_DENSE_FLOPS
    inner_steps: int = 500
    latency_seconds: float = 1e-4
    ddp_tokens_to_target: float = 20e9  # Chinchilla's 20 tokens per parameter
    pseudo_grad_bytes: int = 2  # bf16 pseudo-gradients
    ddp_grad_bytes: int = 4  # fp32 gradients, as convergence.py models DDP
    ddp_overlap: float = 0.0  # share of the forward/backward that hides DDP's all-reduce
    hbm_bytes_per_second: float = 3.35e12
    bandwidths: tuple[float, ...] = (1e8, 1e9, 1e10, 1e11)

    def profile(self) -> DeviceProfile:
        """Forward/backward: 6 × params × tokens FLOPs at `mfu` of the peak; the optimizer step and the outer step's
        local work are memory-bound passes over fp32 state (AdamW: read and write θ, grad, two moments = 32 bytes
        per parameter; outer step: about 6 fp32 passes = 24 bytes per parameter)."""
        per_sequence = 6 * self.params * self.sequence_length / (self.mfu * self.peak_flops)
        return DeviceProfile(
            micro_batch_seconds={1: per_sequence, self.micro_batch: per_sequence * self.micro_batch},
            optimizer_seconds=32 * self.params / self.hbm_bytes_per_second,
            outer_seconds=24 * self.params / self.hbm_bytes_per_second,
            source="6 N D FLOPs at MFU × peak",
        )


def measured_ratios(convergence: dict, target: float | None = None) -> dict[str, Any]:
    """Tokens to a target perplexity of diloco and adloco relative to ddp, from convergence.py's results.json.

    The target defaults to the highest final perplexity of the three (so that every curve reaches it)."""
    methods = {m: convergence["methods"][m] for m in ("ddp", "diloco", "adloco") if m in convergence["methods"]}
    if "ddp" not in methods:
        raise ValueError("the convergence results hold no ddp run")
    if target is None:
        target = max(min(p for _, p in m["curve"]) for m in methods.values())
    tokens = {name: tokens_to_target(m["curve"], target) for name, m in methods.items()}
    return {
        "target_ppl": target,
        "tokens_to_target": tokens,
        "ratios": {name: ratio(t, tokens["ddp"]) for name, t in tokens.items()},
    }


def _scenario_lines(
    source_lines: list[dict], scenario: Scenario, rounds_needed: int, source_workers: int
) -> list[dict]:
    """AdLoCo's measured trajectory (instances, workers, requests, merges per round) mapped onto the scenario:
    every measured worker becomes workers / source_workers workers, requests scale with the initial batch, switch
    mode is planned again for the H100's micro-batch limit; past the measured rounds the table after the last one
    (its requests, the merge it ended with) repeats."""
    per = scenario.workers // source_workers
    grouped = list(group_by_round(source_lines).values())
    first_batch = grouped[0][0]["batch_size"]
    last = grouped[-1]
    if any(line["merged_from"] for line in last):  # the table after the last measured merge repeats
        plan = _merge_plan(last, None, source_workers)
        last = [
            {"instance": inst.id, "workers": list(inst.workers), "batch_size": inst.batch_size, "merged_from": []}
            for inst in plan.after
        ]
    else:
        last = [{**line, "batch_size": line["next_batch_size"]} for line in last]
    out = []
    for index in range(rounds_needed):
        repeat = index >= len(grouped)
        lines = last if repeat else grouped[index]
        for line in lines:
            request = max(1, round(line["batch_size"] * scenario.batch / first_batch))
            plan = plan_batch(request, scenario.micro_batch, 2.0)
            workers = [w * per + k for w in line["workers"] for k in range(per)]
            out.append(
                {
                    "outer_step": index + 1,
                    "global_step": (index + 1) * scenario.inner_steps,
                    "instance": line["instance"],
                    "workers": workers,
                    "batch_size": request,
                    "next_batch_size": request,
                    "micro_batch_size": plan.micro_batch_size,
                    "accumulation_steps": plan.accumulation_steps,
                    "tokens": plan.batch_size * len(workers) * scenario.inner_steps * scenario.sequence_length,
                    "merged_from": list(line["merged_from"]),
                    "comm_bytes": 0,
                }
            )
    return out


def _until_tokens(lines: list[dict], tokens: float) -> list[dict]:
    """The rounds up to the first one at whose end the run has trained `tokens`."""
    kept, total = [], 0
    for group in group_by_round(lines).values():
        kept += group
        total += sum(line["tokens"] for line in group)
        if total >= tokens:
            break
    return kept


def scenario_results(scenario: Scenario, ratios: dict[str, float], adloco_lines: list[dict] | None) -> dict:
    """Time to target per method and bandwidth."""
    profile = scenario.profile()
    numel = int(scenario.params)
    facts = RunFacts(numel=numel, world_size=scenario.workers, pseudo_grad_bytes=scenario.pseudo_grad_bytes)
    tokens_per_step = scenario.workers * scenario.batch * scenario.sequence_length
    rows = []
    for bandwidth in scenario.bandwidths:
        link = Link(bandwidth, scenario.latency_seconds)
        for method in ("ddp", "diloco", "adloco"):
            if ratios.get(method) is None:
                continue
            target_tokens = scenario.ddp_tokens_to_target * ratios[method]
            if method == "ddp":
                steps = math.ceil(target_tokens / tokens_per_step)
                replay = replay_ddp(
                    steps,
                    scenario.batch,
                    tokens_per_step,
                    facts,
                    profile,
                    link,
                    grad_bytes=scenario.ddp_grad_bytes,
                    overlap=scenario.ddp_overlap,
                    broadcast="pipelined",
                )
            else:
                per_round = tokens_per_step * scenario.inner_steps
                if method == "diloco" or not adloco_lines:
                    lines = [
                        {
                            "outer_step": r + 1,
                            "global_step": (r + 1) * scenario.inner_steps,
                            "instance": 0,
                            "workers": list(range(scenario.workers)),
                            "batch_size": scenario.batch,
                            "next_batch_size": scenario.batch,
                            "micro_batch_size": min(scenario.batch, scenario.micro_batch),
                            "accumulation_steps": plan_batch(scenario.batch, scenario.micro_batch).accumulation_steps,
                            "tokens": per_round,
                            "merged_from": [],
                            "comm_bytes": 0,
                        }
                        for r in range(math.ceil(target_tokens / per_round))
                    ]
                else:
                    source_workers = len({w for line in adloco_lines for w in line["workers"]})
                    lines, needed = [], math.ceil(target_tokens / per_round)
                    while True:  # rounds grow in tokens as requests grow: extend until the target is covered
                        lines = _scenario_lines(adloco_lines, scenario, needed, source_workers)
                        if sum(line["tokens"] for line in lines) >= target_tokens:
                            break
                        needed = math.ceil(needed * 1.25) + 1
                lines = _until_tokens(lines, target_tokens)
                replay = replay_adloco(
                    lines, replace(facts, statistics=method == "adloco"), profile, link, broadcast="pipelined"
                )
            seconds = seconds_at_tokens(replay, target_tokens)
            total = replay["total"]
            rows.append(
                {
                    "method": method,
                    "bandwidth_bits_per_second": bandwidth,
                    "tokens_to_target": target_tokens,
                    "hours_to_target": None if seconds is None else seconds / 3600,
                    "compute_share": total["compute_seconds"] / total["wall_seconds"],
                    "idle_share": total["idle_seconds"] / total["wall_seconds"],
                    "comm_hours": total["comm_seconds"] / 3600,
                    "inner_steps": sum(r["inner_steps"] for r in replay["rounds"]),
                    "rounds": None if method == "ddp" else len(replay["rounds"]),
                }
            )
    return {"rows": rows, "profile": profile.to_json()}


def scenario_assumptions(scenario: Scenario, ratio_info: dict) -> list[str]:
    p = scenario.profile()
    return [
        f"model: {scenario.params / 1e9:g} B parameters, sequences of {scenario.sequence_length} tokens",
        f"H100 step: 6 × params × tokens FLOPs at MFU {scenario.mfu:.0%} of {scenario.peak_flops / 1e12:g} TFLOP/s "
        f"(bf16 dense): forward/backward {p.forward_backward_seconds(1):.4f} s per sequence; AdamW step "
        f"{1000 * p.optimizer_seconds:.1f} ms and outer step {1000 * p.outer_seconds:.1f} ms (memory-bound passes at "
        f"{scenario.hbm_bytes_per_second / 1e12:g} TB/s)",
        f"{scenario.workers} workers (one H100 each), each with its own link (full duplex, non-blocking switch), "
        f"latency {1000 * scenario.latency_seconds:g} ms per message (one latency for every bandwidth)",
        f"per-worker batch {scenario.batch} sequences (DDP, DiLoCo; AdLoCo's initial request), micro-batch limit "
        f"{scenario.micro_batch} (switch mode γ = 2: requests up to {2 * scenario.micro_batch} are capped at "
        f"{scenario.micro_batch}, larger ones accumulate)",
        f"DiLoCo/AdLoCo: H = {scenario.inner_steps} inner steps per round, bf16 pseudo-gradients "
        f"({scenario.pseudo_grad_bytes} bytes/parameter) in ring all-reduces (buckets of 2^25 elements); merges "
        "as merging.py sends them (fp32 φ and momentum, fp32 AdamW moments), the final merge, the initial broadcast",
        f"DDP: one gradient ring all-reduce per step ({scenario.ddp_grad_bytes} bytes/parameter, 25 MiB buckets), "
        + (
            "not overlapped with the backward"
            if scenario.ddp_overlap == 0
            else f"hidden behind {scenario.ddp_overlap:.0%} of the forward/backward time"
        ),
        "no compute/communication overlap anywhere (no streaming DiLoCo); no stragglers; instances run their H steps "
        "in lockstep, so an instance with a smaller batch waits for the slowest at the round's end (idle_share, "
        "counted in the compute share)",
        f"tokens to target: DDP {scenario.ddp_tokens_to_target / 1e9:g} B (20 tokens per parameter); DiLoCo and AdLoCo "
        f"× their measured ratios to DDP at perplexity {ratio_info.get('target_ppl', float('nan')):.1f} "
        f"({ratio_info.get('source', 'given')}): "
        + ", ".join(f"{m} {r:.3f}" for m, r in ratio_info["ratios"].items() if r is not None)
        + " — measured on a tiny model over a short budget; treat them as an assumption, not as a 1B fact",
        "AdLoCo's trajectory (instances, merges, requests per round) is the measured run's "
        f"({ratio_info.get('adloco_trajectory', 'none found: AdLoCo replayed as DiLoCo rounds')}), each measured "
        f"worker mapped to {scenario.workers} / (its workers) workers and requests scaled by the initial batch; after "
        "the measured rounds the table after the last one repeats (its requests, no further merges)",
    ]


def format_scenario(rows: list[dict]) -> str:
    shown = [
        {
            **r,
            "bandwidth": _mbit(r["bandwidth_bits_per_second"]),
            "tokens (B)": r["tokens_to_target"] / 1e9,
            "hours": r["hours_to_target"],
            "compute share": r["compute_share"],
        }
        for r in rows
    ]
    columns = ["bandwidth", "method", "tokens (B)", "hours", "compute share", "idle_share", "comm_hours"]
    return table(shown, [*columns, "inner_steps", "rounds"])


def plot_scenario(rows: list[dict], path: str, title: str) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 5))
    for method in ("ddp", "diloco", "adloco"):
        points = [
            (r["bandwidth_bits_per_second"] / 1e9, r["hours_to_target"])
            for r in rows
            if r["method"] == method and r["hours_to_target"]
        ]
        if points:
            x, y = zip(*points)
            ax.plot(x, y, marker="o", label=method, linewidth=2)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("link bandwidth per worker (Gbit/s)")
    ax.set_ylabel("hours to target perplexity")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


# ---------------------------------------------------------------- command line
def profile_from_args(args: argparse.Namespace) -> DeviceProfile | None:
    if args.profile:
        profile = DeviceProfile.from_json(_read_json(args.profile), source=args.profile)
    elif args.step_seconds:
        points = {}
        for item in args.step_seconds.split(","):
            b, _, s = item.partition("=")
            points[int(b)] = float(s)
        profile = DeviceProfile(points, args.optimizer_seconds or 0.0, source="command line")
    else:
        return None
    changes = {
        k: getattr(args, k)
        for k in ("optimizer_seconds", "step_overhead_seconds", "outer_seconds", "startup_seconds")
        if getattr(args, k) is not None
    }
    return replace(profile, **changes) if changes else profile


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--run", help="A method's output folder (adloco_rounds.jsonl, spec.json, result.json).")
    mode.add_argument("--validate", metavar="LINKS_RESULTS", help="links.py's results.json.")
    mode.add_argument("--scenario", choices=["1b-h100"])
    parser.add_argument("--output_dir", default="outputs/benchmarks/wallclock")
    parser.add_argument("--profile", help="overhead.py's results.json (its step_profile) or a profile JSON.")
    parser.add_argument("--step_seconds", help="Forward/backward seconds per micro-batch size: '4=0.05,8=0.09'.")
    parser.add_argument("--optimizer_seconds", type=float, default=None)
    parser.add_argument("--step_overhead_seconds", type=float, default=None, help="Other per-step work.")
    parser.add_argument("--outer_seconds", type=float, default=None, help="An outer step's local work.")
    parser.add_argument("--startup_seconds", type=float, default=None)
    parser.add_argument("--bandwidth", type=float, default=1e9, help="Bits per second per worker link.")
    parser.add_argument("--latency", type=float, default=1e-4, help="Seconds per message.")
    parser.add_argument(
        "--efficiency", type=float, default=1.0, help="Payload share of the wire rate (TCP over Ethernet: 0.956)."
    )
    parser.add_argument("--ddp_overlap", type=float, default=0.0, help="Share of forward/backward hiding DDP's comm.")
    parser.add_argument(
        "--device_max_micro_batch",
        type=int,
        default=None,
        help="--run: the largest micro-batch of the modelled device (default: the run's own switch-mode plan).",
    )
    parser.add_argument("--targets", type=float, nargs="*", default=[], help="Perplexities to time (--run).")
    parser.add_argument("--curve", help="A JSON file with a [[tokens, ppl], ...] curve (default: result.json's).")
    parser.add_argument("--parameters", type=int, default=None, help="Trainable parameters (if not in the run).")
    parser.add_argument("--world_size", type=int, default=None)
    parser.add_argument("--calibrate", choices=["none", "highest"], default="none", help="--validate only.")
    parser.add_argument(
        "--convergence",
        default="outputs/benchmarks/convergence/results.json",
        help="--scenario: convergence.py's results, for the tokens-to-target ratios and AdLoCo's trajectory.",
    )
    parser.add_argument("--ratios", help="--scenario: 'diloco=1.2,adloco=1.4' instead of the measured ratios.")
    parser.add_argument("--target_ppl", type=float, default=None, help="--scenario: target of the ratios.")
    parser.add_argument("--ddp_grad_bytes", type=int, default=4, help="--scenario: bytes per gradient element.")
    scenario_flags = (
        ("mfu", 0.4),
        ("workers", 8),
        ("inner_steps", 500),
        ("scenario_latency", 1e-4),
        ("micro_batch", 16),
    )
    for name, default in scenario_flags:
        parser.add_argument(f"--{name}", type=type(default), default=default, help="--scenario.")
    return parser.parse_args(argv)


def main_run(args: argparse.Namespace, profile: DeviceProfile) -> dict:
    link = Link(args.bandwidth, args.latency, args.efficiency)
    overrides = {"numel": args.parameters, "world_size": args.world_size}
    replay = replay_folder(
        args.run,
        profile,
        link,
        ddp_overlap=args.ddp_overlap,
        device_max_micro_batch=args.device_max_micro_batch,
        **overrides,
    )
    curve = replay.pop("curve")
    if args.curve:
        loaded = _read_json(args.curve)
        curve = loaded.get("curve") if isinstance(loaded, dict) else loaded
    replay["targets"] = time_to_targets(replay, curve, args.targets)
    replay.update(link=link.__dict__, profile=profile.to_json(), run=args.run)
    columns = ["global_step", "instances", "total_tokens", "compute_seconds", "comm_seconds", "wall_seconds"]
    print(table(replay["rounds"], ["outer_step", *columns, "cumulative_wall_seconds"]))
    total = replay["total"]
    print(
        f"\ntotal: compute {total['compute_seconds']:.2f} s, communication {total['comm_seconds']:.2f} s "
        f"(start broadcast {total['start_broadcast_seconds']:.2f} s, final merge {total['final_merge_seconds']:.2f} s), "
        f"wall {total['wall_seconds']:.2f} s over {_mbit(link.bandwidth_bits_per_second)}, "
        f"{human_bytes(total['modelled_bytes'])} modelled"
    )
    for t in replay["targets"]:
        seconds = "not reached" if t["seconds"] is None else f"{t['seconds']:.2f} s ({t['tokens']:,.0f} tokens)"
        print(f"time to perplexity {t['target_ppl']:g}: {seconds}")
    write_json(os.path.join(args.output_dir, "replay.json"), replay)
    return replay


def main_validate(args: argparse.Namespace, profile: DeviceProfile) -> dict:
    links = _read_json(args.validate)
    if links is None:
        raise SystemExit(f"{args.validate} not found")
    rows = validate(
        links,
        profile,
        latency=args.latency,
        efficiency=args.efficiency,
        calibrate=args.calibrate,
        ddp_overlap=args.ddp_overlap,
        base_dir=REPO,
    )
    report = format_validation(rows)
    print(report)
    name = "validation" if args.calibrate == "none" else f"validation_calibrated_{args.calibrate}"
    results = {
        "rows": rows,
        "profile": profile.to_json(),
        "latency_seconds": args.latency,
        "efficiency": args.efficiency,
        "calibrate": args.calibrate,
        "ddp_overlap": args.ddp_overlap,
        "links_results": args.validate,
    }
    write_json(os.path.join(args.output_dir, f"{name}.json"), results)
    with open(os.path.join(args.output_dir, f"{name}.md"), "w", encoding="utf-8") as f:
        f.write(report + "\n")
    return results


def main_scenario(args: argparse.Namespace) -> dict:
    scenario = Scenario(
        mfu=args.mfu,
        workers=args.workers,
        inner_steps=args.inner_steps,
        latency_seconds=args.scenario_latency,
        micro_batch=args.micro_batch,
        ddp_grad_bytes=args.ddp_grad_bytes,
        ddp_overlap=args.ddp_overlap,
    )
    convergence = _read_json(args.convergence)
    adloco_lines = None
    if args.ratios:
        given = {k: float(v) for k, v in (item.split("=") for item in args.ratios.split(","))}
        ratio_info = {"ratios": {"ddp": 1.0, **given}, "target_ppl": float("nan"), "source": "given"}
    else:
        if convergence is None:
            raise SystemExit(f"{args.convergence} not found: run convergence.py first, or give --ratios")
        ratio_info = measured_ratios(convergence, args.target_ppl)
        ratio_info["source"] = f"{args.convergence}, profile {convergence.get('profile')}"
    if convergence is not None and "adloco" in convergence.get("methods", {}):
        folder = _rounds_folder(os.path.join(os.path.dirname(os.path.abspath(args.convergence)), "adloco"))
        if folder is not None:
            adloco_lines = load_rounds(folder)
            ratio_info["adloco_trajectory"] = folder
    source_workers = len({w for line in adloco_lines for w in line["workers"]}) if adloco_lines else 1
    if adloco_lines and scenario.workers % source_workers:
        raise SystemExit(f"--workers must be a multiple of the measured run's {source_workers} workers")
    results = scenario_results(scenario, ratio_info["ratios"], adloco_lines)
    assumptions = scenario_assumptions(scenario, ratio_info)
    report = format_scenario(results["rows"])
    print("assumptions:\n" + "\n".join(f"- {a}" for a in assumptions) + "\n\n" + report)
    out = os.path.join(args.output_dir, "scenario")
    write_json(
        os.path.join(out, "results.json"),
        {**results, "assumptions": assumptions, "scenario": scenario.__dict__, "ratios": ratio_info},
    )
    with open(os.path.join(out, "table.md"), "w", encoding="utf-8") as f:
        f.write("Assumptions:\n" + "\n".join(f"- {a}" for a in assumptions) + "\n\n" + report + "\n")
    title = (
        f"{scenario.params / 1e9:g}B model, {scenario.workers}× H100 (MFU {scenario.mfu:.0%}), H={scenario.inner_steps}: "
        "time to target"
    )
    print(f"wrote {plot_scenario(results['rows'], os.path.join(out, 'time_to_target.png'), title)}")
    return results


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    os.chdir(REPO)
    if args.scenario:
        return main_scenario(args)
    profile = profile_from_args(args)
    if profile is None:
        raise SystemExit("give a device profile: --profile FILE or --step_seconds '4=0.05,8=0.09'")
    return main_run(args, profile) if args.run else main_validate(args, profile)


if __name__ == "__main__":
    main()
