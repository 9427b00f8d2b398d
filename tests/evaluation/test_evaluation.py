"""Task-aware evaluation: `compute_metrics` for every instance, metrics stored with the dataset name, perplexity only
for causal LMs (`adloco_hf.evaluation.evaluate`, `adloco_hf.evaluation.predictions`)."""

import json
import math
import os

import datasets
import pytest
import torch
from helpers import SCRIPTS, launch, sequence_dataset, tiny_model, tiny_run_config
from safetensors.torch import load_file
from torch import nn
from transformers import BertConfig, BertForSequenceClassification, default_data_collator

from adloco_hf import AdLoCoTrainer
from adloco_hf.evaluation.evaluate import combine_instance_metrics
from adloco_hf.evaluation.predictions import is_causal_lm
from adloco_hf.reporting.plotting import plot_run
from adloco_hf.reporting.report import format_summary, summarize_records, summarize_run
from adloco_hf.reporting.run_log import MERGED, RunLog, load_evals, load_rounds


def tiny_classifier(seed: int = 0) -> BertForSequenceClassification:
    torch.manual_seed(seed)
    config = BertConfig(
        vocab_size=64, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32,
        max_position_embeddings=32, num_labels=2,
    )  # fmt: skip
    return BertForSequenceClassification(config)


def classification_dataset(n: int, seed: int = 1, length: int = 12) -> datasets.Dataset:
    """Label 1 when the first token is in the upper half of the vocabulary: learnable in a few steps."""
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, 64, (n, length), generator=generator)
    return datasets.Dataset.from_list([{"input_ids": row.tolist(), "labels": int(row[0] >= 32)} for row in ids])


def accuracy(prediction):
    return {"accuracy": float((prediction.predictions.argmax(-1) == prediction.label_ids).mean())}


def config(tmp_path, **kwargs):
    evaluation = dict(per_device_eval_batch_size=8, eval_strategy="steps", eval_steps=6)
    return tiny_run_config(tmp_path, **(evaluation | kwargs))


def direct_classifier_metrics(model, dataset) -> tuple[float, float]:
    batch = default_data_collator([dataset[i] for i in range(len(dataset))])
    with torch.no_grad():
        logits = model(input_ids=batch["input_ids"]).logits
    loss = nn.functional.cross_entropy(logits, batch["labels"]).item()
    return loss, (logits.argmax(-1) == batch["labels"]).float().mean().item()


def test_a_classifier_gets_its_metrics_and_no_perplexity(tmp_path):
    train, valid = classification_dataset(128), classification_dataset(21, seed=2)  # an uneven last eval batch
    args = config(tmp_path)
    model = tiny_classifier()
    trainer = AdLoCoTrainer(model=model, args=args, train_dataset=train, eval_dataset=valid, compute_metrics=accuracy)
    assert not is_causal_lm(trainer.model) and is_causal_lm(tiny_model())
    trainer.train()
    metrics = trainer.evaluate()
    loss, acc = direct_classifier_metrics(trainer.model, valid)
    assert metrics["eval_loss"] == pytest.approx(loss, rel=1e-5)
    assert metrics["eval_accuracy"] == pytest.approx(acc)
    assert not any("perplexity" in key for key in metrics)

    lines = load_evals(args.output_dir)
    # Two evaluations while training (steps 6 and 12), the merged model's at the end, and the one above (of it too).
    assert [line["instance"] for line in lines] == [0, 0, "merged", "merged"]
    for line in lines:
        assert line["dataset"] is None
        assert {"global_step", "outer_step", "total_tokens", "instance", "eval_loss", "eval_accuracy"} <= set(line)
        assert "eval_perplexity" not in line
    assert lines[-1]["eval_accuracy"] == pytest.approx(acc) and lines[-1]["eval_loss"] == pytest.approx(loss)
    # The summary and the plot of a run without perplexity.
    summary = summarize_run(args.output_dir)
    assert summary["final_eval_perplexity"] is None and summary["best_eval_perplexity"] is None
    assert "eval perplexity" in format_summary(summary)


