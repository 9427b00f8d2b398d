import logging
import types

import pytest
from transformers import HfArgumentParser, TrainingArguments

from adloco_hf import AdLoCoConfig
from adloco_hf.config import compat


def make(tmp_path, **kwargs):
    base = dict(output_dir=str(tmp_path), max_steps=40, inner_steps=10, save_steps=20, use_cpu=True, report_to=[])
    base.update(kwargs)
    return AdLoCoConfig(**base)


def test_defaults_are_valid_and_decouple_the_workers(tmp_path):
    args = AdLoCoConfig(output_dir=str(tmp_path), max_steps=400, use_cpu=True, report_to=[])
    assert args.average_tokens_across_devices is False
    assert args.ignore_data_skip is True
    assert args.save_steps % args.inner_steps == 0
    assert args.eval_steps == args.inner_steps
    assert (args.outer_lr, args.outer_momentum, args.outer_nesterov) == (0.7, 0.9, True)
    assert args.max_batch_size == "auto"


@pytest.mark.parametrize(
    ("kwargs", "target"),
    [
        (dict(), "goodput"),  # the default: the goodput rule on the norm test's statistics
        (dict(batch_size_test="norm"), "goodput"),
        (dict(batch_size_test="none"), "test"),  # DiLoCo's fixed batch: no statistics for the rule to read
        (dict(batch_size_test="inner_product"), "test"),  # a test the user chose keeps its own request
        (dict(batch_size_test="augmented_inner_product"), "test"),
        (dict(batch_size_target="test"), "test"),  # the paper's norm test, one setting away
        (dict(batch_size_target="noise_scale"), "noise_scale"),
    ],
)
def test_the_default_batch_size_target_is_the_goodput_rule_where_the_norm_test_measures(tmp_path, kwargs, target):
    args = make(tmp_path, **kwargs)
    assert args.batch_size_target == target
    # resolved when built: the JSON (and a checkpoint's settings) name the rule that ran, and rebuilding keeps it
    assert args.to_dict()["batch_size_target"] == target
    assert make(tmp_path, **{**kwargs, "batch_size_target": args.batch_size_target}).batch_size_target == target


def test_the_default_batch_size_target_is_auto_on_the_command_line(tmp_path):
    (args,) = HfArgumentParser(AdLoCoConfig).parse_args_into_dataclasses(
        ["--output_dir", str(tmp_path), "--max_steps", "40", "--inner_steps", "10", "--use_cpu", "--report_to", "none"]
    )
    assert args.batch_size_target == "goodput"
    (args,) = HfArgumentParser(AdLoCoConfig).parse_args_into_dataclasses(
        [
            "--output_dir",
            str(tmp_path),
            "--max_steps",
            "40",
            "--inner_steps",
            "10",
            "--use_cpu",
            "--report_to",
            "none",
            "--batch_size_target",
            "test",
        ]
    )
    assert args.batch_size_target == "test"


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        (dict(max_steps=-1), "max_steps"),
        (dict(max_steps=0), "max_steps"),
        (dict(gradient_accumulation_steps=4), "gradient_accumulation_steps"),
        (dict(inner_steps=0), "inner_steps"),
        (dict(eta=0.0), "eta"),
        (dict(theta=-1.0), "theta"),
        (dict(nu=0.0), "nu"),
        (dict(switch_threshold=0.5), "switch_threshold"),
        (dict(merge_policy="random"), "merge_policy"),
        (dict(merge_transport="ring"), "merge_transport"),
        (dict(merge_payload="fp8"), "merge_payload"),
        (dict(instance_init="zeros"), "instance_init"),
        (dict(batch_size_test="variance"), "batch_size_test"),
        (dict(pseudo_grad_dtype="int8"), "pseudo_grad_dtype"),
        (dict(outer_state_device="disk"), "outer_state_device"),
        (dict(lr_batch_scaling="cubic"), "lr_batch_scaling"),
        (dict(outer_lr=0.0), "outer_lr"),
        (dict(outer_momentum=1.0), "outer_momentum"),
        (dict(num_instances=0), "num_instances"),
        (dict(merge_every=-1), "merge_every"),
        (dict(max_batch_size="lots"), "max_batch_size"),
        (dict(max_batch_size=0), "max_batch_size"),
        (dict(per_device_train_batch_size=4, batch_size_cap=2), "batch_size_cap"),
        (dict(memory_fraction=1.5), "memory_fraction"),
        (dict(max_skipped_rounds=-1), "max_skipped_rounds"),
        (dict(average_tokens_across_devices=True), "average_tokens_across_devices"),
        (dict(ignore_data_skip=False), "ignore_data_skip"),
        (dict(dataloader_num_workers=-1), "dataloader_num_workers"),
        pytest.param(
            dict(dataloader_num_workers=2, dataloader_in_order=False),
            "dataloader_in_order",
            marks=pytest.mark.skipif(
                "dataloader_in_order" not in TrainingArguments.__dataclass_fields__,
                reason="a field of newer transformers",
            ),
        ),
        (dict(dataloader_persistent_workers=True), "dataloader_persistent_workers"),
        (dict(save_steps=15), "save_steps"),
        (dict(eval_strategy="steps", eval_steps=25), "eval_steps"),
        (dict(save_strategy="epoch"), "save_strategy"),
        (dict(eval_strategy="epoch"), "eval_strategy"),
        (dict(load_best_model_at_end=True, eval_strategy="steps", eval_steps=20), "load_best_model_at_end"),
        (dict(goodput_hysteresis=1.0), "goodput_hysteresis"),
        (dict(goodput_hysteresis=-0.1), "goodput_hysteresis"),
        (dict(batch_size_target="goodput", batch_size_cap=64, batch_size_test="none"), "batch_size_test"),
    ],
)
def test_bad_values_name_the_field(tmp_path, kwargs, field):
    with pytest.raises(ValueError, match=field):
        make(tmp_path, **kwargs)


