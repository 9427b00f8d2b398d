"""`adloco_hf.checkpoint.elastic`: the plan of an elastic resume (pure) and each new rank's state from real rank files."""

import os

import pytest
import torch

from adloco_hf.checkpoint.elastic import check_instances_fit, elastic_rank_state, plan_elastic_resume
from adloco_hf.checkpoint.folders import save_rank_state
from adloco_hf.instances.table import Instance, initial_instances
from adloco_hf.sampling.sampler import AdaptiveBatchSampler
from adloco_hf.sampling.stream_parts import StreamPart


NUM_SAMPLES = 40


def table(*specs):
    """(id, workers, batch) tuples → instances."""
    return [Instance(i, tuple(w), b) for i, w, b in specs]


# ---- the plan ----
def test_new_ranks_take_their_instance_first_workers_state():
    plan = plan_elastic_resume(table((0, [0], 4), (1, [1], 4)), 2, 4)
    assert [inst.workers for inst in plan.after] == [(0, 2), (1, 3)]
    assert plan.sources == (0, 1, 0, 1) and plan.joined == (2, 3)
    assert plan.describe() == [
        "instance 0: workers [0] -> [0, 2], request 4 per worker",
        "instance 1: workers [1] -> [1, 3], request 4 per worker",
        "inner optimizer state (AdamW) of its instance's first worker: rank 2 from rank 0, rank 3 from rank 1",
        "fresh random generators: rank(s) 2, 3",
    ]


def test_workers_that_stay_keep_their_own_state_and_moved_ones_take_the_first_workers():
    # 3 → 2 workers: instance 1 loses rank 2 and gets rank 1, which leaves instance 0 (its seats fall to 1).
    before = table((0, [0, 1], 2), (1, [2], 2))
    plan = plan_elastic_resume(before, 3, 2)
    assert [inst.workers for inst in plan.after] == [(0,), (1,)]
    assert plan.sources == (0, 2) and plan.joined == (1,)
    four_to_two = plan_elastic_resume(initial_instances(4, 2, 3), 4, 2)
    assert four_to_two.sources == (0, 1) and four_to_two.joined == ()
    assert [inst.demand for inst in four_to_two.after] == [6.0, 6.0]  # demands kept (b × the old workers)


def test_a_request_above_the_new_shard_is_lowered_to_it():
    plan = plan_elastic_resume(table((0, [0], 16), (1, [1], 3)), 2, 4, max_request=10)
    assert [inst.batch_size for inst in plan.after] == [10, 3]
    assert [inst.demand for inst in plan.after] == [16.0, 3.0]


# ---- each new rank's state, from rank files written as a worker writes them ----
def write_checkpoint(folder, old_world_size, num_instances, *, draws, round_state=None):
    """Rank files of `old_world_size` workers at a round's end; worker r has drawn `draws[r]` samples."""
    instances = initial_instances(old_world_size, num_instances, 2)
    for rank in range(old_world_size):
        sampler = AdaptiveBatchSampler(NUM_SAMPLES, batch_size=draws[rank] or 1, num_workers=old_world_size, rank=rank)
        if draws[rank]:
            sampler.next_batch()
        inst = next(i for i in instances if rank in i.workers)
        state = {
            "world_size": old_world_size,
            "rank": rank,
            "outer_step": 2,
            "last_synced_step": 10,
            "instances": [i.to_row() for i in instances],
            "max_batch_size": 8,
            "base_lrs": [1e-3],
            "base_adam": [],
            "global_model": {"phi": torch.full((3,), float(inst.id)), "momentum": torch.zeros(3)},
            "inner_optimizer": {"state": {0: {"exp_avg": torch.full((3,), float(rank))}}, "param_groups": []},
            "sampler": sampler.state_dict(),
            "scaler": None,
            "totals": {"tokens": 100, "comm_bytes": 0, "merges": 0, "skipped_rounds": 0, "elapsed": 1.0},
            "rng": {"cpu": torch.full((2,), rank, dtype=torch.uint8)},
            "round": round_state if rank == old_world_size - 1 else None,
        }
        save_rank_state(str(folder), rank, state)
    return str(folder)


def test_each_new_rank_gets_its_instances_state_and_its_part_of_the_data(tmp_path):
    folder = write_checkpoint(tmp_path / "checkpoint-10", 2, 2, draws=[7, 3])
    states = [elastic_rank_state(folder, rank, 4) for rank in range(4)]
    old_samplers = [torch.load(os.path.join(folder, "adloco", f"rank-{r}.pt"))["sampler"] for r in range(2)]
    resharded = AdaptiveBatchSampler.reshard_sampler_states(old_samplers, 4)
    for rank, state in enumerate(states):
        assert (state["world_size"], state["rank"], state["round"]) == (4, rank, None)
        assert [row[3] for row in state["instances"]] == [[0, 2], [1, 3]]
        assert torch.equal(state["global_model"]["phi"], torch.full((3,), float(rank % 2)))  # the instance's φ
        assert torch.equal(state["inner_optimizer"]["state"][0]["exp_avg"], torch.full((3,), float(rank % 2)))
        assert state["sampler"]["rank"] == rank and state["sampler"]["bridge_pos"] == 0
        assert torch.equal(state["sampler"]["bridge_indices"], resharded[rank]["bridge_indices"])
        assert (state["outer_step"], state["last_synced_step"], state["max_batch_size"]) == (2, 10, 8)
        assert state["elastic"]["from_workers"] == 2 and state["elastic"]["optimizer_sources"] == [0, 1, 0, 1]
    assert [s["rng"] is None for s in states] == [False, False, True, True]  # new ranks get fresh generators


