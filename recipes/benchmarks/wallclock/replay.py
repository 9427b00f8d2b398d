"""Replays: the compute time of a step and of an instance's round, then whole runs (AdLoCo/DiLoCo rounds, DDP
steps) on a device profile and a link, and the time at which a replayed run has trained a number of tokens."""

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from adloco_hf.inspection import Instance, MergePlan, group_by_round, plan_merge, split_sizes
from recipes.benchmarks.toolkit.link_model import (
    DDP_BUCKET_BYTES,
    DDP_FIRST_BUCKET_BYTES,
    OUTER_BUCKET_NUMEL,
    DeviceProfile,
    Link,
    broadcast_seconds,
    control_seconds,
    merge_messages,
    ring_all_reduce_seconds,
    sequential_messages_seconds,
)
from recipes.benchmarks.toolkit.stats import first_reach
from recipes.benchmarks.toolkit.traffic import ring_all_reduce_bytes, start_broadcast_bytes


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
    merge_transport: str = "point_to_point"  # "all_reduce": a merge is a ring of the bytes its line logs
    extra: dict = field(default_factory=dict)


def all_reduce_merge_seconds(plan: MergePlan, logged_bytes: float, link: Link) -> float:
    """An all-reduce merge (`merge_transport="all_reduce"`) from the bytes its rounds line logs (what all n members
    of both instances sent, whatever `merge_payload`): a ring of n members sends 2 (n − 1) payloads in all, so one
    member's payload is logged / (2 (n − 1)). The broadcasts to workers that change instance are in the logged bytes
    (so in the payload: a slight overestimate) but not timed apart."""
    before = {inst.id: inst for inst in plan.before}
    members = len(before[plan.survivor].workers) + len(before[plan.merged].workers)
    payload = logged_bytes / (2 * (members - 1))
    return ring_all_reduce_seconds(payload, members, link, OUTER_BUCKET_NUMEL * 4)


def _instances_of(lines: list[dict], batch_key: str) -> list[Instance]:
    return [Instance(line["instance"], tuple(line["workers"]), line[batch_key]) for line in lines]


def merge_plan(lines: list[dict], next_lines: list[dict] | None, world_size: int) -> MergePlan:
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
        modelled_bytes = sum(ring_all_reduce_bytes(payload, len(line["workers"])) for line in round_lines)
        merge, merge_bytes = 0.0, 0.0
        if any(line["merged_from"] for line in round_lines):
            next_lines = rounds_by_step[steps_sorted[index + 1]] if index + 1 < len(steps_sorted) else None
            plan = merge_plan(round_lines, next_lines, world)
            logged_merge = next(line for line in round_lines if line["merged_from"]).get("merge_bytes")
            messages = (
                []
                if facts.merge_transport == "all_reduce" and logged_merge
                else merge_messages(
                    plan,
                    numel=numel,
                    with_momentum=facts.with_momentum,
                    inner_state_bytes=inner_bytes,
                    save=facts.save_merges,
                )
            )
            if messages:
                merge = sequential_messages_seconds([(s, d, t) for _, s, d, t in messages], link)
                merge_bytes = sum(sum(t) for *_, t in messages)
            else:
                merge, merge_bytes = all_reduce_merge_seconds(plan, logged_merge, link), logged_merge
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
    final, extra_bytes = 0.0, start_broadcast_bytes(world, numel)
    if final_merge and table_after is not None and len(table_after) > 1:
        senders = [inst.first_worker for inst in sorted(table_after, key=lambda x: x.id) if inst.first_worker != 0]
        extra_bytes += len(senders) * 4 * numel + start_broadcast_bytes(world, numel)  # φ to rank 0, then broadcast
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
    step_bytes = ring_all_reduce_bytes(grad_bytes * facts.numel, facts.world_size)
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
    start_bytes = start_broadcast_bytes(facts.world_size, facts.numel)
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


def tokens_to_target(curve: Sequence[Sequence[float]], target: float) -> float | None:
    """The first training tokens at which a `[tokens, perplexity]` curve reaches `target` (log-perplexity linear in
    tokens between points: `toolkit.stats.first_reach`), or None if it never does. A curve already at the target at its
    first point gives that point's tokens (reached then at the latest)."""
    points = [{"tokens": float(t), "eval_ppl": p} for t, p in sorted(curve, key=lambda point: float(point[0]))]
    reached = first_reach(points, target, {"tokens": "tokens"})
    return None if reached is None else reached["tokens"]


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
