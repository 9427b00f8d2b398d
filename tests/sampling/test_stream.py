"""A worker's part of a streamed dataset (`adloco_hf.sampling.stream_parts`): layouts, passes and an exact position, on real
`datasets` streams over local JSON-lines shards in C4's schema."""

import io
import logging

import datasets
import pytest
import torch
from datasets.distributed import split_dataset_by_node
from helpers import write_c4_shards

from adloco_hf.sampling.stream_parts import StreamPart, worker_stream


def load(files):
    return datasets.load_dataset("json", data_files=files, split="train", streaming=True)


def ids(examples):
    return [example["text"].split()[0] for example in examples]


def pull(part, n):
    return ids(part.next_example() for _ in range(n))


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    return write_c4_shards(tmp_path_factory.mktemp("shards"), 4, 10)  # d0..d39, 10 per file


@pytest.mark.parametrize("world_size", [1, 2, 4])
def test_shard_layout_is_split_dataset_by_node_when_the_shards_divide(shards, world_size):
    files, _ = shards
    for rank in range(world_size):
        part = StreamPart(load(files), rank=rank, world_size=world_size)
        reference = ids(split_dataset_by_node(load(files), rank=rank, world_size=world_size))
        assert part.layout == "shards"
        assert pull(part, len(reference)) == reference


def test_uneven_shards_still_go_by_file_and_cover_every_document_once(shards):
    files, docs = shards
    parts = [StreamPart(load(files), rank=rank, world_size=3) for rank in range(3)]
    per_pass = [20, 10, 10]  # rank 0 reads files 0 and 3
    read = [pull(part, n) for part, n in zip(parts, per_pass)]
    assert read[0] == [f"d{k}" for k in list(range(0, 10)) + list(range(30, 40))]
    assert sorted(sum(read, []), key=lambda d: int(d[1:])) == [d.split()[0] for d in docs]
    assert pull(parts[1], 2) == ["d10", "d11"] and parts[1].epoch == 1  # the next pass starts over its file


def test_stride_layout_with_fewer_shards_than_workers(shards):
    files, _ = shards
    for rank in range(6):
        part = StreamPart(load(files), rank=rank, world_size=6)
        reference = ids(split_dataset_by_node(load(files), rank=rank, world_size=6))
        assert part.layout == "stride" and len(reference) in (6, 7)
        assert pull(part, len(reference) + 2) == reference + reference[:2]  # then the next pass


@pytest.mark.parametrize("world_size", [2, 6])
@pytest.mark.parametrize("stop", [0, 3, 10, 19, 20, 27, 45])  # start, mid-shard, shard edge, pass edge, next pass
def test_a_saved_position_resumes_exactly(shards, world_size, stop):
    files, _ = shards
    rank = 1
    reference = pull(StreamPart(load(files), rank=rank, world_size=world_size), stop + 15)
    part = StreamPart(load(files), rank=rank, world_size=world_size)
    assert pull(part, stop) == reference[:stop]
    buffer = io.BytesIO()
    torch.save({"stream": part.state_dict()}, buffer)
    buffer.seek(0)
    state = torch.load(buffer, weights_only=True)["stream"]  # plain types: a checkpoint loads it safely

    resumed = StreamPart(load(files), rank=rank, world_size=world_size)
    resumed.load_state_dict(state)
    # Saved again before the first pull (a checkpoint right after a resume): still the loaded position.
    again = StreamPart(load(files), rank=rank, world_size=world_size)
    again.load_state_dict(resumed.state_dict())
    assert pull(again, 15) == reference[stop:]
    assert pull(resumed, 15) == reference[stop:]


def test_another_number_of_workers_or_shards_is_refused(shards):
    files, _ = shards
    part = StreamPart(load(files), rank=0, world_size=2)
    pull(part, 3)
    with pytest.raises(ValueError, match="world_size=2, but this run has world_size=4"):
        StreamPart(load(files), rank=0, world_size=4).load_state_dict(part.state_dict())
    with pytest.raises(ValueError, match="num_shards=4, but this run has num_shards=2"):
        StreamPart(load(files[:2]), rank=0, world_size=2).load_state_dict(part.state_dict())


def test_an_empty_part_is_a_clear_error(tmp_path):
    files, _ = write_c4_shards(tmp_path, 1, 2)
    part = StreamPart(load(files), rank=2, world_size=3)
    with pytest.raises(ValueError, match="rank 2's part of the training stream .* has no example in a whole pass"):
        part.next_example()


def test_a_shuffle_buffer_is_warned_about(shards, caplog):
    files, _ = shards
    with caplog.at_level(logging.WARNING, logger="adloco_hf.sampling.stream_parts"):
        StreamPart(load(files), rank=0, world_size=2)
        assert "shuffle" not in caplog.text
        StreamPart(load(files).shuffle(seed=0, buffer_size=8), rank=0, world_size=2)
    assert "datasets does not restore the buffer" in caplog.text


class CountingStream(torch.utils.data.IterableDataset):
    """A user's stream with its own position."""

    def __init__(self):
        self.position = 0

    def __iter__(self):
        while self.position < 5:
            self.position += 1
            yield {"x": self.position}

    def state_dict(self):
        return {"position": self.position}

    def load_state_dict(self, state):
        self.position = state["position"]