def test_a_checkpoint_written_inside_a_round_is_refused(tmp_path):
    folder = write_checkpoint(tmp_path / "checkpoint-12", 2, 1, draws=[2, 2], round_state={"loss_steps": 2})
    with pytest.raises(
        ValueError,
        match="checkpoint-12 was written inside a round .* resume an earlier checkpoint written at a round's end",
    ):
        elastic_rank_state(folder, 0, 4)


def test_a_streamed_train_dataset_is_re_split_and_a_user_stream_is_refused(tmp_path):
    folder = write_checkpoint(tmp_path / "checkpoint-10", 2, 1, draws=[2, 2])
    streams = [{"kind": "stream", "batch_size": 2, "samples": 4, "stream": part_state(r, 2)} for r in range(2)]
    for rank, sampler in enumerate(streams):
        state = torch.load(os.path.join(folder, "adloco", f"rank-{rank}.pt"))
        rows = [[row[0], 30, *row[2:]] for row in state["instances"]]  # above a 4-way map-style shard of 40
        save_rank_state(folder, rank, {**state, "sampler": sampler, "instances": rows})
    states = [elastic_rank_state(folder, rank, 4) for rank in range(4)]
    expected = StreamPart.reshard_states([sampler["stream"] for sampler in streams], 4)
    assert [state["sampler"]["stream"] for state in states] == expected
    assert [state["sampler"]["samples"] for state in states] == [4, 4, 0, 0]
    assert [row[1] for row in states[0]["instances"]] == [30]  # a stream bounds no request

    for rank in range(2):
        state = torch.load(os.path.join(folder, "adloco", f"rank-{rank}.pt"))
        own = {**streams[rank], "stream": {"position": 7}}  # a user's stream with its own state_dict
        save_rank_state(folder, rank, {**state, "sampler": own})
    with pytest.raises(
        ValueError, match="keeps its own position and cannot be re-split .* resume with the checkpoint"
    ):
        elastic_rank_state(folder, 0, 4)


def part_state(rank, world_size):
    """The state of a real StreamPart over 4 shard indices (only the state is needed, not the files)."""
    return {
        "kind": "datasets-part", "layout": "shards", "num_shards": 4, "world_size": world_size, "rank": rank,
        "epoch": 0, "kept": 3,
        "pieces": [{"pass": 0, "shards": [shard], "modulus": 1, "residue": 0, "rows": 0, "seen": 0, "inner": None}
                   for shard in range(rank, 4, world_size)],
    }  # fmt: skip


def test_more_instances_than_workers_is_refused_with_merge_down_first(tmp_path):
    folder = write_checkpoint(tmp_path / "checkpoint-10", 4, 4, draws=[1, 1, 1, 1])
    check_instances_fit(folder, 4)
    with pytest.raises(ValueError) as error:
        check_instances_fit(folder, 2)
    assert str(error.value).startswith("checkpoint-10 holds 4 instances but this run has 2 worker(s)")
    assert "merge down first: resume with the checkpoint's 4 workers until merges (merge_every)" in str(error.value)
    check_instances_fit(str(tmp_path / "not-adloco"), 1)  # no rank files: `check_rank_states` says why later


def test_workers_of_two_processes_resume_elastically_in_whole_workers(tmp_path):
    # 2 workers × 2 processes (instances 0: worker 0, 1: worker 1) resumed as 3 workers × 2 processes.
    folder = str(tmp_path / "checkpoint-10")
    instances = initial_instances(2, 2, 4)
    for rank in range(4):
        sampler = AdaptiveBatchSampler(NUM_SAMPLES, batch_size=2, num_workers=4, rank=rank)
        sampler.next_batch()
        worker = rank // 2
        save_rank_state(folder, rank, {
            "world_size": 4, "rank": rank, "processes_per_worker": 2, "outer_step": 2, "last_synced_step": 10,
            "instances": [i.to_row() for i in instances], "max_batch_size": 8, "base_lrs": [1e-3], "base_adam": [],
            "global_model": {"phi": torch.full((3,), float(worker)), "momentum": torch.zeros(3)},
            "inner_optimizer": {"state": {0: {"exp_avg": torch.full((3,), float(rank))}}, "param_groups": []},
            "sampler": sampler.state_dict(), "scaler": None,
            "totals": {"tokens": 100, "comm_bytes": 0, "merges": 0, "skipped_rounds": 0, "elapsed": 1.0},
            "rng": {"cpu": torch.full((2,), rank, dtype=torch.uint8)}, "round": None,
        })  # fmt: skip
    assert check_instances_fit(folder, 2) is None
    states = [elastic_rank_state(folder, rank, 6) for rank in range(6)]
    after = {row[0]: row[3] for row in states[0]["instances"]}
    assert sorted(w for workers in after.values() for w in workers) == [0, 1, 2]  # worker ids, not ranks
    for rank, state in enumerate(states):
        worker, local = divmod(rank, 2)
        instance = next(i for i, workers in after.items() if worker in workers)
        # The same local rank of the instance's old first worker (worker `instance`), or its own state if it stays.
        assert torch.equal(state["inner_optimizer"]["state"][0]["exp_avg"], torch.full((3,), 2.0 * instance + local))
        assert torch.equal(state["global_model"]["phi"], torch.full((3,), float(instance)))
        assert (state["sampler"]["rank"], state["sampler"]["num_workers"]) == (rank, 6)  # re-split over processes
    elastic = states[0]["elastic"]
    assert (elastic["from_workers"], elastic["to_workers"], elastic["processes_per_worker"]) == (2, 3, 2)
    with pytest.raises(ValueError, match="launch a multiple of 2 processes"):
        elastic_rank_state(folder, 0, 5)
