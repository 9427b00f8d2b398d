"""The methods compared: perplexity at equal tokens, the ratios against DDP, DiLoCo and a variant's base paired by
seed, the tokens (and steps, rounds, bytes, seconds) to target perplexities, and the targets AdLoCo is measured
against."""

from recipes.benchmarks.convergence.seeds import mean_sd, wall_per_round
from recipes.benchmarks.toolkit.methods import METHODS
from recipes.benchmarks.toolkit.stats import choose_targets, first_reach, interpolate_curve, ratio


__all__ = [
    "TARGET_FIELDS",
    "check_targets",
    "compare",
    "eval_points",
    "reach",
    "seed_curves",
    "to_target",
    "verdict",
]

TARGET_FIELDS = {"tokens": "tokens", "inner_steps": "inner_steps", "rounds": "rounds", "bytes": "comm_bytes",
                 "seconds": "seconds"}  # fmt: skip


def reach(points: list[dict], target: float) -> dict | None:
    """Tokens, inner steps, rounds, bytes and training seconds at which a run's eval curve first reaches perplexity
    `target` ([`first_reach`]); `points` are the run's evaluations in order, from the initial model's."""
    return first_reach(points, target, TARGET_FIELDS)


def eval_points(result: dict, initial_ppl: float | None) -> list[dict]:
    """A run's evaluations in order, from the initial model's (0 tokens, seconds, steps, rounds, bytes)."""
    start = [] if initial_ppl is None else [{"eval_ppl": initial_ppl, **{k: 0 for k in TARGET_FIELDS.values()}}]
    return start + list(result.get("evals", []))


def to_target(methods: dict[str, dict], initial_ppl: dict[int, float]) -> list[float]:
    """Choose the targets over every seed of every method and add `to_target` to each method in place:
    `{"<ppl>": {"tokens", "inner_steps", "rounds", "bytes", "seconds"}}` (means over seeds, and `<field>_seeds`)."""
    runs = {
        (name, seed): eval_points(r, initial_ppl.get(seed))
        for name, m in methods.items()
        if "error" not in m
        for seed, r in m["seed_results"].items()
        if "error" not in r
    }
    if not runs:
        return []
    targets = choose_targets([min(p["eval_ppl"] for p in points) for points in runs.values()])
    for name, m in methods.items():
        if "error" in m:
            continue
        m["to_target"] = {}
        for target in targets:
            reached = [reach(runs[(name, seed)], target) for seed in m["seeds"]]
            entry = {}
            for field in TARGET_FIELDS:
                values = [r[field] if r else None for r in reached]
                # A seed that never reached the target (or lacks the field) leaves the mean undefined.
                entry[field] = None if any(v is None for v in values) else mean_sd(values)[0]
                entry[f"{field}_seeds"] = values
            m["to_target"][f"{target:g}"] = entry
    return targets


def seed_curves(m: dict) -> dict:
    """`{seed: curve}` of a method (a method without per-seed results counts as one seed)."""
    runs = m.get("seed_results")
    if not runs:
        return {None: m["curve"]}
    return {seed: r["curve"] for seed, r in runs.items() if "error" not in r}


def verdict(ratios: list[float]) -> str:
    """`better` / `worse` when the mean of the paired ratios differs from 1 by more than their spread (sample
    standard deviation over seeds), else `tie`; with one seed there is no spread to judge by."""
    mean, sd = mean_sd(ratios, geometric=True)
    if mean is None:
        return "-"
    if sd is None:
        return "1 seed"
    if abs(mean - 1.0) <= sd:
        return "tie"
    return "better" if mean < 1.0 else "worse"


