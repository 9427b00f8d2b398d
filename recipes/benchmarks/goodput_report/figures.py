"""The goodput rule's figures from `links`' and `convergence`'s results: its time to the best fixed batch's final
perplexity over that batch's wall time, its perplexity at equal tokens against `diloco_b4`, each merge's link time in
bf16 model-times."""

import json
import math
import os

from recipes.benchmarks.toolkit.stats import interpolate_curve


__all__ = [
    "FIXED",
    "GOODPUT",
    "MERGE_TARGET",
    "NORM",
    "PAYLOAD_BYTES",
    "PPL_TARGET",
    "UNLIMITED",
    "VARIANTS",
    "WALL_TARGETS",
    "convergence_figures",
    "links_figures",
    "merge_link_model_times",
    "merge_times",
    "time_to",
    "wall_ratio",
]

FIXED = ("diloco_b4", "diloco_b8", "diloco_b16")
GOODPUT = "adloco_goodput"  # the method; its targets
# Reported alike, where they ran; adloco_norm: adloco_goodput with the norm test (what the rule itself adds).
NORM = "adloco_norm"
VARIANTS = (GOODPUT, NORM, "diloco_goodput")
# bandwidth → the most adloco_goodput may take of the best fixed batch's wall time
WALL_TARGETS = {"10mbit": 0.8, "100mbit": 1.0, "no limit": 1.05}
UNLIMITED = ("10gbit", "no limit")  # a tbf this fast limits nothing these CPU workers send
PPL_TARGET = 1.05
MERGE_TARGET = 3.0


def time_to(curve: list[tuple[float, float]], target: float) -> float | None:
    """Training seconds at which a [(seconds, ppl), ...] curve first reaches `target` (log-ppl interpolated)."""
    points = [(s, p) for s, p in curve if s is not None and p is not None and math.isfinite(p) and p > 0]
    for i, (seconds, ppl) in enumerate(points):
        if ppl <= target:
            if i == 0:
                return seconds
            s0, p0 = points[i - 1]
            t = (math.log(p0) - math.log(target)) / (math.log(p0) - math.log(ppl))
            return s0 + t * (seconds - s0)
    return None


def wall_ratio(runs: dict[str, dict], curve_of, method: str = GOODPUT) -> dict | None:
    """The goodput method's time to the best fixed batch's final perplexity over that batch's wall time."""
    fixed = {name: runs[name] for name in FIXED if name in runs and "final_eval_ppl" in runs[name]}
    if method not in runs or "final_eval_ppl" not in runs[method] or not fixed:
        return None
    best = min(fixed, key=lambda name: fixed[name]["final_eval_ppl"])
    target, wall = fixed[best]["final_eval_ppl"], fixed[best]["wall_seconds"]
    reached = time_to(curve_of(runs[method]), target)
    return {
        "best_fixed": best,
        "target_ppl": target,
        "best_wall_seconds": wall,
        "goodput_seconds_to_target": reached,
        "ratio": None if reached is None else reached / wall,
        "goodput_final_ppl": runs[method]["final_eval_ppl"],
        "goodput_wall_seconds": runs[method]["wall_seconds"],
        "fixed": {name: [run["final_eval_ppl"], run["wall_seconds"]] for name, run in fixed.items()},
    }


def merge_times(run: dict, parameters: int) -> list[float]:
    """Each merge's link time in bf16 model-times, from the run's rounds file."""
    path = run.get("timings", {}).get("rounds_file")
    if not path or not os.path.exists(path):
        return []
    model_seconds = 2 * parameters * 8 / run["bandwidth_bits_per_second"]
    with open(path, encoding="utf-8") as f:
        lines = [json.loads(line) for line in f if line.strip()]
    return [line["merge_seconds"] / model_seconds for line in lines if line.get("merged_from")]


# Bytes a parameter of one member's contribution to an all-reduce merge (instances/payload.py).
PAYLOAD_BYTES = {"float32": 8.0, "compact": 3.0 + 4.0 / 256}


def merge_link_model_times(lines: list[dict], parameters: int, payload: str) -> list[float]:
    """Each all-reduce merge's link time in bf16 model-times, from the bytes the rounds file logs (`merge_bytes`: what
    all members sent): a ring of n members sends 2 (n - 1) payloads in all, 2 (n - 1) / n of them over each member's
    link, so the busiest link carries merge_bytes / n; over 2 bytes a parameter (the link's rate cancels, latency
    left out). For runs on one machine, where no link limits the merge."""
    per_member = PAYLOAD_BYTES[payload] * parameters
    out = []
    for line in lines:
        if not line.get("merged_from") or not line.get("merge_bytes"):
            continue
        members = round(line["merge_bytes"] / (2 * per_member)) + 1
        out.append(line["merge_bytes"] / members / (2 * parameters))
    return out


def link_curve(run: dict) -> list[tuple[float, float]]:
    return [(s, p) for s, _, p in run["curve"]]


def links_figures(results: dict, method: str = GOODPUT) -> dict:
    out = {}
    for bandwidth, runs in results["bandwidths"].items():
        label = "no limit" if bandwidth in UNLIMITED else bandwidth
        entry = {"wall": wall_ratio(runs, link_curve, method)}
        if method in runs and "timings" in runs[method]:
            numel = parameters_of(runs[method])
            entry["merge_model_times"] = merge_times(runs[method], numel) if numel else []
        out[label] = entry
    return out


def parameters_of(run: dict) -> int | None:
    path = os.path.join(run["folder"], "result.json")
    if os.path.exists(path):
        with open(path, encoding="utf-8") as f:
            return json.load(f).get("parameters")
    return None


def eval_points(run: dict) -> list[tuple[float, float]]:
    return [(p["seconds"], p["eval_ppl"]) for p in run["evals"]]


def convergence_figures(results: dict, method: str = GOODPUT, root: str | None = None) -> list[dict]:
    """Per seed: the wall-time ratio without a link limit, the perplexity at equal tokens against diloco_b4 and, with
    `root` (the results file's folder, which holds NAME/seed-S/), each merge's bytes in bf16 model-times."""
    methods = results["methods"]
    out = []
    for seed in results["seeds"]:
        runs = {
            name: m["seed_results"][seed if seed in m["seed_results"] else str(seed)]
            for name, m in methods.items()
            if "seed_results" in m
        }
        initial = results["initial_eval_ppl"].get(str(seed), results["initial_eval_ppl"].get(seed))
        row = {"seed": seed}
        folder = os.path.join(root or "", method, f"seed-{seed}")  # the method's run folder (its spec, rounds file)
        rounds, spec = os.path.join(folder, "adloco_rounds.jsonl"), os.path.join(folder, "spec.json")
        if root and method in runs and os.path.exists(rounds) and runs[method].get("parameters"):
            with open(rounds, encoding="utf-8") as f:
                lines = [json.loads(line) for line in f if line.strip()]
            with open(spec, encoding="utf-8") as f:
                payload = json.load(f)["adloco"]["merge_payload"]
            row["merge_model_times"] = merge_link_model_times(lines, runs[method]["parameters"], payload)
        row["wall"] = wall_ratio(runs, lambda run, first=initial: [(0.0, first)] + eval_points(run), method)
        if method in runs and "diloco_b4" in runs:
            a, b = runs[method]["curve"], runs["diloco_b4"]["curve"]
            tokens = min(a[-1][0], b[-1][0])
            row["tokens"] = tokens
            row["ppl_vs_b4"] = interpolate_curve(a, tokens) / interpolate_curve(b, tokens)
        out.append(row)
    return out
