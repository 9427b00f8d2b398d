"""A worker of `tests/evaluation/test_evaluation.py`: `accelerate launch --multi_gpu --num_processes P merged_eval_worker.py SPEC`.

Two independently initialised instances of a tiny Llama train without merges, with `compute_metrics` (token accuracy
and mean log-probability of the labels) and `eval_merged_model` as SPEC_JSON says. At every evaluation each worker
records the metrics it was handed, its instance's global weights φ (saved as `phi-rank{R}-step{S}.pt`, for the test
to average and evaluate on its own), the instances' demands, and whether its parameters are its own φ again (bit for
bit) after the evaluation. SPEC_JSON holds `output_dir`, `world_size` (asserted here), `probe_dir`, `num_eval` and
`eval_merged_model`. Each worker writes `report-rank{R}.json` into `probe_dir`.
"""

import json
import os
import sys

import torch
import torch.distributed as dist
from transformers import TrainerCallback


sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from eval_worker import evaluating_trainer  # noqa: E402


class Probe(TrainerCallback):
    def __init__(self, trainer, probe_dir: str):
        self.trainer, self.probe_dir, self.evaluations = trainer, probe_dir, []

    def on_evaluate(self, args, state, control, metrics=None, **kwargs):
        worker = self.trainer.worker
        entry = {"step": state.global_step, "final_merged": worker.final_merged, "metrics": dict(metrics)}
        if not worker.final_merged:
            phi = worker.global_model.phi.detach().cpu().clone()
            own = torch.cat([p.detach().reshape(-1) for p in self.trainer.model.parameters() if p.requires_grad])
            entry.update(
                instance=worker.instance.id,
                instances={inst.id: [list(inst.workers), inst.demand, inst.trained] for inst in worker.instances},
                params_are_own_phi=bool(torch.equal(own.cpu(), phi)),  # fp32 model, blocking rounds: θ = φ
            )
            torch.save(phi, os.path.join(self.probe_dir, f"phi-rank{dist.get_rank()}-step{state.global_step}.pt"))
        self.evaluations.append(entry)


def main() -> None:
    spec = json.loads(sys.argv[1])
    trainer = evaluating_trainer(spec, eval_merged_model=spec["eval_merged_model"])
    rank = dist.get_rank()
    os.makedirs(spec["probe_dir"], exist_ok=True)
    probe = Probe(trainer, spec["probe_dir"])
    trainer.add_callback(probe)
    trainer.train()
    report = {"rank": rank, "world_size": dist.get_world_size(), "evaluations": probe.evaluations}
    with open(os.path.join(spec["probe_dir"], f"report-rank{rank}.json"), "w") as f:
        json.dump(report, f)
    trainer.end()


if __name__ == "__main__":
    main()
