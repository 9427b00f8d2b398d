"""What `AdLoCoConfig` makes of the launch it runs in (`config/launch.py`) and of a field it does not have
(`config/field_names.py`): a new user's first mistakes (issue 41), each handled before any data is built."""

import dataclasses
import inspect
import json
import os
import subprocess
import sys

import pytest
from helpers import REPO, sequence_dataset, tiny_model
from transformers import HfArgumentParser

from adloco_hf import AdLoCoConfig, AdLoCoTrainer
from adloco_hf.config import compat


@pytest.fixture
def adloco_records(records):
    compat._warned.clear()  # each test sees its own "once"
    return records


def warnings_of(records) -> list[str]:
    return [r.getMessage() for r in records.records if r.levelname == "WARNING"]


def make(tmp_path, **kwargs) -> AdLoCoConfig:
    base = dict(output_dir=str(tmp_path / "out"), max_steps=20, inner_steps=5, use_cpu=True, report_to=[])
    return AdLoCoConfig(**(base | kwargs))


def test_one_process_trains_one_instance_and_says_how_to_launch_more(tmp_path, adloco_records):
    """`python train.py` of a script asking for 2 instances: one worker trains one instance (it was refused in
    `train()`, after the data was built), a WARNING names the launch of 2 workers, and the checkpoint records the 2
    asked for, so that the same script resumes the run."""
    args = make(tmp_path, num_instances=2, save_steps=10, per_device_train_batch_size=2, disable_tqdm=True)
    assert (args.num_instances, args.num_instances_asked) == (1, 2)
    (warning,) = [w for w in warnings_of(adloco_records) if w.startswith("num_instances=2")]
    assert "one process (`python train.py`): AdLoCoConfig sets num_instances=1" in warning, warning
    assert "accelerate launch --multi_gpu --num_processes 2 train.py" in warning
    assert "accelerate_configs/cpu_4_workers.yaml" in warning

    AdLoCoTrainer(model=tiny_model(), args=args, train_dataset=sequence_dataset(64)).train()
    rounds = [json.loads(line) for line in open(os.path.join(args.output_dir, "adloco_rounds.jsonl"))]
    assert {line["instance"] for line in rounds} == {0} and len(rounds) == 4
    run = json.loads(open(os.path.join(args.output_dir, "checkpoint-20", "adloco", "run.json")).read())
    assert run["settings"]["num_instances"] == 2  # what the script asks for: a resume compares it


def test_one_instance_asked_for_is_not_warned_about(tmp_path, adloco_records):
    args = make(tmp_path)
    assert (args.num_instances, args.num_instances_asked) == (1, 1)
    assert not [w for w in warnings_of(adloco_records) if "num_instances" in w]


def test_an_unknown_field_names_the_closest_ones(tmp_path):
    """Python's own error was `__init__() got an unexpected keyword argument 'inner_step'`."""
    with pytest.raises(TypeError) as error:
        make(tmp_path, inner_step=20)
    message = str(error.value)
    assert message.startswith("AdLoCoConfig has no field inner_step=20 (did you mean inner_steps"), message
    assert "docs/configuration.md" in message
    with pytest.raises(TypeError, match=r"no field evaluation_strategy='steps' \(did you mean eval_strategy"):
        make(tmp_path, evaluation_strategy="steps")  # TrainingArguments' name before transformers 5
    with pytest.raises(TypeError, match=r"no field zzz=1\. Its fields"):
        make(tmp_path, zzz=1)  # nothing close: no guess
    # The signature stays the dataclass's (IDEs, HfArgumentParser), and a dataclass built on it keeps its own __init__.
    assert "inner_steps" in inspect.signature(AdLoCoConfig).parameters

    @dataclasses.dataclass
    class MyConfig(AdLoCoConfig):
        my_option: int = 3

    mine = MyConfig(output_dir=str(tmp_path), max_steps=20, inner_steps=5, use_cpu=True, report_to=[], my_option=4)
    assert mine.my_option == 4
    (parsed,) = HfArgumentParser(AdLoCoConfig).parse_args_into_dataclasses(
        ["--output_dir", str(tmp_path), "--max_steps", "20", "--inner_steps", "5", "--use_cpu", "true"]
    )
    assert parsed.inner_steps == 5


def test_a_last_round_cut_short_is_warned_about(tmp_path, adloco_records):
    make(tmp_path, max_steps=45, inner_steps=10)
    (warning,) = [w for w in warnings_of(adloco_records) if w.startswith("max_steps=")]
    assert warning == (
        "max_steps=45 is not a multiple of inner_steps=10: 4 round(s) of 10 inner steps, then a last round of 5. "
        "Set max_steps=40 or 50 for whole rounds."
    )
    adloco_records.clear()
    make(tmp_path, max_steps=40, inner_steps=10)
    assert not [w for w in warnings_of(adloco_records) if w.startswith("max_steps=")]


def test_accelerate_launch_of_several_processes_without_multi_gpu_is_warned_about(tmp_path):
    """`accelerate launch --num_processes 2 train.py` without `--multi_gpu` runs ONE process (accelerate's simple
    launcher): it trained one worker, saying so only at INFO. Run as a user runs it, with the real launcher."""
    script = tmp_path / "train.py"
    script.write_text(
        "from adloco_hf import AdLoCoConfig\n"
        f"args = AdLoCoConfig(output_dir={str(tmp_path / 'out')!r}, max_steps=20, inner_steps=5, report_to=[])\n"
        "print('world size', args.world_size)\n"
    )
    env = os.environ | {"PYTHONPATH": REPO, "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-m", "accelerate.commands.launch", "--num_processes", "2", str(script)]
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=240)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert "world size 1" in output  # the launch it warns about: one process
    assert "accelerate launch started ONE process: this run trains a single worker" in output, output
    assert "accelerate launch --multi_gpu --num_processes N train.py" in output
    # The same script, run as one process on purpose, is not warned about.
    plain = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=240)
    assert plain.returncode == 0 and "ONE process" not in plain.stdout + plain.stderr, plain.stderr