def test_dataloader_worker_processes_are_accepted(tmp_path):
    # Refused before issue 38 (prefetched batches had the old size): now re-planned exactly (tests/trainer/test_loader_processes.py).
    args = make(
        tmp_path,
        dataloader_num_workers=2,
        dataloader_prefetch_factor=3,
        dataloader_persistent_workers=True,
        dataloader_pin_memory=True,
    )
    assert (args.dataloader_num_workers, args.dataloader_prefetch_factor, args.dataloader_persistent_workers) == (
        2,
        3,
        True,
    )


def test_messages_say_how_to_fix(tmp_path):
    with pytest.raises(ValueError, match=r"k × 10"):
        make(tmp_path, save_steps=15)
    with pytest.raises(ValueError, match=r"choose one of \['smallest_pair', 'largest_smallest'\]"):
        make(tmp_path, merge_policy="random")


def test_command_line_parsing_of_adloco_fields(tmp_path):
    parser = HfArgumentParser(AdLoCoConfig)
    (args,) = parser.parse_args_into_dataclasses(
        [
            "--output_dir", str(tmp_path), "--max_steps", "60", "--inner_steps", "20", "--save_steps", "40",
            "--max_batch_size", "16", "--num_instances", "2", "--outer_nesterov", "false", "--use_cpu", "true",
            "--batch_size_cap", "64", "--pseudo_grad_dtype", "float16",
        ]
    )  # fmt: skip
    assert args.max_batch_size == 16 and isinstance(args.max_batch_size, int)
    # num_instances as parsed (this one process trains 1 of them: config/launch.py).
    assert (args.num_instances_asked, args.outer_nesterov, args.batch_size_cap, args.pseudo_grad_dtype) == (
        2,
        False,
        64,
        "float16",
    )
    (auto,) = parser.parse_args_into_dataclasses(
        ["--output_dir", str(tmp_path), "--max_steps", "400", "--use_cpu", "true"]
    )
    assert auto.max_batch_size == "auto"


def test_adloco_settings_for_model_cards(tmp_path):
    settings = make(tmp_path, num_instances=3, merge_every=5).adloco_settings
    assert settings["merge_every"] == 5 and settings["inner_steps"] == 10
    assert settings["num_instances"] == 1  # what one process trains (config/launch.py), as the cards say
    assert settings["merge_transport"] == "all_reduce"  # the default
    assert make(tmp_path, merge_transport="point_to_point").adloco_settings["merge_transport"] == "point_to_point"


