"""`Worker.rules` is built once and rebuilt only when one of its inputs changes; the replica is chosen once."""

from adloco_hf import AdLoCoConfig, Worker
from adloco_hf.rounds.rules import RoundRulesCache, RoundSettings
from adloco_hf.worker.replicas.ddp import DDPReplica


def config(tmp_path, **kwargs) -> AdLoCoConfig:
    return AdLoCoConfig(
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


def worker(tmp_path, **kwargs) -> Worker:
    return Worker.from_args(config(tmp_path, **kwargs))


def test_the_rules_are_built_once_and_again_only_when_an_input_changes(tmp_path):
    args = config(tmp_path)
    cache = RoundRulesCache(args, RoundSettings.from_args(args))
    rules = cache.get(max_batch_size=8, shard_size=100)
    assert rules.switch.max_batch_size == 8 and rules.controller.cap == 100
    assert cache.get(max_batch_size=8, shard_size=100) is rules  # the same object on every read
    resharded = cache.get(max_batch_size=8, shard_size=30)  # a re-sharded sampler (another number of workers)
    assert resharded is not rules and resharded.controller.cap == 30
    restored = cache.get(max_batch_size=16, shard_size=30)  # restored from a checkpoint
    assert restored is not resharded and restored.switch.max_batch_size == 16
    # A stream has no shard: only batch_size_cap caps a request.
    assert cache.get(max_batch_size=16, shard_size=None).controller.cap is None


def test_one_process_per_worker_is_a_whole_replica(tmp_path):
    w = worker(tmp_path)
    assert isinstance(w.replica, DDPReplica) and not w.fsdp and w.intra_group is None
    assert not w.replica.keeps_local_gradients and w.replica.reports_statistics


def test_a_worker_bounds_its_store_calls_by_twice_its_worker_timeout_from_its_creation(tmp_path):
    """The trainer builds its worker before its first store call (`watch_exit`): from there every call to the job's
    store is bounded (common/job_store.py), by twice the run's `worker_timeout`, or by `peer_timeout` where the peer
    watch is on (common/liveness.py: the others name this worker after it)."""
    from adloco_hf.common import job_store

    worker(tmp_path, worker_timeout=12.0, ddp_timeout=12)  # the watch off: worker_timeout names within a minute
    assert job_store._bound == 24.0
    worker(tmp_path, worker_timeout=40.0, ddp_timeout=40)  # a second run of the process: its own bound
    assert job_store._bound == 80.0
    built = worker(tmp_path)  # the defaults: worker_timeout 1800, the watch on at 45 s
    assert job_store._bound == 45.0 and built.settings.peer_timeout == 45.0
    worker(tmp_path, peer_timeout=0)
    assert job_store._bound == 3600.0
