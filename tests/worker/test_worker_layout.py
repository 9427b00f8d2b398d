"""Workers of several processes (`processes_per_worker`), the pure parts: the layout, the slices of the
pseudo-gradient, a round's decision over G reports per worker, and the configuration's refusals."""

import math
from dataclasses import replace

import pytest
from helpers import PAPER_ROUNDS, round_rules

from adloco_hf import AdLoCoConfig
from adloco_hf.batch.size_tests import GradientStatistics
from adloco_hf.checkpoint.run_settings import TRAJECTORY_FIELDS, compare_run_settings
from adloco_hf.common.layout import WorkerLayout, part_range, part_ranges
from adloco_hf.config.checks import check_processes_per_worker
from adloco_hf.instances.table import Instance, plan_merge
from adloco_hf.rounds.decision import decide_round
from adloco_hf.rounds.log_lines import run_summary
from adloco_hf.rounds.rows import WorkerReport
from adloco_hf.rounds.rules import RoundRules, RoundSettings


def test_consecutive_ranks_form_a_worker():
    layout = WorkerLayout(8, 4)
    assert layout.num_workers == 2
    assert [layout.worker_of(r) for r in range(8)] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert [layout.local_rank(r) for r in range(8)] == [0, 1, 2, 3, 0, 1, 2, 3]
    assert all(layout.rank(layout.worker_of(r), layout.local_rank(r)) == r for r in range(8))
    assert layout.ranks_of(1) == (4, 5, 6, 7)
    assert layout.ranks_of_workers([1, 0]) == tuple(range(8))
    assert layout.cross_ranks([0, 1], 2) == (2, 6)
    assert layout.intra_groups() == [(0, 1, 2, 3), (4, 5, 6, 7)]


def test_one_process_per_worker_is_the_identity():
    layout = WorkerLayout(3)
    assert layout.num_workers == 3
    assert [layout.worker_of(r) for r in range(3)] == [0, 1, 2]
    assert layout.cross_ranks([0, 2], 0) == (0, 2) == layout.ranks_of_workers([2, 0])


@pytest.mark.parametrize("world_size, g", [(6, 4), (4, 0)])
def test_a_layout_that_does_not_fit_is_refused(world_size, g):
    with pytest.raises(ValueError, match="processes_per_worker"):
        WorkerLayout(world_size, g)


@pytest.mark.parametrize("numel", [0, 1, 2, 5, 7, 1000, 1001])
@pytest.mark.parametrize("parts", [1, 2, 3, 4])
def test_the_slices_cover_the_vector_once(numel, parts):
    ranges = part_ranges(numel, parts)
    assert len(ranges) == parts
    assert ranges[0][0] == 0 and ranges[-1][1] == numel
    assert all(a1 == b0 for (_, b0), (a1, _) in zip(ranges, ranges[1:]))  # contiguous, in order
    assert sum(b - a for a, b in ranges) == numel
    size = math.ceil(numel / parts) if numel else 0
    assert all(b - a <= size for a, b in ranges)
    assert part_range(numel, parts, parts - 1) == ranges[-1]


def _rules(**overrides) -> RoundRules:
    """The paper's round end with two processes per worker, η = 0.5, max_batch_size 4 and no merges."""
    base = dict(
        PAPER_ROUNDS, eta=0.5, merge_every=0, max_skipped_rounds=None, per_device_train_batch_size=1, max_batch_size=4
    )
    return round_rules(**{**base, "processes_per_worker": 2, **overrides})


def _report(instance: int, *, payload: int, variance: float = 40.0, samples: float = 4.0) -> WorkerReport:
    return WorkerReport(
        instance=instance,
        stats=GradientStatistics(variance, math.nan, math.nan, 1.0, 0.01, samples),
        loss_sum=10.0,
        loss_steps=5,
        samples=20,
        tokens=100.0,
        pseudo_grad_norm=0.5,
        payload_bytes=payload,
        comm_seconds=0.01,
        outer_seconds=0.02,
        skipped=False,
    )