@pytest.mark.parametrize(
    ("kwargs", "field", "instead"),
    [
        (dict(auto_find_batch_size=True), "auto_find_batch_size", "max_batch_size='auto'"),
        (dict(train_sampling_strategy="group_by_length"), "train_sampling_strategy", "random"),
        (dict(train_sampling_strategy="sequential"), "train_sampling_strategy", "random"),
        (dict(train_sampling_strategy="batch_rebalance"), "train_sampling_strategy", "random"),
        (dict(max_steps=40, inner_steps=50, save_steps=50), "inner_steps=50", "max_steps"),
        (dict(deepspeed={"zero_optimization": {"stage": 2}}), "deepspeed", "full copy of the model"),
        (dict(deepspeed="ds_config.json"), "deepspeed", "full copy of the model"),
        (dict(fsdp="full_shard"), "fsdp", "full copy of the model"),
        (dict(parallelism_config="dp_shard"), "parallelism_config", "full copy of the model"),
        (dict(enable_jit_checkpoint=True), "enable_jit_checkpoint", "save_steps"),
        (dict(optim="lomo"), "optim='lomo'", "adamw_torch"),
        (dict(optim="galore_adamw_layerwise"), "optim='galore_adamw_layerwise'", "adamw_torch"),
    ],
)
def test_options_adloco_cannot_honour_are_refused_with_what_to_use_instead(tmp_path, kwargs, field, instead):
    if kwargs.get("parallelism_config") == "dp_shard":
        from accelerate.parallelism_config import ParallelismConfig

        kwargs = dict(parallelism_config=ParallelismConfig(dp_shard_size=2))
    with pytest.raises(ValueError) as error:
        make(tmp_path, **kwargs)
    assert field in str(error.value) and instead in str(error.value)


@pytest.fixture
def adloco_records(records):
    compat._warned.clear()  # each test sees its own "once"
    return records


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        (dict(torch_compile=True), "torch_compile=True"),
        (dict(torch_compile_mode="reduce-overhead"), "torch_compile=True"),
        (dict(ddp_find_unused_parameters=False), "ddp_find_unused_parameters"),
        (dict(ddp_bucket_cap_mb=25), "ddp_bucket_cap_mb"),
        # switch mode runs requests of 9 to 16 as 8 and accumulates only above 16: this cap never accumulates
        (dict(batch_size_cap=16, max_batch_size=8), "batch_size_cap=16 with max_batch_size=8"),
    ],
)
def test_options_that_work_badly_or_not_at_all_warn_once(tmp_path, adloco_records, kwargs, words):
    make(tmp_path, **kwargs)
    make(tmp_path, **kwargs)
    warnings = [r for r in adloco_records.records if r.levelno == logging.WARNING and words in r.getMessage()]
    assert len(warnings) == 1, [r.getMessage() for r in adloco_records.records]


def test_the_cap_warning_counts_a_worker_s_processes(adloco_records):
    # G = 2 processes of at most 4 samples: a worker runs 8 at once and accumulates only above 16.
    settings = dict(max_batch_size=4, switch_threshold=2.0, processes_per_worker=2)
    compat.warn_about_a_cap_switch_mode_never_reaches(types.SimpleNamespace(batch_size_cap=8, **settings))
    assert not adloco_records.records
    compat.warn_about_a_cap_switch_mode_never_reaches(types.SimpleNamespace(batch_size_cap=12, **settings))
    (warning,) = adloco_records.records
    assert "of 9 to 16 samples per worker as 8" in warning.getMessage()


def test_plain_options_do_not_warn(tmp_path, adloco_records):
    make(tmp_path, gradient_checkpointing=True, neftune_noise_alpha=5.0, label_smoothing_factor=0.1)
    # caps that switch mode reaches: within max_batch_size, above switch_threshold × it, or accumulating from 9
    make(tmp_path, batch_size_cap=8, max_batch_size=8)
    make(tmp_path, batch_size_cap=17, max_batch_size=8)
    make(tmp_path, batch_size_cap=16, max_batch_size=8, switch_threshold=1.0)
    assert not [r for r in adloco_records.records if r.name.startswith("adloco_hf")]