def test_dict_eval_datasets_are_told_apart(tmp_path):
    train = classification_dataset(128)
    evals = {"in": classification_dataset(16, seed=2), "other": classification_dataset(10, seed=3, length=8)}
    args = config(tmp_path, max_steps=6)
    trainer = AdLoCoTrainer(
        model=tiny_classifier(), args=args, train_dataset=train, eval_dataset=evals, compute_metrics=accuracy
    )
    trainer.train()
    metrics = trainer.evaluate()
    for name, dataset in evals.items():
        loss, acc = direct_classifier_metrics(trainer.model, dataset)
        assert metrics[f"eval_{name}_loss"] == pytest.approx(loss, rel=1e-5)
        assert metrics[f"eval_{name}_accuracy"] == pytest.approx(acc)
    assert not any("perplexity" in key for key in metrics)
    # A name of the dict evaluates that dataset alone, as Trainer.evaluate("in") does.
    assert trainer.evaluate("other")["eval_accuracy"] == metrics["eval_other_accuracy"]

    lines = load_evals(args.output_dir)
    by_dataset = {}
    for line in lines:
        by_dataset.setdefault(line["dataset"], []).append(line)
    assert set(by_dataset) == {"in", "other"}
    # Step 6 (training), the merged model, the evaluate() above; "other" once more for evaluate("other").
    assert [line["instance"] for line in by_dataset["in"]] == [0, "merged", "merged"]
    assert [line["instance"] for line in by_dataset["other"]] == [0, "merged", "merged", "merged"]
    for name, dataset in evals.items():
        loss, acc = direct_classifier_metrics(trainer.model, dataset)
        last = by_dataset[name][-1]
        assert last["eval_loss"] == pytest.approx(loss, rel=1e-5) and last["eval_accuracy"] == pytest.approx(acc)
    assert os.path.isfile(plot_run(args.output_dir))  # no perplexity, two datasets: the plot draws "in"


def test_the_summary_follows_the_first_dataset_and_only_causal_lms_have_perplexity():
    rounds = [{"outer_step": 1, "global_step": 10, "instance": 0, "workers": [0], "batch_size": 2, "num_instances": 1}]
    line = {"global_step": 10, "outer_step": 1, "instance": 0}
    lm = [
        {**line, "dataset": "in", "eval_loss": 1.0, "eval_perplexity": math.exp(1.0)},
        {**line, "dataset": "other", "eval_loss": 0.5, "eval_perplexity": math.exp(0.5)},
    ]
    assert summarize_records(rounds, lm, "run")["best_eval_perplexity"] == pytest.approx(math.exp(1.0))
    classifier = [{**line, "dataset": None, "eval_loss": 0.7, "eval_accuracy": 0.5}]
    assert summarize_records(rounds, classifier, "run")["best_eval_perplexity"] is None
    legacy = [{**line, "eval_loss": 0.7}]  # a line written before lines named their dataset
    assert summarize_records(rounds, legacy, "run")["best_eval_perplexity"] == pytest.approx(math.exp(0.7))


def test_dict_eval_datasets_of_a_causal_lm_keep_perplexity(tmp_path):
    data = sequence_dataset(64)
    evals = {"a": data.select(range(8)), "b": data.select(range(8, 13))}
    args = config(tmp_path, eval_strategy="no")
    trainer = AdLoCoTrainer(model=tiny_model(), args=args, train_dataset=data, eval_dataset=evals)
    metrics = trainer.evaluate()
    assert metrics["eval_a_perplexity"] == pytest.approx(math.exp(metrics["eval_a_loss"]))
    assert metrics["eval_b_perplexity"] == pytest.approx(math.exp(metrics["eval_b_loss"]))
    lines = load_evals(args.output_dir)
    assert [(line["dataset"], line["instance"]) for line in lines] == [("a", 0), ("b", 0)]
    assert all(line["eval_perplexity"] == pytest.approx(math.exp(line["eval_loss"])) for line in lines)