def test_a_round_of_two_workers_of_two_processes():
    numel = 1001  # an odd size: the slices are 501 and 500 elements, 4 bytes each in float32
    (a0, b0), (a1, b1) = part_ranges(numel, 2)
    reports = [_report(0, payload=4 * (b0 - a0)), _report(0, payload=4 * (b1 - a1))] * 2  # ranks 0..3
    instances = [Instance(0, (0, 1), 4)]  # two workers (ids), 4 samples per worker, 2 per process
    decision = decide_round(instances, reports, outer_step=1, global_step=10, rules=_rules())
    line = decision.lines[0]
    assert line.workers == [0, 1] and line.processes == [0, 1, 2, 3]
    assert line.stats_dof == 4  # every process's statistics pool: G × more groups
    assert line.samples == 4 * 20  # the instance's total over its four processes
    assert line.comm_bytes == 2 * (2 - 1) * 4 * numel  # two half payloads: the G = 1 ring bytes
    assert line.process_payload_bytes == [4 * 501, 4 * 500]
    assert line.micro_batch_size == 2 and line.batch_size_used == 4
    assert line.next_batch_size > 4 and line.next_batch_size % 2 == 0  # grown, and a multiple of G
    assert decision.instances[0].batch_size == line.next_batch_size
    json_line = line.to_json()
    assert json_line["processes_per_worker"] == 2 and json_line["processes"] == [0, 1, 2, 3]


def test_a_capped_request_counts_the_processes_micro_batches():
    reports = [_report(0, payload=8)] * 4
    instances = [Instance(0, (0, 1), 14)]  # 7 per process, above max_batch_size 4 but within 2 × 4: capped at 4
    line = decide_round(instances, reports, outer_step=1, global_step=10, rules=_rules()).lines[0]
    assert line.micro_batch_size == 4 and line.accumulation_steps == 1
    assert line.batch_size_used == 8


def test_switch_mode_accumulates_per_process_beyond_the_threshold():
    reports = [_report(0, payload=8)] * 4
    instances = [Instance(0, (0, 1), 20)]  # 10 per process, above 2 × max_batch_size 4: accumulate in 3 chunks
    line = decide_round(instances, reports, outer_step=1, global_step=10, rules=_rules()).lines[0]
    assert line.micro_batch_size == 4 and line.accumulation_steps == 3
    assert line.batch_size_used == 20  # the worker's whole request, G processes × 10


def test_one_process_per_worker_writes_the_rounds_file_as_before():
    reports = [_report(0, payload=8)] * 2
    rules = _rules(processes_per_worker=1)
    line = decide_round([Instance(0, (0, 1), 4)], reports, outer_step=1, global_step=10, rules=rules).lines[0]
    assert not {"processes", "processes_per_worker", "process_payload_bytes"} & set(line.to_json())
    assert line.comm_bytes == 2 * 8 and line.stats_dof == 2


def test_a_merge_of_two_workers_of_two_processes_plans_in_workers():
    reports = [_report(0, payload=8)] * 2 + [_report(1, payload=8)] * 2
    instances = [Instance(0, (0,), 4), Instance(1, (1,), 4)]
    decision = decide_round(instances, reports, outer_step=1, global_step=10, rules=_rules(merge_every=1))
    assert decision.merge is not None
    assert [inst.workers for inst in decision.instances] == [(0, 1)]
    assert [line.processes for line in decision.lines.values()] == [[0, 1], [2, 3]]


def test_preserve_total_keeps_requests_multiples_of_g():
    instances = [Instance(0, (0, 1), 6), Instance(1, (2,), 2), Instance(2, (3,), 2)]
    plan = plan_merge(
        instances, policy="smallest_pair", num_workers=4, batch_rule="preserve_total", processes_per_worker=2
    )
    assert all(inst.batch_size % 2 == 0 for inst in plan.after)


def test_the_summary_counts_workers():
    from adloco_hf.rounds.state import AdLoCoState

    state = AdLoCoState(1, 10, 100, 0, 0, 0, 1.0, 1, {0: 4}, {0: (0, 1)})
    summary = run_summary(state, 4, 2)
    assert summary["workers"] == 2 and summary["processes per worker"] == 2
    assert "processes per worker" not in run_summary(state, 4)


def test_a_resume_with_another_processes_per_worker_is_refused():
    assert "processes_per_worker" in TRAJECTORY_FIELDS
    saved = {"settings": {"processes_per_worker": 2}}
    refused, _ = compare_run_settings(saved, {"settings": {"processes_per_worker": 1}})
    assert [change.field for change in refused] == ["processes_per_worker"]


