"""DataLoader worker processes with batch sizes that change (`adloco_hf.sampling.prefetch`): real loader processes
draw ahead, a change of size re-plans what they drew, and every step gets the batch of a loader without them."""

import os
import pickle

import pytest
import torch
from helpers import word_tokenizer, write_c4_shards
from torch.utils.data import Dataset
from transformers import default_data_collator

from adloco_hf.data import PackedStream, load_document_stream
from adloco_hf.sampling.prefetch import LoaderSettings
from adloco_hf.sampling.sampler import AdaptiveBatchSampler, adaptive_train_loader
from adloco_hf.sampling.stream_sampler import AdaptiveStreamSampler, StreamExamples, adaptive_stream_loader


# After the batch of step k is received, the batch size becomes SCHEDULE[k] (as a round's end sets it): growing,
# shrinking, twice within one prefetch window, to 1 and back.
SCHEDULE = {0: 3, 2: 5, 3: 2, 7: 7, 8: 1, 9: 6, 12: 4}
STEPS = 16
LOADERS = {
    "none": LoaderSettings(),
    "1x1": LoaderSettings(num_workers=1, prefetch_factor=1),
    "2x2": LoaderSettings(num_workers=2, prefetch_factor=2),
    "2x3-persistent": LoaderSettings(num_workers=2, prefetch_factor=3, persistent_workers=True),
}


class Indices(Dataset):
    def __len__(self):
        return 90

    def __getitem__(self, index):
        return index


def collate_indices(items):
    return {"indices": torch.tensor(items), "pid": os.getpid()}


def collate_blocks(examples):
    return {**default_data_collator(examples), "pid": os.getpid()}


def sizes_of_steps(initial: int) -> list[int]:
    sizes, size = [], initial
    for step in range(STEPS):
        sizes.append(size)
        size = SCHEDULE.get(step, size)
    return sizes


def run(loader, steps=STEPS, start=0):
    """Train-loop stand-in: one batch per step, the schedule applied after it; (batches, pids, states)."""
    sampler, batches, pids, states = loader.adaptive_sampler, [], [], []
    received = iter(loader)
    for step in range(start, steps):
        batch = next(received)
        batches.append(batch)
        pids.append(batch["pid"])
        if step in SCHEDULE:
            sampler.batch_size = SCHEDULE[step]
        states.append(sampler.state_dict())
    return batches, pids, states


def map_loader(settings, **kwargs):
    return adaptive_train_loader(
        Indices(), collate_indices, batch_size=2, num_workers=2, rank=1, seed=4, loader=settings, **kwargs
    )


def map_reference():
    """What a sampler drawn one batch per step gives: the batches and the state after each."""
    sampler = AdaptiveBatchSampler(90, batch_size=2, num_workers=2, rank=1, seed=4)
    batches, states = [], []
    for size in sizes_of_steps(2):
        sampler.batch_size = size
        batches.append(sampler.next_batch())
        states.append(sampler.state_dict())
    for state, step in zip(states, range(STEPS)):
        state["batch_size"] = SCHEDULE.get(step, state["batch_size"])  # the size set after the step
    return batches, states


