"""`adloco_hf.checkpoint.run_settings`: what a checkpoint records of its run, and which changes a resume refuses (pure)."""

import json
import logging
import os

import pytest
from helpers import tiny_model

from adloco_hf import AdLoCoConfig
from adloco_hf.checkpoint.run_settings import (
    ELASTIC_FIELDS,
    RESTORED_FIELDS,
    TRAJECTORY_FIELDS,
    Change,
    check_run_settings,
    compare_run_settings,
    elastic_changes,
    load_run_settings,
    model_settings,
    run_settings,
    save_run_settings,
)


BASE = dict(max_steps=30, inner_steps=5, save_steps=10, num_instances=1, per_device_train_batch_size=2, seed=3)


def config(tmp_path, **changes) -> AdLoCoConfig:
    return AdLoCoConfig(output_dir=str(tmp_path / "out"), use_cpu=True, report_to=[], **{**BASE, **changes})


def changes(tmp_path, model=None, new_model=None, resolved=None, **new):
    """(refused, restored) from a checkpoint of the base config (max_batch_size resolved as `resolved`) to `new`."""
    saved = run_settings(config(tmp_path), model or tiny_model(), max_batch_size=resolved)
    current = run_settings(config(tmp_path, **new), new_model or model or tiny_model())
    return compare_run_settings(saved, current)


# ---- the record ----
def test_the_record_holds_the_trajectory_the_restored_fields_and_the_model(tmp_path):
    record = run_settings(config(tmp_path, max_batch_size=8), tiny_model())
    settings = record["settings"]
    assert set(settings) == set(TRAJECTORY_FIELDS) | set(RESTORED_FIELDS) | set(ELASTIC_FIELDS)
    assert settings["inner_steps"] == 5 and settings["world_size"] == 1 and settings["max_batch_size"] == 8
    assert settings["data_seed"] is None and settings["batch_size_cap"] is None
    assert record["model"]["num_attention_heads"] == 4 and record["model"]["rope_parameters"]["rope_type"] == "default"
    for key in ("transformers_version", "_name_or_path", "dtype", "architectures", "use_cache"):
        assert key not in record["model"]
    json.dumps(record)  # plain JSON


def test_max_batch_size_is_recorded_as_resolved_and_auto_is_not_compared(tmp_path):
    args = config(tmp_path)  # max_batch_size="auto"
    assert run_settings(args, tiny_model(), max_batch_size=32)["settings"]["max_batch_size"] == 32
    assert "max_batch_size" not in run_settings(args, tiny_model())["settings"]
    assert changes(tmp_path, resolved=32) == ([], [])  # auto again: the checkpoint's value is kept
    assert changes(tmp_path, resolved=32, max_batch_size=32) == ([], [])
    refused, _ = changes(tmp_path, resolved=32, max_batch_size=16)
    assert refused == [Change("max_batch_size", 32, 16)]


def test_a_model_without_a_config_records_none(tmp_path):
    import torch

    assert model_settings(torch.nn.Linear(2, 2)) is None
    assert run_settings(config(tmp_path), torch.nn.Linear(2, 2))["model"] is None


def test_the_record_round_trips_through_run_json(tmp_path):
    record = run_settings(config(tmp_path), tiny_model())
    path = save_run_settings(str(tmp_path / "checkpoint-10"), record)
    assert path == os.path.join(str(tmp_path / "checkpoint-10"), "adloco", "run.json")
    assert load_run_settings(str(tmp_path / "checkpoint-10")) == record
    assert load_run_settings(str(tmp_path / "elsewhere")) is None


# ---- the comparison ----
def test_the_same_settings_compare_equal(tmp_path):
    assert changes(tmp_path) == ([], [])


@pytest.mark.parametrize(
    ("field", "new", "old_value"),
    [
        ("inner_steps", 10, 5),
        ("num_instances", 2, 1),
        ("merge_every", 2, 3),
        ("merge_policy", "largest_smallest", "smallest_pair"),
        ("batch_size_target", "test", "goodput"),  # the default "auto" is recorded as the rule that ran
        ("eta", 0.5, 0.8),
        ("batch_size_cap", 8, None),
        ("switch_threshold", 3.0, 2.0),
        ("pseudo_grad_dtype", "float32", "bfloat16"),
        ("outer_lr", 0.5, 0.7),
        ("outer_momentum", 0.0, 0.9),
        ("lr_batch_scaling", "sqrt", "none"),
        ("per_device_train_batch_size", 4, 2),
        ("seed", 4, 3),
        ("data_seed", 7, None),
    ],
)
def test_a_changed_trajectory_field_is_refused(tmp_path, field, new, old_value):
    refused, restored = changes(tmp_path, **{field: new})
    assert refused == [Change(field, old_value, new)] and restored == []


