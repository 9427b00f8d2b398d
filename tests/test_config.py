import pytest
from transformers import HfArgumentParser

from adloco_hf import AdLoCoConfig


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
        (dict(average_tokens_across_devices=True), "average_tokens_across_devices"),
        (dict(ignore_data_skip=False), "ignore_data_skip"),
        (dict(dataloader_num_workers=2), "dataloader_num_workers"),
        (dict(save_steps=15), "save_steps"),
        (dict(eval_strategy="steps", eval_steps=25), "eval_steps"),
        (dict(save_strategy="epoch"), "save_strategy"),
        (dict(eval_strategy="epoch"), "eval_strategy"),
        (dict(load_best_model_at_end=True, eval_strategy="steps", eval_steps=20), "load_best_model_at_end"),
    ],
)
def test_bad_values_name_the_field(tmp_path, kwargs, field):
    with pytest.raises(ValueError, match=field):
        make(tmp_path, **kwargs)


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
    assert (args.num_instances, args.outer_nesterov, args.batch_size_cap, args.pseudo_grad_dtype) == (
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
    settings = make(tmp_path, num_instances=3).adloco_settings
    assert settings["num_instances"] == 3 and settings["inner_steps"] == 10