def test_worker_stream_takes_user_streams_with_state_and_refuses_others(shards):
    files, _ = shards
    assert isinstance(worker_stream(load(files), 0, 2), StreamPart)
    part = worker_stream(CountingStream(), 0, 1)
    assert [part.next_example()["x"] for _ in range(3)] == [1, 2, 3] and part.state_dict() == {"position": 3}

    class NoState(torch.utils.data.IterableDataset):
        def __iter__(self):
            yield {"x": 1}

    with pytest.raises(ValueError, match="without state_dict\\(\\)/load_state_dict\\(\\)"):
        worker_stream(NoState(), 0, 2)


# ---- an elastic resume: the stream re-split over another number of workers ----
def read(parts, draws, records):
    """Pull `draws[r]` examples from part r, recording (pass, document) of each."""
    for part, n in zip(parts, draws):
        for _ in range(n):
            doc = ids([part.next_example()])[0]
            records.append((part.reading_pass, doc))


def finish_bridge(parts, last, records):
    """Pull from every new part until it leaves the passes up to `last` (its first example of pass last + 1 is
    not recorded)."""
    for part in parts:
        while True:
            doc = ids([part.next_example()])[0]
            if part.reading_pass > last:
                break
            records.append((part.reading_pass, doc))


def reshard(files, parts, world_size):
    states = StreamPart.reshard_states([part.state_dict() for part in parts], world_size)
    new = [StreamPart(load(files), rank=rank, world_size=world_size) for rank in range(world_size)]
    for part, state in zip(new, states):
        part.load_state_dict(state)
    return new, max(state["epoch"] for state in states)


def assert_every_pass_read_once(records, last, docs):
    for epoch in range(last + 1):
        read_in_pass = sorted(doc for e, doc in records if e == epoch)
        assert read_in_pass == sorted(d.split()[0] for d in docs), f"pass {epoch}"


@pytest.mark.parametrize(
    "num_shards, old, new, draws",
    [
        (4, 4, 2, [3, 10, 0, 15]),  # rank 3 is 5 documents into pass 1, rank 2 has read nothing
        (4, 2, 4, [7, 25]),
        (4, 3, 5, [4, 12, 30]),  # shards (one rank has 2 files) -> stride (5 workers, 4 files)
        (2, 3, 2, [2, 7, 12]),  # stride -> shards
        (2, 3, 4, [9, 0, 5]),  # stride -> stride with another stride
        (4, 2, 2, [5, 13]),  # the same number: a bridge as well (what an elastic resume of 2 → 2 would do)
    ],
)
def test_a_re_split_stream_reads_every_document_of_each_started_pass_once(tmp_path, num_shards, old, new, draws):
    files, docs = write_c4_shards(tmp_path, num_shards, 40 // num_shards)
    parts = [StreamPart(load(files), rank=rank, world_size=old) for rank in range(old)]
    records = []
    read(parts, draws, records)
    buffer = io.BytesIO()
    torch.save([part.state_dict() for part in parts], buffer)  # the states a checkpoint holds
    buffer.seek(0)
    saved = torch.load(buffer, weights_only=True)
    states = StreamPart.reshard_states(saved, new)
    assert [(s["rank"], s["world_size"]) for s in states] == [(r, new) for r in range(new)]
    resumed = [StreamPart(load(files), rank=rank, world_size=new) for rank in range(new)]
    for part, state in zip(resumed, states):
        part.load_state_dict(state)
    last = max(state["epoch"] for state in states)
    assert last == max(part.epoch for part in parts)
    finish_bridge(resumed, last, records)
    assert_every_pass_read_once(records, last, docs)
    # After the bridge: the new layout, pass last + 1 split between the new parts without overlap.
    fresh = [StreamPart(load(files), rank=rank, world_size=new) for rank in range(new)]
    assert [part.describe() for part in resumed] == [part.describe() for part in fresh]


def test_a_nested_re_split_and_a_resume_inside_the_bridge_stay_exact(tmp_path):
    files, docs = write_c4_shards(tmp_path, 4, 10)
    parts = [StreamPart(load(files), rank=rank, world_size=4) for rank in range(4)]
    records = []
    read(parts, [3, 10, 0, 15], records)
    parts, _ = reshard(files, parts, 2)  # 4 -> 2
    read(parts, [4, 2], records)  # inside the bridge
    resumed = []
    for part in parts:  # a checkpoint inside the bridge, resumed with the same 2 workers
        copy = StreamPart(load(files), rank=part.rank, world_size=2)
        copy.load_state_dict(part.state_dict())
        resumed.append(copy)
    uninterrupted = [pull(part, 6) for part in parts]
    read(resumed, [6, 6], records)
    assert [doc for _, doc in records[-12:]] == uninterrupted[0] + uninterrupted[1]
    parts, last = reshard(files, resumed, 3)  # 2 -> 3, while still in the first bridge
    assert last == 1
    finish_bridge(parts, last, records)
    assert_every_pass_read_once(records, last, docs)