def compare(methods: dict[str, dict]) -> dict:
    """Perplexity at equal tokens (the smallest final token count of any seed of any method) and the ratios
    against ddp and diloco (and a variant's `variant_of`, e.g. adloco for adloco_int8), paired by seed (same initial
    weights and data order); adds keys to each method (`ppl_vs_<ref>`, `bytes_vs_<ref>`, `wall_vs_<ref>` ...)."""
    done = {name: m for name, m in methods.items() if "error" not in m}
    if not done:
        return {}
    curves = {name: seed_curves(m) for name, m in done.items()}
    equal_tokens = min(max(x for x, _ in c) for by_seed in curves.values() for c in by_seed.values())
    at_equal = {
        name: {s: interpolate_curve(c, equal_tokens) for s, c in by_seed.items()} for name, by_seed in curves.items()
    }
    for name, m in done.items():
        m["ppl_at_equal_tokens_seeds"] = list(at_equal[name].values())
        m["ppl_at_equal_tokens"], m["ppl_at_equal_tokens_sd"] = mean_sd(m["ppl_at_equal_tokens_seeds"], geometric=True)
    for name, m in done.items():
        base = METHODS.get(name, {}).get("variant_of")  # a variant is compared with its base method too
        for ref in ("ddp", "diloco", *([base] if base not in (None, "ddp", "diloco") else [])):
            other = None if ref == name else done.get(ref)
            paired = []
            if other is not None:
                paired = [ratio(at_equal[name][s], at_equal[ref][s]) for s in at_equal[name] if s in at_equal[ref]]
            m[f"ppl_vs_{ref}_seeds"] = paired
            m[f"ppl_vs_{ref}"], m[f"ppl_vs_{ref}_sd"] = mean_sd(paired, geometric=True) if paired else (None, None)
            m[f"ppl_vs_{ref}_verdict"] = verdict(paired) if paired else "-"
            m[f"bytes_vs_{ref}"] = ratio(m["comm_bytes"], other and other["comm_bytes"])
            m[f"measured_bytes_vs_{ref}"] = ratio(m["measured_bytes_sent"], other and other["measured_bytes_sent"])
            m[f"wall_vs_{ref}"] = ratio(m["wall_seconds"], other and other["wall_seconds"])
        twin = METHODS.get(name, {}).get("equal_batches")
        if twin in done:  # a split by speed against equal batches on the same slow worker, paired by seed
            mine, theirs = m["seed_results"], done[twin]["seed_results"]
            paired = [
                ratio(wall_per_round(mine[s]), wall_per_round(theirs[s]))
                for s in mine
                if s in theirs and "error" not in mine[s] and "error" not in theirs[s]
            ]
            paired = [p for p in paired if p is not None]
            m[f"wall_per_round_vs_{twin}_seeds"] = paired
            m[f"wall_per_round_vs_{twin}"], m[f"wall_per_round_vs_{twin}_sd"] = mean_sd(paired)
    return {"equal_tokens": equal_tokens, "targets": check_targets(done)}


def check_targets(done: dict[str, dict]) -> dict[str, dict]:
    """The goals AdLoCo is measured against (not assertions): each with the value, the bound and whether it holds."""
    targets = {}

    def add(name, value, bound, low=None):
        holds = None if value is None else value <= bound and (low is None or value >= low)
        targets[name] = {"value": value, "bound": bound, "low": low, "holds": holds}

    # Workers of different speeds: one of 4 at a quarter of a core, a split by speed against equal batches.
    for name, m in done.items():
        twin, base = METHODS.get(name, {}).get("equal_batches"), METHODS.get(name, {}).get("variant_of")
        if twin in done:
            add(f"{name} wall per round / {twin}", m.get(f"wall_per_round_vs_{twin}"), 0.6)
        if twin is not None and base in done:
            add(f"{name} ppl / {base} ppl at equal tokens (within 2 %)", m.get(f"ppl_vs_{base}"), 1.02, 0.98)
    adloco = done.get("adloco")
    if adloco is None:
        return targets

    if "diloco" in done:
        add("adloco ppl / diloco ppl at equal tokens", adloco["ppl_vs_diloco"], 1.0)
        add("adloco bytes / diloco bytes", adloco["bytes_vs_diloco"], 0.7)
    if "ddp" in done:
        add("adloco ppl / ddp ppl at equal tokens", adloco["ppl_vs_ddp"], 1.05)
        add("adloco bytes / ddp bytes", adloco["bytes_vs_ddp"], 0.02)
    return targets
