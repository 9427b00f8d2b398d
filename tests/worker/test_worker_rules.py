"""`Worker.rules` is built once and rebuilt only when one of its inputs changes; the replica is chosen once."""

from types import SimpleNamespace

from adloco_hf import AdLoCoConfig, Worker
from adloco_hf.worker.ddp import DDPReplica


def worker(tmp_path, **kwargs) -> Worker:
    args = AdLoCoConfig(
        output_dir=str(tmp_path / "out"),
        max_steps=12,
        inner_steps=6,
        per_device_train_batch_size=4,
        max_batch_size=8,
        use_cpu=True,
        report_to=[],
        save_strategy="no",
        **kwargs,
    )
    return Worker(args)


def test_the_rules_are_built_once_and_again_only_when_an_input_changes(tmp_path):
    w = worker(tmp_path)
    w.max_batch_size, w._sampler = 8, SimpleNamespace(shard_size=100)
    rules = w.rules
    assert rules.max_batch_size == 8 and rules.controller.cap == 100
    assert w.rules is rules  # the same object on every read
    w._sampler.shard_size = 30  # a re-sharded sampler (another number of workers)
    assert w.rules is not rules and w.rules.controller.cap == 30
    rules = w.rules
    w.max_batch_size = 16  # restored from a checkpoint
    assert w.rules is not rules and w.rules.max_batch_size == 16
    w._sampler = SimpleNamespace(shard_size=None)  # a stream has no shard: only batch_size_cap caps a request
    assert w.rules.controller.cap is None


def test_one_process_per_worker_is_a_whole_replica(tmp_path):
    w = worker(tmp_path)
    assert isinstance(w.replica, DDPReplica) and not w.fsdp and w.intra_group is None
    assert not w.replica.keeps_local_gradients and w.replica.reports_statistics
