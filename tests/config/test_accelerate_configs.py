"""The launch configs in `accelerate_configs/`: complete, consistent, and accepted by `accelerate launch`."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from accelerate.commands.launch import _validate_launch_command, launch_command_parser
from helpers import free_port


ROOT = Path(__file__).resolve().parents[2]
CONFIG_DIR = ROOT / "accelerate_configs"
PROBE = ROOT / "tests" / "scripts" / "probe_world_size.py"

EXPECTED = {
    # name: (distributed_type, num_processes, num_machines)
    "single_gpu.yaml": ("NO", 1, 1),
    "multi_gpu.yaml": ("MULTI_GPU", 8, 1),
    "one_gpu_4_workers.yaml": ("MULTI_GPU", 4, 1),
    "cpu_4_workers.yaml": ("MULTI_GPU", 4, 1),
    "multi_node.yaml": ("MULTI_GPU", 16, 2),
}
REQUIRED_KEYS = {
    "compute_environment",
    "debug",
    "distributed_type",
    "downcast_bf16",
    "enable_cpu_affinity",
    "gpu_ids",
    "machine_rank",
    "main_training_function",
    "mixed_precision",
    "num_machines",
    "num_processes",
    "rdzv_backend",
    "same_network",
    "tpu_env",
    "tpu_use_cluster",
    "tpu_use_sudo",
    "use_cpu",
}
# Keys that only matter when several processes rendezvous.
RENDEZVOUS_KEYS = {"main_process_ip", "main_process_port"}


def load(name: str) -> dict:
    return yaml.safe_load((CONFIG_DIR / name).read_text())


def accelerate_launch_cmd() -> list[str]:
    binary = Path(sys.executable).parent / "accelerate"
    if binary.exists():
        return [str(binary), "launch"]
    return [sys.executable, "-m", "accelerate.commands.launch"]


def test_the_config_directory_holds_exactly_the_documented_files():
    assert sorted(p.name for p in CONFIG_DIR.glob("*.yaml")) == sorted(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_config_is_complete_and_consistent(name):
    config = load(name)
    distributed_type, num_processes, num_machines = EXPECTED[name]

    missing = REQUIRED_KEYS - config.keys()
    assert not missing, f"{name} lacks {sorted(missing)}"
    if num_processes > 1:
        assert RENDEZVOUS_KEYS <= config.keys(), f"{name} lacks {sorted(RENDEZVOUS_KEYS - config.keys())}"
    assert all(value is not None for value in config.values()), f"{name} has empty keys"

    assert config["compute_environment"] == "LOCAL_MACHINE"
    assert config["distributed_type"] == distributed_type
    assert config["num_processes"] == num_processes
    assert config["num_machines"] == num_machines
    assert config["num_processes"] % config["num_machines"] == 0
    assert 0 <= config["machine_rank"] < config["num_machines"]
    assert config["rdzv_backend"] == "static"
    # use_cpu: true (or MULTI_CPU) would not give CPU workers either: see cpu_4_workers.yaml.
    assert config["use_cpu"] is False


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_config_header_holds_a_launch_command(name):
    header = [line for line in (CONFIG_DIR / name).read_text().splitlines() if line.startswith("#")]
    assert any(f"accelerate launch --config_file accelerate_configs/{name}" in line for line in header)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_accelerate_launch_accepts_config(name):
    # The checks `accelerate launch` runs before starting any process; they need no GPU.
    args = launch_command_parser().parse_args(["--config_file", str(CONFIG_DIR / name), "train.py"])
    args, _, _ = _validate_launch_command(args)
    assert args.num_processes == EXPECTED[name][1]
    assert args.multi_gpu == (EXPECTED[name][0] == "MULTI_GPU")


def test_accelerate_launch_rejects_one_gpu_id_with_multi_gpu(tmp_path):
    # Why one_gpu_4_workers.yaml has gpu_ids "all" and not "0": the check above would fail.
    config = load("one_gpu_4_workers.yaml") | {"gpu_ids": "0"}
    path = tmp_path / "one_gpu_id.yaml"
    path.write_text(yaml.safe_dump(config))
    args = launch_command_parser().parse_args(["--config_file", str(path), "train.py"])
    with pytest.raises(ValueError, match="Less than two GPU ids"):
        _validate_launch_command(args)


@pytest.mark.multiprocess
def test_cpu_4_workers_starts_4_processes(tmp_path):
    out_dir = tmp_path / "ranks"
    cmd = accelerate_launch_cmd() + [
        "--config_file",
        str(CONFIG_DIR / "cpu_4_workers.yaml"),
        "--main_process_port",
        str(free_port()),
        str(PROBE),
        "4",
        str(out_dir),
    ]
    env = os.environ | {"OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    result = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]

    rank_files = sorted(p.name for p in out_dir.glob("rank-*"))
    assert rank_files == ["rank-0", "rank-1", "rank-2", "rank-3"]
    for path in out_dir.glob("rank-*"):
        world_size, backend = path.read_text().split()
        assert world_size == "4"
        assert backend == "gloo"