def test_combine_instance_metrics_is_a_demand_weighted_mean_of_instances():
    per_instance = {
        0: {"loss": 1.0, "accuracy": 0.5, "label": "a", "only_here": 2.0},
        1: {"loss": 2.0, "accuracy": 0.8, "label": "b"},
    }
    metrics = combine_instance_metrics(per_instance, {0: 1.0, 1: 3.0}, "eval", causal_lm=True)
    assert metrics["eval_instance_0_accuracy"] == 0.5 and metrics["eval_instance_1_label"] == "b"
    assert metrics["eval_loss"] == pytest.approx((1.0 + 3 * 2.0) / 4)
    assert metrics["eval_accuracy"] == pytest.approx((0.5 + 3 * 0.8) / 4)
    assert metrics["eval_only_here"] == 2.0  # the mean of the instances that report it
    assert "eval_label" not in metrics  # not a number: per instance only
    assert metrics["eval_perplexity"] == pytest.approx(math.exp(1.75))  # of the mean loss
    assert metrics["eval_instance_1_perplexity"] == pytest.approx(math.exp(2.0))
    classifier = combine_instance_metrics(per_instance, {0: 1.0, 1: 3.0}, "eval_in", causal_lm=False)
    assert not any("perplexity" in key for key in classifier) and "eval_in_instance_0_loss" in classifier


@pytest.mark.multiprocess
def test_each_instance_runs_compute_metrics_on_its_own_weights(tmp_path):
    out = str(tmp_path / "out")
    spec = {"output_dir": out, "world_size": 4, "probe_dir": str(tmp_path / "probe"), "num_eval": 45}
    launch(os.path.join(SCRIPTS, "eval_worker.py"), json.dumps(spec), num_processes=4)
    reports = [json.load(open(tmp_path / "probe" / f"report-rank{r}.json")) for r in range(4)]
    assert [r["world_size"] for r in reports] == [4] * 4
    checks = [check for report in reports for check in report["checks"]]
    assert len(checks) == 4 * 3  # two evaluations of the instances and one of the merged model, on every worker
    by_step: dict[int, dict] = {}
    for check in checks:
        for name in ("loss", "token_accuracy", "label_logprob"):
            assert check["logged"][name] == pytest.approx(check["direct"][name], abs=1e-5), check
        if check["instance"] != "merged":
            by_step.setdefault(check["step"], {})[check["instance"]] = check["logged"]
    assert set(by_step) == {10, 20}
    for logged in by_step.values():
        assert set(logged) == {0, 1}
        assert abs(logged[0]["label_logprob"] - logged[1]["label_logprob"]) > 1e-3  # different models
    lines = load_evals(out)
    assert [(line["global_step"], line["instance"]) for line in lines] == [(10, 0), (10, 1), (20, 0), (20, 1)] + [
        (20, "merged")
    ]
    rank_of = {0: 0, 1: 1, "merged": 0}  # instance 0 is workers (0, 2), instance 1 workers (1, 3)
    for line in lines:
        assert line["dataset"] is None and line["eval_perplexity"] == pytest.approx(math.exp(line["eval_loss"]))
        check = next(
            c for c in reports[rank_of[line["instance"]]]["checks"] if c["step"] == line["global_step"]
            and c["instance"] == line["instance"]
        )  # fmt: skip
        assert line["eval_token_accuracy"] == pytest.approx(check["direct"]["token_accuracy"], abs=1e-6)
        assert line["eval_label_logprob"] == pytest.approx(check["direct"]["label_logprob"], abs=1e-5)
    # The top-level metric is the demand-weighted mean of the instances'.
    top, demand = reports[0]["top_level"]["metrics"], reports[0]["top_level"]["demand"]
    mean = sum(demand[str(i)] * by_step[10][i]["label_logprob"] for i in (0, 1)) / sum(demand.values())
    assert top["eval_label_logprob"] == pytest.approx(mean)


def test_causal_lms_are_told_from_other_models():
    assert is_causal_lm(tiny_model()) and is_causal_lm(torch.compile(tiny_model()))
    assert not is_causal_lm(tiny_classifier())
    peft = pytest.importorskip("peft")
    lora = peft.LoraConfig(r=2, target_modules=["q_proj", "v_proj"])
    assert is_causal_lm(peft.get_peft_model(tiny_model(), lora))
    classifier = peft.LoraConfig(r=2, target_modules=["query", "value"], task_type="SEQ_CLS")
    assert not is_causal_lm(peft.get_peft_model(tiny_classifier(), classifier))


