"""Worker side of `tests/config/test_accelerate_configs.py`: checks the world size that `accelerate launch` produced.

Each worker builds `TrainingArguments(use_cpu=True)` as the AdLoCo recipes do on a machine without a GPU,
asserts that the process group has the expected size, and writes its rank to `OUT_DIR/rank-<rank>`.

    accelerate launch --config_file accelerate_configs/cpu_4_workers.yaml \
        tests/scripts/probe_world_size.py 4 /tmp/probe
"""

import argparse
import os
import tempfile
from pathlib import Path

import torch.distributed as dist
from transformers import TrainingArguments


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("expected_world_size", type=int)
    parser.add_argument("out_dir", type=Path)
    cli = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        args = TrainingArguments(output_dir=tmp, use_cpu=True, report_to=[])
        # The process group is created lazily, when the device is first asked for.
        device = args.device
    world_size = dist.get_world_size() if dist.is_initialized() else 1
    rank = dist.get_rank() if dist.is_initialized() else 0
    assert world_size == cli.expected_world_size, (
        f"rank {rank}: world size {world_size}, expected {cli.expected_world_size} "
        f"(WORLD_SIZE={os.environ.get('WORLD_SIZE')}, device={device})"
    )
    cli.out_dir.mkdir(parents=True, exist_ok=True)
    (cli.out_dir / f"rank-{rank}").write_text(f"{world_size} {dist.get_backend() if dist.is_initialized() else ''}\n")
    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