def _config(tmp_path, **fields):
    return AdLoCoConfig(output_dir=str(tmp_path), max_steps=10, inner_steps=5, use_cpu=True, **fields)


@pytest.mark.parametrize("g", [0, -1])
def test_processes_per_worker_below_one_is_refused(tmp_path, g):
    with pytest.raises(ValueError, match="processes_per_worker"):
        _config(tmp_path, processes_per_worker=g)


def test_processes_per_worker_must_divide_the_launch(tmp_path, monkeypatch):
    config = replace_fields(_config(tmp_path), processes_per_worker=4)  # validated alone: no process group here
    monkeypatch.setenv("WORLD_SIZE", "6")
    with pytest.raises(ValueError, match=r"processes_per_worker=4 does not divide the 6 processes"):
        check_processes_per_worker(config)


@pytest.mark.parametrize("name", ["batch_size_cap", "batch_size_floor"])
def test_per_worker_bounds_must_be_multiples_of_g(tmp_path, monkeypatch, name):
    config = replace_fields(_config(tmp_path), processes_per_worker=2, **{name: 9})
    monkeypatch.setenv("WORLD_SIZE", "4")
    with pytest.raises(ValueError, match=rf"{name}=9 is not a multiple of processes_per_worker=2"):
        check_processes_per_worker(config)


def test_outer_overlap_is_refused_with_several_processes_per_worker(tmp_path, monkeypatch):
    config = replace_fields(_config(tmp_path), processes_per_worker=2, outer_overlap=True)
    monkeypatch.setenv("WORLD_SIZE", "4")
    with pytest.raises(ValueError, match="outer_overlap=True is not supported with processes_per_worker=2"):
        check_processes_per_worker(config)


def test_fsdp_needs_several_processes_per_worker(tmp_path):
    with pytest.raises(ValueError, match="worker_parallelism='fsdp'.*processes_per_worker=1"):
        _config(tmp_path, worker_parallelism="fsdp")
    with pytest.raises(ValueError, match="worker_parallelism='zero'"):
        _config(tmp_path, worker_parallelism="zero")


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"fp16": True}, "fp16=True is not supported with worker_parallelism='fsdp'"),
        ({"per_device_train_batch_size": 1}, "per_device_train_batch_size >= 2"),
        ({"batch_size_floor": 2}, r"batch_size_floor >= 4 \(it is 2\)"),
    ],
)
def test_fsdp_refusals_name_the_field_and_the_fix(tmp_path, monkeypatch, fields, message):
    config = replace_fields(_config(tmp_path), processes_per_worker=2, worker_parallelism="fsdp", **fields)
    monkeypatch.setenv("WORLD_SIZE", "4")
    with pytest.raises(ValueError, match=message):
        check_processes_per_worker(config)
    replace_fields(config, batch_size_test="none", fp16=False)
    check_processes_per_worker(config)  # fixed batches need no statistics: accepted


def test_a_resume_with_another_worker_parallelism_is_refused():
    assert "worker_parallelism" in TRAJECTORY_FIELDS
    refused, _ = compare_run_settings(
        {"settings": {"worker_parallelism": "fsdp"}}, {"settings": {"worker_parallelism": "ddp"}}
    )
    assert [change.field for change in refused] == ["worker_parallelism"]


def test_sharding_options_point_at_processes_per_worker(tmp_path):
    with pytest.raises(ValueError, match="processes_per_worker=G"):
        _config(tmp_path, fsdp="full_shard")


def replace_fields(config, **fields):
    """A config with some fields set after validation (setting WORLD_SIZE for a whole __post_init__ would make
    TrainingArguments form a process group)."""
    for name, value in fields.items():
        object.__setattr__(config, name, value)
    return config


def test_rules_count_requests_per_worker(tmp_path):
    config = replace_fields(_config(tmp_path, per_device_train_batch_size=3), processes_per_worker=2)
    rules = RoundRules.from_args(config, settings=RoundSettings.from_args(config), max_batch_size=4, shard_size=10)
    assert rules.processes_per_worker == 2
    assert rules.controller.cap == 20  # the worker's shard: its two processes' shards
    assert rules.controller.floor == 6  # the initial request, 2 × per_device_train_batch_size
    assert rules.reference_batch_size == 3  # a process's, as the learning rate scaling compares it
    assert replace(rules, processes_per_worker=1).processes_per_worker == 1