def test_several_instances_report_their_mean_under_its_own_name():
    per_instance = {0: {"loss": 1.0, "accuracy": 0.5}, 1: {"loss": 2.0, "accuracy": 0.8}}
    metrics = combine_instance_metrics(per_instance, {0: 1.0, 1: 3.0}, "eval", causal_lm=True)
    assert metrics["eval_instances_mean_loss"] == metrics["eval_loss"] == pytest.approx(1.75)
    assert metrics["eval_instances_mean_perplexity"] == metrics["eval_perplexity"] == pytest.approx(math.exp(1.75))
    assert "eval_instances_mean_accuracy" not in metrics  # loss and perplexity only
    classifier = combine_instance_metrics(per_instance, {0: 1.0, 1: 3.0}, "eval_in", causal_lm=False)
    assert "eval_in_instances_mean_loss" in classifier and "eval_in_instances_mean_perplexity" not in classifier
    one = combine_instance_metrics({0: {"loss": 1.0}}, {0: 1.0}, "eval", causal_lm=True)
    assert not any("instances_mean" in key for key in one)


def test_a_resume_keeps_the_merges_evaluated_while_training(tmp_path):
    log = RunLog(str(tmp_path))
    log.start(resumed_outer_step=None, resumed_global_step=None)
    lines = [
        {"global_step": 10, "instance": 0, "eval_loss": 2.5},
        {"global_step": 10, "instance": MERGED, "final": False, "eval_loss": 2.9},
        {"global_step": 20, "instance": 0, "eval_loss": 2.2},
        {"global_step": 20, "instance": MERGED, "final": False, "eval_loss": 2.6},
        {"global_step": 20, "instance": MERGED, "final": True, "eval_loss": 2.6},
        {"global_step": 20, "instance": MERGED, "eval_loss": 2.6},  # a final line written before `final` existed
    ]
    log.write_eval(lines)
    RunLog(str(tmp_path)).start(resumed_outer_step=2, resumed_global_step=20)
    assert load_evals(tmp_path) == lines[:4]


def _merged_eval_run(tmp_path, name: str, eval_merged_model: bool) -> tuple[str, list[dict]]:
    out, probe = str(tmp_path / name), str(tmp_path / f"{name}-probe")
    spec = {
        "output_dir": out,
        "world_size": 2,
        "probe_dir": probe,
        "num_eval": 45,
        "eval_merged_model": eval_merged_model,
    }
    launch(os.path.join(SCRIPTS, "merged_eval_worker.py"), json.dumps(spec), num_processes=2)
    reports = [json.load(open(os.path.join(probe, f"report-rank{r}.json"))) for r in range(2)]
    assert [r["world_size"] for r in reports] == [2, 2]
    return out, reports


def _direct_metrics(phi: torch.Tensor, dataset) -> dict[str, float]:
    """Loss (every label counts: the token-weighted cross-entropy) and token accuracy of the weights `phi`."""
    model = tiny_model()
    params = [p for p in model.parameters() if p.requires_grad]
    assert phi.numel() == sum(p.numel() for p in params)
    with torch.no_grad():
        offset = 0
        for p in params:
            p.copy_(phi[offset : offset + p.numel()].view(p.shape))
            offset += p.numel()
        batch = default_data_collator([dataset[i] for i in range(len(dataset))])
        output = model(input_ids=batch["input_ids"], labels=batch["labels"])
    accuracy = (output.logits[:, :-1].argmax(-1) == batch["labels"][:, 1:]).float().mean().item()
    return {"loss": output.loss.item(), "token_accuracy": accuracy}


