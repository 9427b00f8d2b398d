"""Worker side of `tests/worker/test_cpu_launch.py`: `AdLoCoConfig` built WITHOUT `use_cpu`, as a user's script does.

Launched with `accelerate launch --multi_gpu --num_processes N` on a machine without a GPU, every worker must still
join one gloo group of N: the config sets `use_cpu=True` itself. Each worker writes what it saw to
`OUT_DIR/rank-<rank>.json`, the default group's timeout among it (`--ddp_timeout`: the config's).

    accelerate launch --multi_gpu --num_processes 2 tests/scripts/config_world_size.py 2 /tmp/probe
"""

import argparse
import json
import os
import tempfile
from pathlib import Path

import torch
import torch.distributed as dist

from adloco_hf import AdLoCoConfig


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("expected_world_size", type=int)
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--ddp_timeout", type=int, default=None)
    cli = parser.parse_args()

    timeouts = {} if cli.ddp_timeout is None else {"ddp_timeout": cli.ddp_timeout, "worker_timeout": cli.ddp_timeout}
    with tempfile.TemporaryDirectory() as tmp:
        args = AdLoCoConfig(output_dir=tmp, max_steps=20, inner_steps=10, save_steps=10, report_to=[], **timeouts)
        device = args.device  # the process group is created when the device is first asked for
    world_size = dist.get_world_size() if dist.is_initialized() else 1
    rank = dist.get_rank() if dist.is_initialized() else 0
    assert world_size == cli.expected_world_size == args.world_size, (
        f"rank {rank}: world size {world_size} (args.world_size {args.world_size}), expected "
        f"{cli.expected_world_size} (WORLD_SIZE={os.environ.get('WORLD_SIZE')}, device={device})"
    )
    cli.out_dir.mkdir(parents=True, exist_ok=True)
    seen = {"world_size": world_size, "backend": dist.get_backend(), "use_cpu": args.use_cpu, "device": str(device)}
    # what bounds forming the default group and every collective on it (torch keeps it in the backend's options)
    gloo = dist.distributed_c10d._get_default_group()._get_backend(torch.device("cpu"))
    seen["timeout_seconds"] = gloo.options._timeout.total_seconds()
    (cli.out_dir / f"rank-{rank}.json").write_text(json.dumps(seen))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
