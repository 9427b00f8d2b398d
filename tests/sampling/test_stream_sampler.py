"""Batches of any size from a stream (`adloco_hf.sampling.stream_sampler`), drawn one per step, with an exact position."""

import types

import pytest
import torch
from helpers import word_tokenizer, write_c4_shards
from transformers import default_data_collator

from adloco_hf import AdLoCoConfig
from adloco_hf.data import PackedStream, load_document_stream
from adloco_hf.rounds.rules import RoundRules, RoundSettings
from adloco_hf.sampling.sampler import AdaptiveBatchSampler
from adloco_hf.sampling.stream_sampler import AdaptiveStreamSampler, adaptive_stream_loader, check_sampler_kind


@pytest.fixture(scope="module")
def stream(tmp_path_factory):
    files, _ = write_c4_shards(tmp_path_factory.mktemp("shards"), 4, 10)
    return PackedStream(load_document_stream("allenai/c4", data_files=files), word_tokenizer(), block_size=8)


class CountingPart:
    """Counts the examples drawn from a real part."""

    def __init__(self, part):
        self.part, self.pulled = part, 0

    def next_example(self):
        self.pulled += 1
        return self.part.next_example()

    def state_dict(self):
        return self.part.state_dict()

    def load_state_dict(self, state):
        self.part.load_state_dict(state)


SIZES = [2, 2, 5, 1, 7, 3, 3]


def draw(sampler, sizes):
    out = []
    for size in sizes:
        sampler.batch_size = size
        out.append(torch.stack([example["input_ids"] for example in sampler.next_batch()]))
    return out


def test_a_new_batch_size_applies_to_the_next_batch(stream):
    sampler = AdaptiveStreamSampler(stream.split_by_node(0, 2), batch_size=2)
    assert [len(batch) for batch in draw(sampler, SIZES)] == SIZES
    assert sampler.shard_size is None and sampler.samples == sum(SIZES)
    with pytest.raises(ValueError, match="batch_size must be a positive integer, got 0"):
        sampler.batch_size = 0


@pytest.mark.parametrize("stop", [1, 3, 5])
def test_a_saved_sampler_resumes_the_same_batches(stream, stop):
    reference = draw(AdaptiveStreamSampler(stream.split_by_node(1, 2), batch_size=2), SIZES)
    sampler = AdaptiveStreamSampler(stream.split_by_node(1, 2), batch_size=2)
    draw(sampler, SIZES[:stop])
    state = sampler.state_dict()
    assert state["kind"] == "stream" and state["samples"] == sum(SIZES[:stop])
    resumed = AdaptiveStreamSampler(stream.split_by_node(1, 2), batch_size=9)
    resumed.load_state_dict(state)
    assert resumed.batch_size == SIZES[stop - 1]
    assert all(torch.equal(a, b) for a, b in zip(draw(resumed, SIZES[stop:]), reference[stop:], strict=True))


def test_the_loader_cuts_one_batch_per_step(stream):
    loader = adaptive_stream_loader(stream, default_data_collator, batch_size=3, num_workers=2, rank=0)
    sampler = loader.adaptive_sampler
    sampler.part = counting = CountingPart(sampler.part)
    batches = iter(loader)
    assert next(batches)["input_ids"].shape == (3, 8) and counting.pulled == 3  # nothing drawn ahead
    sampler.batch_size = 5  # as a round's end does: the very next batch has the new size
    assert next(batches)["input_ids"].shape == (5, 8) and counting.pulled == 8
    assert next(iter(loader))["input_ids"].shape == (5, 8) and counting.pulled == 13  # iter() again continues


def test_probing_draws_no_training_data(stream):
    loader = adaptive_stream_loader(stream, default_data_collator, batch_size=2, num_workers=2, rank=1)
    sampler = loader.adaptive_sampler
    reference = AdaptiveStreamSampler(stream.split_by_node(1, 2), batch_size=2)
    probe = sampler.probe_examples(6)
    assert len(probe) == 6 and torch.equal(probe[0]["input_ids"], reference.next_batch()[0]["input_ids"])
    assert sampler.samples == 0
    assert torch.equal(sampler.next_batch()[0]["input_ids"], probe[0]["input_ids"])  # training starts at the start


def test_a_checkpoint_of_the_other_kind_is_refused(stream):
    streamed = AdaptiveStreamSampler(stream.split_by_node(0, 1), batch_size=2)
    mapped = AdaptiveBatchSampler(10, batch_size=2)
    with pytest.raises(ValueError, match="saved with a streamed train_dataset, but this run has a map-style"):
        check_sampler_kind(streamed.state_dict(), mapped)
    with pytest.raises(ValueError, match="saved with a map-style train_dataset .*, but this run has a streamed"):
        check_sampler_kind(mapped.state_dict(), streamed)
    check_sampler_kind(streamed.state_dict(), streamed)
    check_sampler_kind(mapped.state_dict(), mapped)


def test_a_stream_caps_batch_requests_by_batch_size_cap_only(tmp_path):
    args = AdLoCoConfig(output_dir=str(tmp_path), use_cpu=True, report_to=[], max_steps=10, inner_steps=5)
    assert (
        RoundRules.from_args(
            args, settings=RoundSettings.from_args(args), max_batch_size=4, shard_size=None
        ).controller.cap
        is None
    )
    assert (
        RoundRules.from_args(
            args, settings=RoundSettings.from_args(args), max_batch_size=4, shard_size=50
        ).controller.cap
        == 50
    )
    capped = types.SimpleNamespace(**{**vars(args), "batch_size_cap": 32})
    assert (
        RoundRules.from_args(
            capped, settings=RoundSettings.from_args(capped), max_batch_size=4, shard_size=None
        ).controller.cap
        == 32
    )
    assert (
        RoundRules.from_args(
            capped, settings=RoundSettings.from_args(capped), max_batch_size=4, shard_size=20
        ).controller.cap
        == 20
    )
