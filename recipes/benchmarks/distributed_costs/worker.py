"""What each launched worker of `distributed_costs` does and records: its inner steps' and outer steps' seconds and
socket bytes around AdLoCo's own callback, its checkpoint saves, and when it noticed a lost worker."""

import json
import os
import time

import datasets
import torch
import torch.distributed as dist
from transformers import TrainerCallback

from adloco_hf import AdLoCoConfig, AdLoCoTrainer
from adloco_hf.inspection import WorkerTimeoutError
from adloco_hf.testing import tiny_llama
from recipes.benchmarks.toolkit.traffic import socket_bytes_sent


__all__ = ["minus", "worker"]


def minus(after: int | None, before: int | None) -> int | None:
    """`after - before`, or None when either is unknown."""
    return None if after is None or before is None else after - before


def worker(spec: dict) -> None:
    """One launched worker: train `spec`'s config with the timing callbacks (and the fault, if any), then write its
    record to `probe_dir/rank{R}.json`."""
    args = AdLoCoConfig(use_cpu=True, report_to=[], disable_tqdm=True, log_level="error", **spec["config"])
    assert dist.get_world_size() == spec["world_size"]
    rank = dist.get_rank()
    model = tiny_llama(
        seed=0, vocab_size=4096, hidden_size=64, intermediate_size=256, layers=2, max_position_embeddings=256
    )
    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 4096, (2048, 128), generator=generator).tolist()
    data = datasets.Dataset.from_dict({"input_ids": ids, "labels": ids})
    trainer = AdLoCoTrainer(model=model, args=args, train_dataset=data)
    record = {"step": [], "stats_step": [], "outer": [], "outer_bytes": [], "outer_rounds": [], "save": []}
    pid = os.getpid()

    class Before(TrainerCallback):
        """First in the callback list: its `on_step_end` runs before AdLoCo's ends the round."""

        def on_step_begin(self, args, state, control, **kwargs):
            self.start = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            duration = time.perf_counter() - self.start
            round_end = state.global_step % args.inner_steps == 0
            if state.global_step > args.inner_steps:  # skip the first round (warm-up)
                record["stats_step" if round_end else "step"].append(duration)
            self.sent = socket_bytes_sent(pid) if round_end else None
            self.end = time.perf_counter()  # after the `ss` call, which is not AdLoCo's cost
            if round_end:
                record["round_end_reached"] = time.time()  # from here on, waiting for the round-end barrier

        def on_save(self, args, state, control, **kwargs):
            # The Trainer saves right after `on_step_end` (no logging or evaluation at these steps) and then calls
            # `on_save`: the time since the last callback's `on_step_end` is the save.
            record["save"].append(time.perf_counter() - after.step_end)

    class After(TrainerCallback):
        """Added last: its `on_step_end` runs after AdLoCo's has closed the round."""

        def __init__(self, before):
            self.before = before
            self.step_end = 0.0

        def on_step_end(self, args, state, control, **kwargs):
            if self.before.sent is not None and trainer.adloco_state.last_round_step == state.global_step:
                record["outer"].append(time.perf_counter() - self.before.end)
                record["outer_bytes"].append(minus(socket_bytes_sent(pid), self.before.sent))
                record["outer_rounds"].append(trainer.adloco_state.rounds)
            self.step_end = time.perf_counter()

    before = Before()
    after = After(before)
    trainer.callback_handler.callbacks.insert(0, before)
    trainer.add_callback(after)

    fail = spec.get("fail")
    if fail is not None:
        fail_rank, fail_step, how = fail

        class Fail(TrainerCallback):
            def on_step_begin(self, args, state, control, **kwargs):
                if rank == fail_rank and state.global_step == fail_step:
                    with open(os.path.join(spec["probe_dir"], "failed_at"), "w") as f:
                        f.write(str(time.time()))
                    if how == "hang":
                        time.sleep(3600)
                    os._exit(0)

        trainer.add_callback(Fail())
    try:
        trainer.train()
    except WorkerTimeoutError as error:
        failed_at = float(open(os.path.join(spec["probe_dir"], "failed_at")).read())
        now = time.time()
        record["noticed_after"] = now - failed_at
        record["barrier_wait"] = now - record["round_end_reached"]
        record["error"] = str(error)
    payload = sum(p.numel() for p in model.parameters())
    record.update(rank=rank, pid=pid, numel=payload)
    with open(os.path.join(spec["probe_dir"], f"rank{rank}.json"), "w") as f:
        json.dump(record, f)
    if "noticed_after" in record:
        os._exit(1)  # a failed run: the launcher then stops the lost worker too
