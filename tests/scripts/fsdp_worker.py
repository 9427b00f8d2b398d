"""A worker of the FSDP tests: `accelerate launch --multi_gpu --num_processes P fsdp_worker.py SPEC_JSON`.

`worker_parallelism="fsdp"`: each worker's processes shard one replica. SPEC_JSON holds `output_dir`, `world_size`
(asserted inside every worker), `config` (AdLoCoConfig overrides), `probe_dir`, and optional `resume` (a checkpoint)
and `fail` ([step, code]: every process exits at the start of that step). The checks that need several processes'
weights run here: the full model of every process (its worker's shards gathered) is all-gathered over the world.
"""

import json
import os
import sys

import safetensors.torch
import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor
from transformers import TrainerCallback


sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from adloco_worker import EvalProbe  # noqa: E402  (this script's folder is on sys.path)
from helpers import NORM_TEST, sequence_dataset, tiny_model  # noqa: E402

import adloco_hf.instances.merges as merging  # noqa: E402
from adloco_hf import AdLoCoConfig, AdLoCoTrainer  # noqa: E402


def full_flat(trainer) -> torch.Tensor:
    """This worker's whole model (trainable parameters, gathered from its processes' shards), flat float32.
    Collective over the worker's processes."""
    trainer.worker.reshard()
    values = []
    for p in trainer.model.parameters():
        if p.requires_grad:
            full = p.full_tensor() if isinstance(p, DTensor) else p
            values.append(full.detach().float().reshape(-1))
    return torch.cat(values)


def gather_world(local: torch.Tensor) -> torch.Tensor:
    parts = [torch.empty_like(local) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, local)
    return torch.stack(parts)


class BeforeSync(TrainerCallback):
    """Inserted before AdLoCoCallback: every process's full model at each round's end, before the outer step."""

    def __init__(self, trainer):
        self.trainer, self.pre_sync = trainer, None

    def on_step_end(self, args, state, control, **kwargs):
        if self.trainer.worker.is_round_end(state.global_step):
            self.pre_sync = gather_world(full_flat(self.trainer))


def spy_on_merges(trainer, probe_dir: str) -> None:
    """Before each merge, local rank 0 of every worker saves its instance's full φ (gathered from the worker's
    shards, collective over the worker's processes) for the merge-equals-weighted-average check."""
    original, counter = merging.merge_at_round_end, [0]

    def spy(plan, where, *, place, global_model, **kwargs):
        worker = trainer.worker
        full = torch.cat([v.reshape(-1).float() for v in worker.full_values(global_model.phi.detach())])
        if worker.local_rank == 0:
            name = f"premerge-worker{worker.worker_id}-{counter[0]}-i{plan.survivor}-{plan.merged}.safetensors"
            safetensors.torch.save_file({"phi": full.contiguous()}, os.path.join(probe_dir, name))
        counter[0] += 1
        return original(plan, where, place=place, global_model=global_model, **kwargs)

    merging.merge_at_round_end = spy


class Probe(TrainerCallback):
    """After every step: the processes of a worker hold the same full model; inside a round the workers' models
    differ, and right after each outer step they are identical. Added after AdLoCoCallback (sees the outer step)."""

    def __init__(self, trainer, before):
        self.trainer, self.before = trainer, before
        self.steps_checked = self.rounds_checked = 0
        self.min_spread_inside = float("inf")
        self.sharded = False
        self.max_mean_error, self.mean_checks = 0.0, 0

    def on_step_end(self, args, state, control, **kwargs):
        worker = self.trainer.worker
        self.sharded = self.sharded or any(isinstance(p, DTensor) for p in self.trainer.model.parameters())
        stacked = gather_world(full_flat(self.trainer))
        layout = worker.layout
        for w in range(worker.num_workers):
            rows = stacked[list(layout.ranks_of(w))]
            assert torch.equal(rows, rows[:1].expand_as(rows)), f"worker {w}'s processes differ at {state.global_step}"
        self.steps_checked += 1
        leaders = stacked[[layout.rank(w, 0) for w in range(worker.num_workers)]]
        # With fragments the workers' weights differ between syncs, also right after a round's end.
        if worker.last_synced_step == state.global_step and args.num_fragments is None:  # a round ended
            for inst in worker.instances:
                members = stacked[list(layout.ranks_of_workers(inst.workers))]
                assert torch.equal(members, members[:1].expand_as(members)), (
                    f"instance {inst.id} differs after the outer step at {state.global_step}"
                )
            self.rounds_checked += 1
            if (
                args.outer_lr == 1.0
                and args.outer_momentum == 0.0
                and len(worker.instances) == 1
                and worker.totals.merges == 0
            ):  # φ is then the mean of the workers' pre-sync weights (a sum, or shards mixed up, are not)
                mean = self.before.pre_sync.double().mean(0).float()
                self.max_mean_error = max(self.max_mean_error, (stacked - mean).abs().max().item())
                self.mean_checks += 1
        elif len(worker.instances) == 1 and worker.num_workers > 1:
            spread = (leaders - leaders[0]).abs().max().item()
            assert spread > 0, f"the workers are identical inside a round at step {state.global_step}"
            self.min_spread_inside = min(self.min_spread_inside, spread)


