"""`python -m recipes.benchmarks.merge_precision`: four instances trained apart from shared weights per seed, their
three merges in float32 and compact, each merged model's eval perplexity."""

import argparse
import json
import os
import time

import torch
from transformers import default_data_collator

from recipes.benchmarks.merge_precision.merges import CRITERION, MERGES, compact_merge, flat, float32_merge, load_flat
from recipes.benchmarks.toolkit.data import load_data, make_model, perplexity
from recipes.benchmarks.toolkit.options import parse_run_args
from recipes.benchmarks.toolkit.results import table, write_json, write_report
from recipes.benchmarks.toolkit.settings import shared_settings


__all__ = ["main", "parse_args", "run_seed", "train_instance"]

DESCRIPTION = (
    "A compact merge's model against today's float32 merge: eval perplexity of the same merges (issue 25, part 2)."
)


def train_instance(model, blocks, settings: dict, steps: int, batch: int) -> None:
    """AdamW as the benchmark's inner optimizer (lr, β₂, weight decay, clipping), warm-up then constant."""
    train = settings["train"]
    optimizer = torch.optim.AdamW(
        model.parameters(),
        lr=train["learning_rate"],
        betas=(0.9, train["adam_beta2"]),
        weight_decay=train["weight_decay"],
    )
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / train["warmup_steps"]))
    model.train()
    for step in range(steps):
        inputs = default_data_collator([blocks[i] for i in range(step * batch, (step + 1) * batch)])
        loss = model(input_ids=inputs["input_ids"], labels=inputs["labels"]).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), train["max_grad_norm"])
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)


def run_seed(settings: dict, seed: int, steps: int, batch: int) -> dict:
    torch.manual_seed(seed)
    tokenizer, lm = load_data(settings)
    spec = {**settings, "seed": seed}
    base = make_model(spec, tokenizer)
    initial = flat(base)
    order = torch.randperm(len(lm["train"]), generator=torch.Generator().manual_seed(seed)).tolist()
    per_instance = steps * batch
    instances = []
    for k in range(4):  # disjoint shards: no instance sees another's tokens, none repeats one
        shard = lm["train"].select(order[k * per_instance : (k + 1) * per_instance])
        load_flat(base, initial)
        train_instance(base, shard, settings, steps, batch)
        instances.append(flat(base))
    eval_set = lm["eval"]
    rows = []
    results = {"float32": [], "compact4": [], "compact2": []}
    for name, i, j, demands in MERGES:
        weights = (demands[0] / sum(demands), demands[1] / sum(demands))
        row = {"merge": name, "weights": [round(w, 4) for w in weights]}
        for kind in results:
            a = instances[i] if i >= 0 else results[kind][-i - 1]
            b = instances[j] if j >= 0 else results[kind][-j - 1]
            merged = float32_merge(a, b, weights) if kind == "float32" else compact_merge(a, b, weights, int(kind[-1]))
            results[kind].append(merged)
            load_flat(base, merged)
            row[f"ppl {kind}"] = perplexity(base, eval_set)
        for kind in ("compact4", "compact2"):
            row[f"{kind} / float32"] = row[f"ppl {kind}"] / row["ppl float32"]
        row["largest weight change (n=4)"] = (results["compact4"][-1] - results["float32"][-1]).abs().max().item()
        rows.append(row)
    instance_ppl = []
    for values in instances:
        load_flat(base, values)
        instance_ppl.append(perplexity(base, eval_set))
    return {"seed": seed, "merges": rows, "instance_ppl": instance_ppl, "tokens_per_instance": per_instance * 128}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=DESCRIPTION)
    parser.add_argument("--seeds", type=int, default=2)
    parser.add_argument("--steps", type=int, default=300, help="Inner steps per instance before the merges.")
    parser.add_argument("--batch_size", type=int, default=4)
    parser.add_argument("--cache_dir", default="outputs/cache")
    parser.add_argument("--output_dir", default="outputs/benchmarks/merge_precision")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> dict:
    """Train and merge for every seed; write `results.json` and `table.md`."""
    args = parse_args(argv)
    torch.set_num_threads(1)
    settings = shared_settings(parse_run_args(["--cache_dir", args.cache_dir]))
    start = time.perf_counter()
    seeds = [run_seed(settings, 42 + k, args.steps, args.batch_size) for k in range(args.seeds)]
    rows = [{"seed": s["seed"], **row} for s in seeds for row in s["merges"]]
    worst = max(abs(row[f"{kind} / float32"] - 1) for row in rows for kind in ("compact4", "compact2"))
    shown = [{k: f"{v:.5f}" if k.endswith("/ float32") else v for k, v in row.items()} for row in rows]
    results = {
        "seeds": seeds,
        "criterion": {"max |compact / float32 - 1|": worst, "bound": CRITERION, "holds": worst <= CRITERION},
        "settings": {"steps": args.steps, "batch_size": args.batch_size, "preset": settings["preset"]},
        "seconds": time.perf_counter() - start,
    }
    os.makedirs(args.output_dir, exist_ok=True)
    write_json(os.path.join(args.output_dir, "results.json"), results)
    report = table(shown, list(shown[0])) + (
        f"\n\nmax |compact / float32 - 1| = {worst:.5f} (criterion <= {CRITERION}: "
        f"{'holds' if worst <= CRITERION else 'MISSED'}); instances' own ppl: "
        + json.dumps({s["seed"]: [round(p, 1) for p in s["instance_ppl"]] for s in seeds})
    )
    write_report(args.output_dir, report)
    return results
