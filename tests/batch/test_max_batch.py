"""max_batch_size='auto': the search on CPU with a synthetic limit, and the real probe on CUDA."""

import pytest
import torch
from helpers import sequence_dataset, tiny_model

from adloco_hf import AdLoCoConfig, AdLoCoTrainer
from adloco_hf.batch.max_batch import find_max_batch_size, is_out_of_memory, search_max_batch_size
from adloco_hf.config.choices import CPU_AUTO_MAX_BATCH_SIZE


@pytest.mark.parametrize("limit", [0, 1, 2, 3, 7, 64, 100, 4095, 4096, 5000])
def test_search_finds_the_largest_size_that_fits(limit):
    tried = []

    def fits(size):
        tried.append(size)
        return size <= limit

    assert search_max_batch_size(fits, upper=4096) == min(limit, 4096)
    assert len(tried) <= 26  # doubling then bisection: logarithmic in the answer


def test_out_of_memory_errors_are_recognised_and_others_are_not():
    assert is_out_of_memory(torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"))
    assert is_out_of_memory(RuntimeError("CUDA out of memory"))
    assert not is_out_of_memory(RuntimeError("shape mismatch"))


def test_auto_on_cpu_is_the_documented_default(tmp_path):
    args = AdLoCoConfig(
        output_dir=str(tmp_path), max_steps=2, inner_steps=1, use_cpu=True, report_to=[], save_strategy="no"
    )
    trainer = AdLoCoTrainer(model=tiny_model(), args=args, train_dataset=sequence_dataset(64))
    trainer.train()
    assert trainer.worker.max_batch_size == CPU_AUTO_MAX_BATCH_SIZE
    assert (
        find_max_batch_size(lambda size: None, device=torch.device("cpu"), memory_fraction=0.9, reserve_bytes=0) == 32
    )


@pytest.mark.cuda
def test_auto_max_batch_on_cuda_fits_and_follows_the_memory_budget(tmp_path):
    def found_with(fraction):
        args = AdLoCoConfig(
            output_dir=str(tmp_path / str(fraction)), max_steps=2, inner_steps=1, report_to=[], save_strategy="no",
            max_batch_size="auto", memory_fraction=fraction, per_device_train_batch_size=1,
        )  # fmt: skip
        model = tiny_model(hidden_size=256, layers=4, vocab_size=64)
        trainer = AdLoCoTrainer(model=model, args=args, train_dataset=sequence_dataset(4096, length=64))
        trainer.train()
        found = trainer.worker.max_batch_size
        trainer.run_probe_step(found)  # the size it chose really runs
        torch.cuda.synchronize()
        return found

    large, small = found_with(0.9), found_with(0.02)
    print(f"auto max_batch_size on {torch.cuda.get_device_name()}: {large} (90% of free memory), {small} (2%)")
    assert large >= 1 and small >= 1
    assert large > small


def test_the_probe_step_runs_on_a_stream_without_drawing_training_data(tmp_path):
    """What max_batch_size='auto' runs on CUDA, on a streamed train_dataset: real blocks from a fresh part of the
    stream through forward and backward, the training position untouched."""
    from helpers import word_tokenizer, write_c4_shards

    from adloco_hf.data import PackedStream, load_document_stream

    files, _ = write_c4_shards(tmp_path / "shards", 2, 10)
    stream = PackedStream(load_document_stream("allenai/c4", data_files=files), word_tokenizer(), block_size=16)
    args = AdLoCoConfig(
        output_dir=str(tmp_path / "out"), max_steps=2, inner_steps=1, use_cpu=True, report_to=[], save_strategy="no"
    )
    trainer = AdLoCoTrainer(model=tiny_model(vocab_size=1100), args=args, train_dataset=stream)
    trainer.train()
    before = trainer.train_sampler.state_dict()
    trainer.run_probe_step(5)
    after = trainer.train_sampler.state_dict()
    assert after["samples"] == before["samples"] == 2 * args.per_device_train_batch_size
    assert torch.equal(after["stream"]["carry"], before["stream"]["carry"])
    assert after["stream"]["source"] == before["stream"]["source"]
    assert all(p.grad is None for p in trainer.model.parameters())
