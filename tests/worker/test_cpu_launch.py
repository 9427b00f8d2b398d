"""Launching on a machine without a GPU: `accelerate launch --multi_gpu` forms one gloo group even when the user's
script leaves `use_cpu` unset, torchrun on a store of the workers' own forms it with `ddp_timeout`, and a launch of
one process asked for more instances says how to launch CPU workers."""

import json
import os
import sys

import pytest
import torch
from helpers import SCRIPTS, launch, run_launch, sequence_dataset, tiny_model

from adloco_hf import AdLoCoConfig, AdLoCoTrainer
from adloco_hf.config import compat
from adloco_hf.testing import launch_command


@pytest.mark.multiprocess
@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU launch path: without a GPU")
def test_multi_gpu_launch_without_use_cpu_forms_one_gloo_group(tmp_path):
    result = launch(os.path.join(SCRIPTS, "config_world_size.py"), "2", str(tmp_path), num_processes=2, timeout=240)
    seen = [json.loads((tmp_path / f"rank-{rank}.json").read_text()) for rank in range(2)]
    assert all((s["world_size"], s["backend"], s["use_cpu"]) == (2, "gloo", True) for s in seen), seen
    assert all(s["device"].startswith("cpu") for s in seen), seen
    output = result.stdout + result.stderr
    assert output.count("AdLoCoConfig sets use_cpu=True") == 1, output  # told once, by the first worker


@pytest.mark.multiprocess
@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU launch path: without a GPU")
def test_a_cpu_world_on_a_store_of_its_own_is_bounded_by_ddp_timeout(tmp_path):
    # torchrun c10d with each attempt its own store (docs/resuming.md, several machines): the launcher shares no
    # store, accelerate forms the group, and transformers gives a CPU world no timeout: torch's 30 minutes bounded
    # every collective on it (a dead link was waited for half an hour, whatever ddp_timeout said).
    command = [
        sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--rdzv-backend", "c10d",
        "--rdzv-endpoint", "127.0.0.1:0", "--max-restarts", "1",
        os.path.join(SCRIPTS, "config_world_size.py"), "2", str(tmp_path), "--ddp_timeout", "45",
    ]  # fmt: skip
    run_launch(command, timeout=240, env={"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}, warm=False)
    seen = [json.loads((tmp_path / f"rank-{rank}.json").read_text()) for rank in range(2)]
    assert [(s["world_size"], s["backend"], s["timeout_seconds"]) for s in seen] == [(2, "gloo", 45.0)] * 2, seen


@pytest.mark.multiprocess
@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU launch path: without a GPU")
def test_a_launch_of_one_worker_is_a_real_process_group_of_one(tmp_path):
    # `accelerate launch --multi_gpu` refuses one process; launch_command starts it with torchrun instead.
    command = launch_command(os.path.join(SCRIPTS, "config_world_size.py"), "1", str(tmp_path), num_processes=1)
    assert command[1:3] == ["-m", "torch.distributed.run"]
    launch(os.path.join(SCRIPTS, "config_world_size.py"), "1", str(tmp_path), num_processes=1, timeout=240)
    seen = json.loads((tmp_path / "rank-0.json").read_text())
    # One process needs no gloo group of the CPU workers (use_cpu stays as the user set it).
    assert (seen["world_size"], seen["device"]) == (1, "cpu"), seen
    with pytest.raises(ValueError, match="TrainingArguments"):
        launch_command("train.py", num_processes=1, mixed_precision="fp16")


def test_one_process_asked_for_two_instances_names_the_cpu_launch(tmp_path, records):
    """One process has one worker: it trains one instance (`config/launch.py`) and the warning names the launch
    of CPU workers, which `accelerate launch --num_processes N` alone is not."""
    compat._warned.clear()
    args = AdLoCoConfig(
        output_dir=str(tmp_path), max_steps=20, inner_steps=10, num_instances=2, use_cpu=True, report_to=[]
    )
    AdLoCoTrainer(model=tiny_model(), args=args, train_dataset=sequence_dataset(32)).train()
    (message,) = [r.getMessage() for r in records.records if r.getMessage().startswith("num_instances=2")]
    assert "--multi_gpu --num_processes 2" in message and "accelerate_configs/cpu_4_workers.yaml" in message
    assert args.num_instances == 1 and os.path.isfile(tmp_path / "merged" / "model.safetensors")
