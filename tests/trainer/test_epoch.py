"""The epoch AdLoCo reports (`TrainerState.epoch`, in the logs): the data training consumed, not steps over max_steps
(issue 38: a 77-step run over 8 % of the data printed `epoch 1`)."""

from helpers import rounds_of, sequence_dataset, tiny_model, tiny_run_config, word_tokenizer, write_c4_shards

from adloco_hf import AdLoCoTrainer
from adloco_hf.data import PackedStream, load_document_stream


def test_the_epoch_is_the_fraction_of_the_data_consumed(tmp_path):
    data = sequence_dataset(512)
    args = tiny_run_config(tmp_path, max_steps=12, per_device_train_batch_size=2, max_batch_size=4, eta=0.5)
    trainer = AdLoCoTrainer(model=tiny_model(), args=args, train_dataset=data)
    trainer.train()
    samples = sum(line["samples"] for line in rounds_of(args.output_dir))
    assert samples > 2 * 12  # the request grew: samples, not steps, count
    assert trainer.state.epoch == samples / 512 < 0.2
    assert trainer.state.log_history[-1]["epoch"] == samples / 512  # what the run's last log line says


def test_a_stream_reports_the_passes_its_part_finished(tmp_path):
    files, _ = write_c4_shards(tmp_path / "shards", 4, 10)
    documents = load_document_stream("allenai/c4", data_files=files)
    stream = PackedStream(documents, word_tokenizer(num_documents=40), block_size=16, tokenize_documents=1)
    args = tiny_run_config(tmp_path, max_steps=12, batch_size_test="none")
    trainer = AdLoCoTrainer(model=tiny_model(), args=args, train_dataset=stream)
    trainer.train()
    reference = stream.split_by_node(0, 1)
    for _ in range(12 * 4):
        reference.next_example()
    assert reference.reading_pass == 2  # 48 blocks of 16 tokens: the 40 documents read twice and more
    assert trainer.state.epoch == 2.0
