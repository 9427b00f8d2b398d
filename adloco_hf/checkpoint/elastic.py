"""Elastic resume: a checkpoint written by W workers resumed with W' ≠ W (docs/resuming.md).

Every instance keeps its global weights φ, outer momentum, request and demand; its workers are re-assigned by the
rule a merge uses (`instances.reassign_workers`). A worker that stays in its instance keeps its own inner-optimizer
state; one that joins an instance (a new rank, or one whose instance changed) takes the state of the instance's old
first worker (φ is the same on all of them at a round's end). Old ranks keep their random generators, new ones get
fresh ones. The data
is re-split from where the old workers stood: within every pass they had started, no sample (map-style
`train_dataset`) or document (a streamed one) is lost or read twice (`sampling/reshard.py`,
`AdaptiveBatchSampler.reshard_sampler_states`, `stream_sampler.reshard_stream_states`).

Refused, with the reason: more instances than workers (merge down first), a checkpoint written inside a round (a
preemption: each worker's own weights cannot be split or joined), and a user's stream that keeps its own position
(neither a `datasets.IterableDataset` nor a `PackedStream`).
"""

import os
from dataclasses import dataclass, replace
from typing import Any

import torch

from ..instances.table import Instance, instance_of, reassign_workers
from ..sampling.sampler import AdaptiveBatchSampler
from ..sampling.stream_sampler import reshard_stream_states
from .folders import RANK_STATE_VERSION, rank_state_path


__all__ = [
    "ElasticPlan",
    "check_instances_fit",
    "checkpoint_instances",
    "elastic_rank_state",
    "plan_elastic_resume",
]


@dataclass(frozen=True)
class ElasticPlan:
    """How a checkpoint of `old_world_size` workers continues on `new_world_size`.

    Attributes:
        before: the checkpoint's instance table.
        after: the table for the new workers (requests above a worker's new data shard are lowered to it).
        sources: for every new rank, the old rank whose inner-optimizer state (and its schedule's base rates and
            the gradient scaler) it takes, and whose copy of its instance's φ and momentum it loads. Old ranks keep
            their random generators; new ones get fresh ones (`Worker._restore`).
    """

    old_world_size: int
    new_world_size: int
    before: tuple[Instance, ...]
    after: tuple[Instance, ...]
    sources: tuple[int, ...]

    @property
    def joined(self) -> tuple[int, ...]:
        """New ranks that take another worker's state: new ones, and old ones whose instance changed."""
        return tuple(rank for rank, source in enumerate(self.sources) if source != rank)

    def describe(self) -> list[str]:
        """The plan in a few lines, for the log."""
        before = {inst.id: inst for inst in self.before}
        lines = [
            f"instance {inst.id}: workers {list(before[inst.id].workers)} -> {list(inst.workers)}, request "
            f"{inst.batch_size} per worker"
            for inst in sorted(self.after, key=lambda x: x.id)
        ]
        if self.joined:
            taken = ", ".join(f"rank {rank} from rank {self.sources[rank]}" for rank in self.joined)
            lines.append(f"inner optimizer state (AdamW) of its instance's first worker: {taken}")
        fresh = range(self.old_world_size, self.new_world_size)
        if fresh:
            lines.append(f"fresh random generators: rank(s) {', '.join(map(str, fresh))}")
        return lines


def plan_elastic_resume(
    instances: list[Instance], old_world_size: int, new_world_size: int, *, max_request: int | None = None
) -> ElasticPlan:
    """The instance table and state sources for `new_world_size` workers (pure; the same on every rank).

    Args:
        instances: the checkpoint's instance table.
        old_world_size: the number of workers that wrote it.
        new_world_size: this run's.
        max_request: a worker's new data shard (map-style data): a larger request is lowered to it.
    """
    after = reassign_workers(instances, new_world_size)
    if max_request is not None:
        after = [replace(inst, batch_size=min(inst.batch_size, max_request)) for inst in after]
    before = {inst.id: inst for inst in instances}
    sources = []
    for rank in range(new_world_size):
        inst = instance_of(after, rank)
        kept = rank < old_world_size and rank in before[inst.id].workers
        sources.append(rank if kept else before[inst.id].first_worker)
    return ElasticPlan(old_world_size, new_world_size, tuple(instances), tuple(after), tuple(sources))