def test_a_growing_h_needs_a_power_of_two_cap_that_divides_saves_and_evaluations(tmp_path):
    grow = dict(inner_steps_rule="outer_noise", save_steps=40)
    args = make(tmp_path, max_inner_steps=40, **grow)
    assert args.eval_steps == 40  # the default evaluation: every longest round
    for kwargs, message in [
        (dict(**grow), "set max_inner_steps to inner_steps × a power of 2 above 1 \\(e.g. max_inner_steps=40\\)"),
        (dict(max_inner_steps=30, **grow), "got 30"),
        (dict(max_inner_steps=10, **grow), "got 10"),
        (dict(max_inner_steps=40), "max_inner_steps=40 has no effect with inner_steps_rule='fixed'"),
        (
            dict(max_inner_steps=40, inner_steps_rule="outer_noise", save_steps=20),
            "save_steps=20 is not a multiple of",
        ),
        (dict(max_inner_steps=40, eval_strategy="steps", eval_steps=20, **grow), "eval_steps=20 is not a multiple of"),
        (dict(max_inner_steps=40, outer_overlap=True, **grow), "set outer_overlap=False or inner_steps_rule='fixed'"),
        (dict(max_inner_steps=40, outer_noise_theta=0.0, **grow), "outer_noise_theta=0.0: set a value > 0"),
        (dict(inner_steps_rule="grow"), "inner_steps_rule='grow' is not supported"),
    ]:
        with pytest.raises(ValueError, match=message):
            make(tmp_path, **kwargs)


def test_streaming_diloco_settings_are_checked_before_training(tmp_path):
    """num_fragments P ≤ H, the delay τ ≤ ⌊H/P⌋ (one average in flight at most), α in [0, 1], and the settings
    that cannot go with them; every message names the field and the fix. (inner_steps is 10 here.)"""
    args = make(tmp_path, num_fragments=4, fragment_sync_delay=2, fragment_update_alpha=0.5)
    assert (args.num_fragments, args.fragment_sync_delay, args.fragment_update_alpha) == (4, 2, 0.5)
    assert make(tmp_path, num_fragments=10, fragment_sync_delay=1).num_fragments == 10
    assert make(tmp_path, num_fragments=1, fragment_sync_delay=10).fragment_sync_delay == 10
    grow = dict(inner_steps_rule="outer_noise", max_inner_steps=40, save_steps=40)
    assert make(tmp_path, num_fragments=2, **grow).num_fragments == 2  # no delay: the outer noise is measured
    for kwargs, message in [
        (dict(num_fragments=0), "num_fragments=0: set an integer from 1 to inner_steps=10"),
        (dict(num_fragments=11), "num_fragments=11: set an integer from 1 to inner_steps=10"),
        (dict(num_fragments=2.5), "num_fragments=2.5"),
        (dict(num_fragments=4, fragment_sync_delay=3), r"fragment_sync_delay=3: .* 10 // 4 = 2"),
        (dict(num_fragments=4, fragment_sync_delay=-1), "fragment_sync_delay=-1"),
        (dict(num_fragments=4, fragment_update_alpha=1.5), r"fragment_update_alpha=1.5: set a value in \[0, 1\]"),
        (dict(fragment_sync_delay=2), "fragment_sync_delay=2 has no effect without fragments: set num_fragments"),
        (dict(fragment_update_alpha=0.5), "fragment_update_alpha=0.5 has no effect without fragments"),
        (dict(num_fragments=2, outer_overlap=True), "set outer_overlap=False"),
        (dict(num_fragments=2, worker_batch_split="speed"), "set worker_batch_split='equal' with num_fragments"),
        (dict(num_fragments=2, fragment_sync_delay=1, **grow), "set fragment_sync_delay=0 or inner_steps_rule="),
    ]:
        with pytest.raises(ValueError, match=message):
            make(tmp_path, **kwargs)
