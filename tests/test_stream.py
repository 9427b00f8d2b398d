"""A worker's part of a streamed dataset (`adloco_hf.stream`): layouts, passes and an exact position, on real
`datasets` streams over local JSON-lines shards in C4's schema."""

import io
import logging

import datasets
import pytest
import torch
from datasets.distributed import split_dataset_by_node
from helpers import write_c4_shards

from adloco_hf.stream import StreamPart, worker_stream


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
    with caplog.at_level(logging.WARNING, logger="adloco_hf.stream"):
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
