"""A worker of `tests/trainer/test_collective_calls.py`: `accelerate launch --multi_gpu --num_processes 2
collective_worker.py SPEC_JSON`.

Two workers train a tiny Llama for one round; then rank 0 calls `trainer.evaluate()` alone, as `if rank == 0:` in a
user's script would. SPEC_JSON holds `output_dir` and `other`: what rank 1 does meanwhile, `"exit"` (leaves the
script) or `"end"` (calls `trainer.end()`). `worker_timeout` stays at its default (30 minutes): only the collective
check can end the run in the test's time.
"""

import json
import os
import sys

import torch.distributed as dist


sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from helpers import sequence_dataset, tiny_model  # noqa: E402

from adloco_hf import AdLoCoConfig, AdLoCoTrainer  # noqa: E402


def main() -> None:
    spec = json.loads(sys.argv[1])
    args = AdLoCoConfig(
        output_dir=spec["output_dir"], max_steps=2, inner_steps=2, per_device_train_batch_size=2, max_batch_size=4,
        use_cpu=True, report_to=[], save_strategy="no", disable_tqdm=True,
    )  # fmt: skip
    trainer = AdLoCoTrainer(
        model=tiny_model(), args=args, train_dataset=sequence_dataset(64), eval_dataset=sequence_dataset(8, seed=2)
    )
    trainer.train()
    rank = dist.get_rank()
    assert dist.get_world_size() == 2
    if rank == 0:
        trainer.evaluate()
        print("rank 0: evaluate() returned", flush=True)
    elif spec["other"] == "end":
        trainer.end()
        print("rank 1: end() returned", flush=True)
    else:
        print("rank 1: leaving the script", flush=True)


if __name__ == "__main__":
    main()