def main() -> None:
    spec = json.loads(sys.argv[1])
    args = AdLoCoConfig(
        **{
            "use_cpu": True,
            "report_to": [],
            "disable_tqdm": True,
            "log_level": "warning",
            "plot_run": False,
            # the norm test's requests unless the spec names a target (NORM_TEST in tests/helpers.py: they repeat)
            **NORM_TEST,
            **spec["config"],
        }
    )
    assert dist.is_initialized() and dist.get_world_size() == spec["world_size"], dist.get_world_size()
    rank = dist.get_rank()
    probe_dir = spec["probe_dir"]
    os.makedirs(probe_dir, exist_ok=True)
    data = sequence_dataset(spec.get("num_samples", 512))
    eval_data = data.select(range(spec.get("num_eval", 21))) if spec.get("eval") else None
    dropout = {"attention_dropout": spec["dropout"]} if spec.get("dropout") else {}
    trainer = AdLoCoTrainer(model=tiny_model(**dropout), args=args, train_dataset=data, eval_dataset=eval_data)
    assert trainer.worker.fsdp and all(isinstance(p, DTensor) for p in trainer.model.parameters())
    before = BeforeSync(trainer)
    trainer.callback_handler.callbacks.insert(0, before)
    probe = Probe(trainer, before)
    trainer.add_callback(probe)
    evaluation = EvalProbe(trainer)
    trainer.add_callback(evaluation)
    os.makedirs(os.path.join(probe_dir, "merges"), exist_ok=True)
    spy_on_merges(trainer, os.path.join(probe_dir, "merges"))
    if spec.get("fail") is not None:
        fail_step, code = spec["fail"]

        class Fail(TrainerCallback):
            def on_step_begin(self, args, state, control, **kwargs):
                if state.global_step == fail_step:
                    os._exit(int(code))

        trainer.add_callback(Fail())
    trainer.train(resume_from_checkpoint=spec.get("resume"))
    final = full_flat(trainer)
    stacked = gather_world(final)
    assert torch.equal(stacked, stacked[:1].expand_as(stacked)), "workers hold different models at the end"
    safetensors.torch.save_file(
        {"params": final.contiguous()}, os.path.join(probe_dir, f"final-rank{rank}.safetensors")
    )
    worker = trainer.worker
    report = {
        "rank": rank,
        "world_size": dist.get_world_size(),
        "worker_id": worker.worker_id,
        "local_rank": worker.local_rank,
        "steps_checked": probe.steps_checked,
        "rounds_checked": probe.rounds_checked,
        "mean_checks": probe.mean_checks,
        "max_mean_error": probe.max_mean_error,
        "eval_checks": evaluation.checks,
        "min_spread_inside_round": probe.min_spread_inside,
        "sharded": probe.sharded,
        "part_numel": worker.global_model.numel,
        "full_numel": int(final.numel()),
        "instances": [[i.id, list(i.workers), i.batch_size] for i in worker.instances],
        "log_history": [
            {k: v for k, v in entry.items() if isinstance(v, (int, float, str))} for entry in trainer.state.log_history
        ],
    }
    with open(os.path.join(probe_dir, f"report-rank{rank}.json"), "w") as f:
        json.dump(report, f)
    trainer.end()


if __name__ == "__main__":
    main()