def _load(checkpoint_dir: str, rank: int) -> dict[str, Any]:
    """One old worker's state, memory-mapped: only the entries used are read from disk."""
    path = rank_state_path(checkpoint_dir, rank)
    state = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    if state.get("version") != RANK_STATE_VERSION:
        raise ValueError(f"{path} has state version {state.get('version')}, expected {RANK_STATE_VERSION}")
    return state


def checkpoint_instances(checkpoint_dir: str) -> tuple[int, list[Instance]] | None:
    """(workers, instance table) of a checkpoint, from its `adloco/rank-0.pt`; None when it has no readable one
    (`checkpoint.check_rank_states` then says what is wrong)."""
    try:
        state = _load(checkpoint_dir, 0)
        workers = int(state["world_size"]) // int(state.get("processes_per_worker", 1))
        return workers, [Instance.from_row(row) for row in state["instances"]]
    except Exception:  # noqa: BLE001 - missing or unreadable: refused later, with the reason
        return None


def check_instances_fit(checkpoint_dir: str, world_size: int) -> None:
    """Refuse, before training, a resume with fewer workers than the checkpoint has instances."""
    found = checkpoint_instances(checkpoint_dir)
    if found is None or len(found[1]) <= world_size:
        return
    old, instances = found
    name, k = os.path.basename(os.path.normpath(checkpoint_dir)), len(instances)
    raise ValueError(
        f"{name} holds {k} instances but this run has {world_size} worker(s): every instance needs a worker. Resume "
        f"with at least {k} workers, or merge down first: resume with the checkpoint's {old} workers until merges "
        f"(merge_every) leave at most {world_size} instance(s), then resume that checkpoint with {world_size}."
    )


def elastic_rank_state(checkpoint_dir: str, rank: int, world_size: int) -> dict[str, Any]:
    """The resume state of process `rank` of `world_size` from a checkpoint written by another number of workers,
    in the format `Worker.state_dict` writes, with an `elastic` entry describing the change (`Worker._restore`).

    Reads rank 0's file for the shared fields, the source process's (`ElasticPlan.sources`, in workers: process
    (w, l) of the new run takes the state of process (source of w, l) of the old one) for φ, momentum and the inner
    optimizer, and the sampler entry of every old process's file for the data re-split (over processes: with
    `processes_per_worker` = G each process draws its own part, G per worker).
    """
    first = _load(checkpoint_dir, 0)
    old_world_size = int(first["world_size"])
    g = int(first.get("processes_per_worker", 1))  # the run's own G: a change is refused by run_settings
    if world_size % g:
        raise ValueError(
            f"{checkpoint_dir} was written with processes_per_worker={g}: launch a multiple of {g} processes"
        )
    old_workers, new_workers = old_world_size // g, world_size // g
    name = os.path.basename(os.path.normpath(checkpoint_dir))
    states = [first] + [_load(checkpoint_dir, r) for r in range(1, old_world_size)]
    inside = [r for r, state in enumerate(states) if state.get("round") is not None]
    if inside:
        raise ValueError(
            f"{name} was written inside a round (at a preemption), where every worker holds its own weights: those "
            f"cannot be split or joined over another number of workers. Resume it with its {old_world_size} "
            f"workers, or resume an earlier checkpoint written at a round's end (a step that is a multiple of "
            f"inner_steps) with {world_size}"
        )
    samplers = [state["sampler"] for state in states]
    if samplers[0].get("kind") == "stream":
        resharded, shard = reshard_stream_states(samplers, world_size), None  # a stream bounds no request
    else:
        resharded = AdaptiveBatchSampler.reshard_sampler_states(samplers, world_size)
        shard = g * (int(samplers[0]["num_samples"]) // world_size)  # a worker's: G processes' shards
    instances = [Instance.from_row(row) for row in first["instances"]]
    plan = plan_elastic_resume(instances, old_workers, new_workers, max_request=shard)
    source = states[plan.sources[rank // g] * g + rank % g]
    return {
        **source,
        "world_size": world_size,
        "rank": rank,
        "instances": [inst.to_row() for inst in plan.after],
        "sampler": resharded[rank],
        "rng": states[rank]["rng"] if rank < old_world_size else None,
        "round": None,
        "elastic": {
            "checkpoint": name,
            "from_workers": old_workers,
            "to_workers": new_workers,
            "processes_per_worker": g,
            "workers_before": {str(inst.id): list(inst.workers) for inst in plan.before},
            "workers_after": {str(inst.id): list(inst.workers) for inst in plan.after},
            "optimizer_sources": list(plan.sources),
            "lines": plan.describe(),
        },
    }