def same_state(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(
        torch.equal(a[k], b[k]) if isinstance(a[k], torch.Tensor) else a[k] == b[k] for k in a
    )


@pytest.mark.parametrize("name", LOADERS)
def test_map_style_batches_and_positions_match_a_loader_without_processes(name):
    settings = LOADERS[name]
    batches, pids, states = run(map_loader(settings))
    expected, expected_states = map_reference()
    assert [b["indices"].tolist() for b in batches] == expected
    assert all(same_state(a, b) for a, b in zip(states, expected_states, strict=True))
    assert sum(len(b) for b in expected) > 45  # the shard's pass ended within the run
    if settings.num_workers:
        # The loader processes collated every batch, the same processes before and after every change of size.
        assert len(set(pids)) == settings.num_workers and os.getpid() not in pids
    else:
        assert set(pids) == {os.getpid()}


def test_a_change_of_size_re_plans_only_the_batches_in_flight():
    loader = map_loader(LoaderSettings(num_workers=2, prefetch_factor=2))
    sampler = loader.adaptive_sampler
    received = iter(loader)
    next(received)
    assert len(sampler._in_flight) == 4  # 2 processes × prefetch 2 drawn ahead at the old size
    sampler.batch_size = 2  # the same size: nothing to re-plan
    assert len(sampler._in_flight.live()) == 4
    sampler.batch_size = 5
    assert len(sampler._in_flight) == 4 and not sampler._in_flight.live()  # stale: dropped as they arrive
    assert next(received)["indices"].shape == (5,)
    assert len(sampler._in_flight.live()) == 4  # one refill, at the new size


@pytest.mark.parametrize("name", ["2x2", "2x3-persistent"])
def test_a_new_iteration_and_a_resume_continue_from_what_training_received(name):
    settings = LOADERS[name]
    expected, expected_states = map_reference()
    loader = map_loader(settings)
    batches, _, _ = run(loader, steps=5)
    again, _, _ = run(loader, steps=9, start=5)  # iter(loader) again: the prefetched batches are drawn again
    assert [b["indices"].tolist() for b in batches + again] == expected[:9]
    resumed = map_loader(settings)
    resumed.adaptive_sampler.load_state_dict(expected_states[8])
    tail, _, _ = run(resumed, start=9)
    assert [b["indices"].tolist() for b in tail] == expected[9:]


@pytest.fixture(scope="module")
def stream(tmp_path_factory):
    files, _ = write_c4_shards(tmp_path_factory.mktemp("shards"), 4, 10)
    return PackedStream(load_document_stream("allenai/c4", data_files=files), word_tokenizer(), block_size=8)


def stream_loader(stream, settings):
    return adaptive_stream_loader(stream, collate_blocks, batch_size=2, num_workers=2, rank=1, loader=settings)


def continuation(stream, state, sizes=(3, 4)) -> list[torch.Tensor]:
    """The batches a sampler resumed from `state` draws next."""
    sampler = AdaptiveStreamSampler(stream.split_by_node(1, 2), batch_size=1)
    sampler.load_state_dict(state)
    out = []
    for size in sizes:
        sampler.batch_size = size
        out.append(torch.stack([example["input_ids"] for example in sampler.next_batch()]))
    return out


@pytest.mark.parametrize("name", ["none", "2x2", "2x3-persistent"])
def test_stream_batches_and_positions_match_a_loader_without_processes(stream, name):
    settings = LOADERS[name]
    loader = stream_loader(stream, settings)
    sampler = loader.adaptive_sampler
    rebuilt = []
    fresh_part = sampler._fresh_part
    sampler._fresh_part = lambda: rebuilt.append(1) or fresh_part()
    batches, pids, states = run(loader)
    reference = AdaptiveStreamSampler(stream.split_by_node(1, 2), batch_size=2)
    for step, (batch, size) in enumerate(zip(batches, sizes_of_steps(2), strict=True)):
        reference.batch_size = size
        expected = torch.stack([example["input_ids"] for example in reference.next_batch()])
        assert torch.equal(batch["input_ids"], expected), step
        state = states[step]
        assert state["samples"] == reference.samples == state["stream"]["blocks"]
        assert torch.equal(state["stream"]["carry"], reference.state_dict()["stream"]["carry"])
        assert state["stream"]["source"] == reference.state_dict()["stream"]["source"], step
        assert all(
            torch.equal(a, b)
            for a, b in zip(continuation(stream, state), continuation(stream, reference.state_dict()))
        )
    assert reference.part.source.reading_pass >= 1  # the part's shards ended within the run: the next pass began
    if settings.num_workers:
        assert len(set(pids)) == settings.num_workers and os.getpid() not in pids
        # After a change of size the position behind the part's was rebuilt by reading forward from a kept state.
        assert rebuilt
    else:
        assert set(pids) == {os.getpid()} and not rebuilt


class TensorStream(torch.utils.data.IterableDataset):
    """A user's stream (it keeps its own position) whose examples hold tensors of several dtypes and plain values."""

    def __init__(self):
        self.count = 0

    def __iter__(self):
        while True:
            self.count += 1
            k = self.count
            yield {
                "input_ids": torch.arange(k, k + 4),
                "weights": torch.full((2, 3), k / 7, dtype=torch.float32).t(),  # not contiguous
                "mask": torch.tensor([k % 2 == 0, True]),
                "soft": torch.full((2,), k / 3, dtype=torch.bfloat16),  # no numpy dtype: sent as a tensor
                "label": k,
            }

    def state_dict(self):
        return {"count": self.count}

    def load_state_dict(self, state):
        self.count = state["count"]


def same_examples(a: list, b: list) -> bool:
    return len(a) == len(b) and all(
        x.keys() == y.keys()
        and x["label"] == y["label"]
        and all(torch.equal(x[k], y[k]) and x[k].dtype == y[k].dtype for k in x if k != "label")
        for x, y in zip(a, b)
    )


def test_stream_examples_reach_the_loader_processes_unchanged():
    examples = iter(TensorStream())
    batch = StreamExamples(next(examples) for _ in range(3))
    assert same_examples(batch, pickle.loads(pickle.dumps(batch)))
    plain, prefetched = (
        next(iter(adaptive_stream_loader(TensorStream(), list, batch_size=3, num_workers=1, rank=0, loader=settings)))
        for settings in (LoaderSettings(), LoaderSettings(num_workers=2))
    )
    assert same_examples(plain, prefetched) and len(plain) == 3