def test_a_changed_test_is_refused_with_the_rule_it_brings_under_the_default_target(tmp_path):
    # batch_size_target="auto" runs the goodput rule with the norm test and an inner-product test's own request
    refused, restored = changes(tmp_path, batch_size_test="inner_product")
    assert refused == [
        Change("batch_size_test", "norm", "inner_product"),
        Change("batch_size_target", "goodput", "test"),
    ]
    assert restored == []


def test_a_changed_restored_field_is_only_reported(tmp_path):
    refused, restored = changes(tmp_path, learning_rate=1e-2, weight_decay=0.1)
    assert refused == []
    assert restored == [Change("learning_rate", 5e-05, 1e-2), Change("weight_decay", 0.0, 0.1)]


def test_settings_that_may_change_are_not_compared(tmp_path):
    safe = dict(
        max_steps=60, save_steps=20, eval_steps=15, logging_steps=3, worker_timeout=60, save_merges=False,
        outer_state_device="cpu", memory_fraction=0.5, save_total_limit=2, lr_scheduler_type="cosine", warmup_steps=3,
    )  # fmt: skip
    assert changes(tmp_path, **safe) == ([], [])


def test_a_model_with_other_heads_but_the_same_shapes_is_refused(tmp_path):
    old, new = tiny_model(), tiny_model(num_attention_heads=2, num_key_value_heads=1)
    assert [p.shape for p in old.parameters()] == [p.shape for p in new.parameters()]
    refused, _ = changes(tmp_path, model=old, new_model=new)
    assert Change("model config num_attention_heads", 4, 2) in refused
    assert Change("model config num_key_value_heads", 2, 1) in refused
    assert Change("model config head_dim", 8, 16) in refused


def test_volatile_and_one_sided_keys_are_not_compared(tmp_path):
    model = tiny_model()
    saved = run_settings(config(tmp_path), model)
    model.config.use_cache = False
    model.config.architectures = ["LlamaForCausalLM"]
    current = run_settings(config(tmp_path), model)
    current["model"]["added_by_a_newer_library"] = 1
    del current["settings"]["seed"]  # an older record may lack a field
    saved["model"]["transformers_version"] = "4.0.0"
    assert compare_run_settings(saved, current) == ([], [])
    current["model"] = None  # nothing to compare the model with
    assert compare_run_settings(saved, current) == ([], [])


# ---- the check before a resume ----
def test_check_refuses_naming_every_changed_field_with_both_values(tmp_path):
    checkpoint = str(tmp_path / "checkpoint-10")
    save_run_settings(checkpoint, run_settings(config(tmp_path), tiny_model()))
    current = run_settings(config(tmp_path, inner_steps=3, save_steps=9, num_instances=2), tiny_model(hidden_size=48))
    with pytest.raises(ValueError) as error:
        check_run_settings(checkpoint, current)
    message = str(error.value)
    assert message.startswith(f"Resuming from {checkpoint} with settings that define the run changed: ")
    assert "inner_steps was 5 in the checkpoint, is 3 now" in message
    assert "num_instances was 1 in the checkpoint, is 2 now" in message
    assert "model config hidden_size was 32 in the checkpoint, is 48 now" in message
    assert "docs/resuming.md" in message


def test_check_accepts_a_new_learning_rate_with_a_warning(tmp_path, records):
    checkpoint = str(tmp_path / "checkpoint-10")
    save_run_settings(checkpoint, run_settings(config(tmp_path, learning_rate=3e-3), tiny_model()))
    check_run_settings(checkpoint, run_settings(config(tmp_path, learning_rate=1e-2, max_steps=50), tiny_model()))
    warnings = [r.getMessage() for r in records.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert warnings[0].startswith("learning_rate=0.01 differs from the checkpoint's 0.003")
    assert "the checkpoint's value goes on" in warnings[0]


def test_another_world_size_is_logged_not_refused(tmp_path, records):
    checkpoint = str(tmp_path / "checkpoint-10")
    saved = run_settings(config(tmp_path), tiny_model())
    saved["settings"]["world_size"] = 4  # written by 4 workers, resumed by this one
    save_run_settings(checkpoint, saved)
    current = run_settings(config(tmp_path), tiny_model())
    assert compare_run_settings(saved, current) == ([], [])
    assert elastic_changes(saved, current) == [Change("world_size", 4, 1)]
    check_run_settings(checkpoint, current)
    warnings = [r.getMessage() for r in records.records if r.levelno == logging.WARNING]
    assert warnings == [
        "world_size was 4 in the checkpoint, is 1 now: an elastic resume, every instance keeps its weights, momentum "
        "and request (docs/resuming.md)"
    ]


def test_check_of_a_checkpoint_without_a_record_warns(tmp_path, records):
    check_run_settings(str(tmp_path / "checkpoint-10"), run_settings(config(tmp_path), tiny_model()))
    assert any("has no adloco/run.json" in r.getMessage() for r in records.records)
