"""A worker of `tests/evaluation/test_evaluation.py`: `accelerate launch --multi_gpu --num_processes P eval_worker.py SPEC_JSON`.

Two instances of a tiny Llama train with `compute_metrics` (token accuracy and mean log-probability of the labels,
from `preprocess_logits_for_metrics`); on every evaluation each worker computes the same metrics directly on its own
weights over the whole eval set. SPEC_JSON holds `output_dir`, `world_size` (asserted here), `probe_dir` and
`num_eval`. Each worker writes `report-rank{R}.json` into `probe_dir`.
"""

import json
import os
import sys

import numpy as np
import torch
import torch.distributed as dist
from transformers import TrainerCallback, default_data_collator


sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from helpers import NORM_TEST, sequence_dataset, tiny_model  # noqa: E402

from adloco_hf import AdLoCoConfig, AdLoCoTrainer  # noqa: E402


METRICS = ("loss", "token_accuracy", "label_logprob")


def preprocess_logits_for_metrics(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """[batch, length - 1, 2]: the predicted next token and the log-probability of the true one."""
    logits = logits[:, :-1].float()
    following = labels[:, 1:]
    logprob = torch.log_softmax(logits, -1).gather(-1, following.clamp(min=0).unsqueeze(-1)).squeeze(-1)
    return torch.stack([logits.argmax(-1).float(), logprob], dim=-1)


def metrics_of(predictions: np.ndarray, labels: np.ndarray) -> dict[str, float]:
    following = labels[:, 1:]
    mask = following != -100
    return {
        "token_accuracy": float((predictions[..., 0] == following)[mask].mean()),
        "label_logprob": float(predictions[..., 1][mask].mean()),
    }


def make_compute_metrics(expected_labels: np.ndarray):
    def compute_metrics(prediction):
        # The predictions come back in the order of the eval set, not one shard after another.
        assert np.array_equal(prediction.label_ids, expected_labels), "labels out of order or incomplete"
        return metrics_of(prediction.predictions, prediction.label_ids)

    return compute_metrics


class MetricsProbe(TrainerCallback):
    """Computes the metrics directly on this worker's own weights over the whole eval set, next to the logged ones."""

    def __init__(self, trainer):
        self.trainer, self.checks, self.top_level = trainer, [], None

    def on_evaluate(self, args, state, control, metrics=None, **kwargs):
        worker, data = self.trainer.worker, self.trainer.eval_dataset
        batch = default_data_collator([data[i] for i in range(len(data))])
        with torch.no_grad():
            logits = self.trainer.model(input_ids=batch["input_ids"]).logits
        predictions = preprocess_logits_for_metrics(logits, batch["labels"]).numpy()
        direct = metrics_of(predictions, batch["labels"].numpy())
        direct["loss"] = -direct["label_logprob"]  # every label counts: the token-weighted cross-entropy
        if worker.final_merged:
            instance, prefix = "merged", "eval_merged_"
        else:
            instance, prefix = worker.instance.id, f"eval_instance_{worker.instance.id}_"
            if self.top_level is None:
                demand = {inst.id: inst.demand for inst in worker.instances}
                self.top_level = {"metrics": dict(metrics), "demand": demand}
        logged = {name: metrics[prefix + name] for name in METRICS}
        self.checks.append({"instance": instance, "step": state.global_step, "logged": logged, "direct": direct})


def evaluating_trainer(spec: dict, **config) -> AdLoCoTrainer:
    """Two independent instances of 20 steps that evaluate every round on `spec["num_eval"]` samples, with metrics;
    `config` adds AdLoCoConfig fields. Checks the world size against `spec["world_size"]`."""
    args = AdLoCoConfig(
        output_dir=spec["output_dir"], use_cpu=True, report_to=[], disable_tqdm=True, log_level="warning", seed=3,
        optim="adamw_torch", learning_rate=3e-3, max_steps=20, inner_steps=10, num_instances=2, merge_every=0,
        instance_init="independent", per_device_train_batch_size=2, max_batch_size=4, eval_strategy="steps",
        eval_steps=10, per_device_eval_batch_size=4, save_strategy="no", **(NORM_TEST | config),
    )  # fmt: skip
    assert dist.is_initialized() and dist.get_world_size() == spec["world_size"], dist.get_world_size()
    data = sequence_dataset(256)
    eval_data = data.select(range(spec["num_eval"]))
    return AdLoCoTrainer(
        model=tiny_model(),
        args=args,
        train_dataset=data,
        eval_dataset=eval_data,
        compute_metrics=make_compute_metrics(np.array(eval_data["labels"])),
        preprocess_logits_for_metrics=preprocess_logits_for_metrics,
    )


def main() -> None:
    spec = json.loads(sys.argv[1])
    trainer = evaluating_trainer(spec)
    rank = dist.get_rank()
    probe = MetricsProbe(trainer)
    trainer.add_callback(probe)
    trainer.train()
    report = {"rank": rank, "world_size": dist.get_world_size(), "checks": probe.checks, "top_level": probe.top_level}
    os.makedirs(spec["probe_dir"], exist_ok=True)
    with open(os.path.join(spec["probe_dir"], f"report-rank{rank}.json"), "w") as f:
        json.dump(report, f)
    trainer.end()


if __name__ == "__main__":
    main()