@pytest.mark.multiprocess
def test_the_merged_model_is_evaluated_while_training_and_training_is_unaffected(tmp_path):
    out, reports = _merged_eval_run(tmp_path, "merged", eval_merged_model=True)
    eval_set = sequence_dataset(256).select(range(45))
    during = {e["step"]: e for e in reports[0]["evaluations"] if not e["final_merged"]}
    assert set(during) == {10, 20}
    for step, entry in during.items():
        metrics, instances = entry["metrics"], entry["instances"]
        # Two instances of one worker each: rank r is instance r. The average the final merge would take now,
        # computed here from each instance's φ (every instance has trained: demand-weighted).
        assert {i: workers for i, (workers, _, _) in instances.items()} == {"0": [0], "1": [1]}
        assert all(trained for _, _, trained in instances.values())
        demand = {int(i): d for i, (_, d, _) in instances.items()}
        phis = {r: torch.load(os.path.join(tmp_path, "merged-probe", f"phi-rank{r}-step{step}.pt")) for r in (0, 1)}
        averaged = sum(demand[r] * phis[r].double() for r in (0, 1)) / sum(demand.values())
        direct = _direct_metrics(averaged.float(), eval_set)
        assert metrics["eval_merged_loss"] == pytest.approx(direct["loss"], abs=1e-5)
        assert metrics["eval_merged_perplexity"] == pytest.approx(math.exp(metrics["eval_merged_loss"]))
        assert metrics["eval_merged_token_accuracy"] == pytest.approx(direct["token_accuracy"], abs=1e-6)
        # The top-level loss is the instances' mean, under its own name too, and not the merged model's.
        instance_losses = {i: metrics[f"eval_instance_{i}_loss"] for i in (0, 1)}
        mean = sum(demand[i] * instance_losses[i] for i in (0, 1)) / sum(demand.values())
        assert metrics["eval_instances_mean_loss"] == metrics["eval_loss"] == pytest.approx(mean)
        assert metrics["eval_instances_mean_perplexity"] == pytest.approx(math.exp(mean))
        assert abs(metrics["eval_merged_loss"] - mean) > 1e-3  # independently initialised: another model
        for report in reports:  # every worker logged the same numbers and got its own weights back, bit for bit
            mine = next(e for e in report["evaluations"] if e["step"] == step and not e["final_merged"])
            assert mine["metrics"]["eval_merged_loss"] == metrics["eval_merged_loss"]
            assert mine["params_are_own_phi"]
    lines = load_evals(out)
    assert [(line["global_step"], line["instance"], line.get("final")) for line in lines] == [
        (10, 0, None), (10, 1, None), (10, "merged", False), (20, 0, None), (20, 1, None), (20, "merged", False),
        (20, "merged", True),
    ]  # fmt: skip
    for line in lines[:-1]:
        if line["instance"] == MERGED:
            assert line["eval_loss"] == during[line["global_step"]]["metrics"]["eval_merged_loss"]
    # The final merge is the model evaluated at the last step: the same loss, up to the order of the sums.
    assert lines[-1]["eval_loss"] == pytest.approx(lines[-2]["eval_loss"], abs=1e-5)

    # The same run without it trains bit for bit the same: the same final merged model and rounds.
    plain_out, plain_reports = _merged_eval_run(tmp_path, "plain", eval_merged_model=False)
    plain_metrics = next(e["metrics"] for e in plain_reports[0]["evaluations"] if e["step"] == 10)
    assert not any("merged" in key for key in plain_metrics) and "eval_instances_mean_loss" in plain_metrics
    merged_model = load_file(os.path.join(out, "merged", "model.safetensors"))
    plain_model = load_file(os.path.join(plain_out, "merged", "model.safetensors"))
    assert merged_model.keys() == plain_model.keys()
    assert all(torch.equal(merged_model[name], plain_model[name]) for name in merged_model)
    rounds = [(r["outer_step"], r["instance"], r["train_loss"], r["pseudo_grad_norm"]) for r in load_rounds(out)]
    assert rounds == [
        (r["outer_step"], r["instance"], r["train_loss"], r["pseudo_grad_norm"]) for r in load_rounds(plain_out)
    ]
    assert [line for line in load_evals(plain_out) if line["instance"] != MERGED] == [
        line for line in lines if line["instance"] != MERGED
    ]
