"""One worker of two processes against plain DDP: `accelerate launch --multi_gpu --num_processes 2 THIS SPEC_JSON`.

SPEC_JSON holds `output_dir`, `probe_dir` and `max_steps`. Both runs start from the same weights and draw the same
batches (the adaptive sampler sharded by process, 2 samples per process and step): AdLoCo with
`processes_per_worker=2`, `outer_lr=1`, `outer_momentum=0` (its outer steps only copy the worker's weights back), and
a plain `transformers.Trainer` whose model accelerate wraps in DDP over the world. Each process writes its two final
weight vectors and the largest difference between them.
"""

import copy
import json
import os
import sys

import safetensors.torch
import torch
import torch.distributed as dist
from transformers import Trainer, TrainingArguments


sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from helpers import flat_params, sequence_dataset, tiny_model  # noqa: E402

from adloco_hf import AdLoCoConfig, AdLoCoTrainer  # noqa: E402
from adloco_hf.sampling.sampler import adaptive_train_loader  # noqa: E402


SEED = 3


class PlainDDP(Trainer):
    """The Trainer with the same data order as an AdLoCo process: the adaptive sampler's shard of this process."""

    def get_train_dataloader(self):
        dataset = self._remove_unused_columns(self.train_dataset, description="training")
        return adaptive_train_loader(
            dataset,
            self.data_collator,
            batch_size=self.args.per_device_train_batch_size,
            num_workers=self.args.world_size,
            rank=self.args.process_index,
            seed=SEED,
        )


def common(output_dir: str, max_steps: int) -> dict:
    return dict(
        output_dir=output_dir,
        max_steps=max_steps,
        per_device_train_batch_size=2,
        learning_rate=3e-3,
        optim="adamw_torch",
        seed=SEED,
        save_strategy="no",
        report_to=[],
        disable_tqdm=True,
        log_level="warning",
        use_cpu=True,
        average_tokens_across_devices=False,
    )


def main() -> None:
    spec = json.loads(sys.argv[1])
    data = sequence_dataset(256)
    start = tiny_model()
    plain_model = copy.deepcopy(start)
    initial = flat_params(start).clone()
    args = AdLoCoConfig(
        **common(os.path.join(spec["output_dir"], "adloco"), spec["max_steps"]),
        inner_steps=5,
        outer_lr=1.0,
        outer_momentum=0.0,
        pseudo_grad_dtype="float32",
        batch_size_test="none",
        max_batch_size=4,
        processes_per_worker=2,
    )
    assert dist.is_initialized() and dist.get_world_size() == 2, "needs two processes"
    rank = dist.get_rank()
    trainer = AdLoCoTrainer(model=start, args=args, train_dataset=data)
    trainer.train()
    adloco = flat_params(trainer.model)
    assert isinstance(trainer.model_wrapped, torch.nn.parallel.DistributedDataParallel)
    ddp_group_size = dist.get_world_size(trainer.model_wrapped.process_group)

    plain_args = TrainingArguments(**common(os.path.join(spec["output_dir"], "plain"), spec["max_steps"]))
    plain = PlainDDP(model=plain_model, args=plain_args, train_dataset=data)
    plain.train()
    reference = flat_params(plain.model)
    os.makedirs(spec["probe_dir"], exist_ok=True)
    report = {
        "rank": rank,
        "world_size": dist.get_world_size(),
        "ddp_group_size": ddp_group_size,
        "max_abs_diff": (adloco - reference).abs().max().item(),
        "moved": (reference - initial).abs().max().item(),
        "rounds": trainer.adloco_state.rounds,
    }
    safetensors.torch.save_file(
        {"adloco": adloco.contiguous(), "plain": reference.contiguous()},
        os.path.join(spec["probe_dir"], f"params-rank{rank}.safetensors"),
    )
    with open(os.path.join(spec["probe_dir"], f"report-rank{rank}.json"), "w") as f:
        json.dump(report, f)


if __name__ == "__main__":
    main()
