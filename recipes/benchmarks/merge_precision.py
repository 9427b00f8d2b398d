"""A compact merge's model against today's float32 merge: eval perplexity of the same merges (issue 25, part 2).

Four copies of the benchmark model (`convergence.py`'s preset, data and inner optimizer) start from the same weights,
as AdLoCo's instances do (`instance_init="shared"`), and each trains on its own shard of fresh tokens. Then AdLoCo's
merges of four instances: 0 with 1 (equal demands), 2 with 3 (demands 3 : 1), then the two survivors (3 : 2); every
merge is computed twice from the same inputs:

- float32 (`merge_payload="float32"`): w_s φ_s + w_m φ_m in float32, as the all-reduce computes it;
- compact (`merge_payload="compact"`, `adloco_hf/instances/payload.py`): each member's w_i / n_i × φ_i rounded to
  bfloat16 and summed in bfloat16 member by member (each partial sum rounded, as a ring's hops round them: the
  worst case of the bf16 all-reduce), for n = 4 members (2 workers per instance) and n = 2.

The second-level merge takes each side's own first-level result (the compact chain compounds its rounding). Reported
per seed and merge: the eval perplexity (first 512 held-out blocks) of both, and their ratio; the criterion is
|compact / float32 − 1| ≤ 0.5 %.

    python -m recipes.benchmarks.merge_precision                    # 2 seeds, 300 steps per instance
    python -m recipes.benchmarks.merge_precision --seeds 3 --steps 600

Outputs in `--output_dir` (default `outputs/benchmarks/merge_precision`): `results.json` and `table.md`.
"""

import argparse
import json
import math
import os
import time

import torch

from recipes.benchmarks import convergence
from recipes.benchmarks._common import table, write_json


CRITERION = 0.005
# (first, second, their demands); -1 and -2 are the first two merges' results.
MERGES = (("0+1", 0, 1, (1.0, 1.0)), ("2+3", 2, 3, (3.0, 1.0)), ("(0+1)+(2+3)", -1, -2, (3.0, 2.0)))


def flat(model) -> torch.Tensor:
    return torch.cat([p.detach().float().reshape(-1) for p in model.parameters()])


def load_flat(model, values: torch.Tensor) -> None:
    offset = 0
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(values[offset : offset + p.numel()].view_as(p))
            offset += p.numel()


def float32_merge(a: torch.Tensor, b: torch.Tensor, weights: tuple[float, float]) -> torch.Tensor:
    return a * weights[0] + b * weights[1]


def compact_merge(a: torch.Tensor, b: torch.Tensor, weights: tuple[float, float], members: int) -> torch.Tensor:
    """The compact payload's φ: `members` // 2 members of each instance add w_i / n_i × φ_i in bfloat16, the
    partial sum rounded after every addition (a ring's hops), taken back as float32."""
    per_side = members // 2
    terms = [(a * (weights[0] / per_side)).bfloat16()] * per_side + [
        (b * (weights[1] / per_side)).bfloat16()
    ] * per_side
    total = terms[0]
    for term in terms[1:]:
        total = (total.float() + term.float()).bfloat16()
    return total.float()


def perplexity(model, eval_set, batch: int = 64) -> float:
    from transformers import default_data_collator

    total, count = 0.0, 0
    model.eval()
    with torch.no_grad():
        for start in range(0, len(eval_set), batch):
            inputs = default_data_collator([eval_set[i] for i in range(start, min(start + batch, len(eval_set)))])
            ids = inputs["input_ids"]
            logits = model(input_ids=ids).logits[:, :-1].float()
            labels = ids[:, 1:]
            total += torch.nn.functional.cross_entropy(
                logits.reshape(-1, logits.shape[-1]), labels.reshape(-1), reduction="sum"
            ).item()
            count += labels.numel()
    return math.exp(total / count)


def train_instance(model, blocks, settings: dict, steps: int, batch: int) -> None:
    """AdamW as the benchmark's inner optimizer (lr, β₂, weight decay, clipping), warm-up then constant."""
    from transformers import default_data_collator

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
    from recipes.benchmarks._convergence_worker import load_data, make_model

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
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=2)
    parser.add_argument("--steps", type=int, default=300, help="Inner steps per instance before the merges.")
    parser.add_argument("--batch_size", type=int, default=4)
    parser.add_argument("--cache_dir", default="outputs/cache")
    parser.add_argument("--output_dir", default="outputs/benchmarks/merge_precision")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    torch.set_num_threads(1)
    settings = convergence.shared_settings(convergence.parse_args(["--cache_dir", args.cache_dir]))
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
    with open(os.path.join(args.output_dir, "table.md"), "w", encoding="utf-8") as f:
        f.write(report + "\n")
    print(report)
    return results


if __name__ == "__main__":
    main()
