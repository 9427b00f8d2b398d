"""The benchmark's report: the table of methods, one line per note (failed seeds, curves, matched batches, variants,
targets), the to-target table, and `summary.json`, the compact record kept beside the docs."""

from recipes.benchmarks.toolkit.methods import METHODS
from recipes.benchmarks.toolkit.results import human_bytes, table


__all__ = [
    "COLUMNS",
    "CURVE_KINDS",
    "SUMMARY_KEYS",
    "format_report",
    "plus_minus",
    "ratio_cell",
    "summary",
    "table_rows",
    "to_target_table",
]

COLUMNS = [
    "method",
    "seeds",
    "tokens",
    "epochs",
    "ppl@equal",
    "ppl/ddp",
    "ppl/diloco",
    "final ppl",
    "comm rounds",
    "bytes (model)",
    "bytes/diloco",
    "bytes (measured)",
    "wall s",
    "wall/ddp",
    "final batch",
]


def plus_minus(mean: float | None, sd: float | None, digits: int = 1) -> str | None:
    if mean is None:
        return None
    return f"{mean:.{digits}f}" if sd is None else f"{mean:.{digits}f} ± {sd:.{digits}f}"


def table_rows(methods: dict[str, dict]) -> list[dict]:
    rows = []
    for name, m in methods.items():
        if "error" in m:
            rows.append({"method": name, "tokens": m["error"]})
            continue
        rows.append(
            {
                "method": name,
                "seeds": len(m.get("seeds", [None])),
                "tokens": f"{m['tokens']:,.0f}",
                "epochs": None
                if m.get("epochs") is None
                else f"{m['epochs']:.2f} ({m.get('max_worker_epochs', 0):.2f})",
                "ppl@equal": plus_minus(m.get("ppl_at_equal_tokens"), m.get("ppl_at_equal_tokens_sd")),
                "ppl/ddp": ratio_cell(m, "ddp"),
                "ppl/diloco": ratio_cell(m, "diloco"),
                "final ppl": plus_minus(m["final_eval_ppl"], m.get("final_eval_ppl_sd")),
                "comm rounds": m["comm_rounds"],
                "bytes (model)": human_bytes(m["comm_bytes"]),
                "bytes/diloco": m.get("bytes_vs_diloco"),
                "bytes (measured)": human_bytes(m.get("measured_bytes_sent")),
                "wall s": m["wall_seconds"],
                "wall/ddp": m.get("wall_vs_ddp"),
                "final batch": m["batch_sizes"][-1][1] if m.get("batch_sizes") else None,
            }
        )
    return rows


def ratio_cell(m: dict, ref: str) -> str | None:
    cell = plus_minus(m.get(f"ppl_vs_{ref}"), m.get(f"ppl_vs_{ref}_sd"), digits=3)
    if cell is None:
        return None
    pairs, seeds = len(m.get(f"ppl_vs_{ref}_seeds", [])), len(m.get("seeds", []))
    if seeds and pairs < seeds:  # a seed of either method failed: fewer pairs than seeds
        cell += f" [n={pairs}/{seeds}]"
    return f"{cell} ({m[f'ppl_vs_{ref}_verdict']})" if m.get(f"ppl_vs_{ref}_verdict") not in (None, "-") else cell


def ratio_text(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}x"


def to_target_table(methods: dict[str, dict], targets: list[float]) -> str:
    """Per method and target: mean tokens, inner steps, rounds, bytes (modelled) and training seconds to reach it."""
    columns = ["method", "target ppl", "tokens", "inner steps", "rounds", "bytes (model)", "seconds"]
    rows = []
    for target in targets:
        for name, m in methods.items():
            entry = m.get("to_target", {}).get(f"{target:g}")
            if entry is None:
                continue
            missing = sum(v is None for v in entry["tokens_seeds"])
            rows.append(
                {
                    "method": name,
                    "target ppl": f"{target:g}",
                    "tokens": None
                    if entry["tokens"] is None
                    else f"{entry['tokens']:,.0f}" + (f" ({missing} seed(s) never)" if missing else ""),
                    "inner steps": entry["inner_steps"],
                    "rounds": entry["rounds"],
                    "bytes (model)": human_bytes(entry["bytes"]),
                    "seconds": entry["seconds"],
                }
            )
    return table(rows, columns)


# What a method's curve follows while several instances train (`curve_kind`; "model": one model throughout).
CURVE_KINDS = {
    "merged": "its curve is the merged model's (the instances averaged as the final merge would, at every "
    "evaluation); the instances' demand-weighted mean is kept as curve_instances_mean",
    "instances_mean": "while several instances train its curve is the demand-weighted mean of their losses "
    "(eval_merged_model off), which no single model achieves",
}


def format_report(results: dict) -> str:
    lines = [table(table_rows(results["methods"]), COLUMNS)]
    equal = results.get("equal_tokens")
    if equal is not None:
        lines.append(
            f"\nppl@equal: eval perplexity interpolated at {equal:,} tokens (the smallest final token count of any "
            "seed), geometric mean ± sample standard deviation over seeds. ppl/ddp, ppl/diloco: ratios paired by "
            "seed, geometric mean ± sd; a mean within one sd of 1 is a tie. epochs: tokens / train-split tokens "
            "(most passes of any worker over its own shard)."
        )
    for name, m in results["methods"].items():
        if "error" in m:
            continue
        if m.get("failed_seeds"):
            lines.append(f"{name}: seed(s) {m['failed_seeds']} failed and are left out of its means")
        kind = m.get("curve_kind", "model")
        if kind != "model":
            lines.append(f"{name}: {CURVE_KINDS.get(kind, f'curve points of several kinds ({kind})')}")
        if (m.get("epochs") or 0) > 1 or (m.get("max_worker_epochs") or 0) > 1:
            lines.append(
                f"WARNING {name}: {m['epochs']:.2f} epochs, a worker made {m['max_worker_epochs']:.2f} passes over "
                "its shard: some samples were trained on twice"
            )
        matched = [r.get("tokens_per_round_vs_reference") for r in m.get("seed_results", {}).values()]
        matched = [v for v in matched if v is not None]
        if matched:
            batches = sorted({r.get("matched_batch_size") for r in m["seed_results"].values()} - {None})
            lines.append(
                f"{name}: fixed batch {batches} per worker, tokens per round {min(matched):.3f}-{max(matched):.3f} x "
                f"{METHODS[name]['matched_to']}'s (the batch is a whole number)"
            )
        twin = METHODS.get(name, {}).get("equal_batches")
        if m.get(f"wall_per_round_vs_{twin}") is not None:
            cell = plus_minus(m[f"wall_per_round_vs_{twin}"], m.get(f"wall_per_round_vs_{twin}_sd"), digits=3)
            lines.append(
                f"{name} vs {twin} (equal batches, the same slow worker): wall per round {cell} "
                f"({m['wall_per_round']:.2f} s against {results['methods'][twin]['wall_per_round']:.2f} s), "
                f"paired by seed"
            )
        base = METHODS.get(name, {}).get("variant_of")
        if base is not None and m.get(f"ppl_vs_{base}") is not None:
            lines.append(
                f"{name} vs {base}: ppl at equal tokens {ratio_cell(m, base)}, bytes (model) "
                f"{ratio_text(m.get(f'bytes_vs_{base}'))}, bytes (measured) "
                f"{ratio_text(m.get(f'measured_bytes_vs_{base}'))}, wall {ratio_text(m.get(f'wall_vs_{base}'))}"
            )
    for name, target in results.get("targets", {}).items():
        value = "-" if target["value"] is None else f"{target['value']:.3f}"
        verdict_text = {True: "holds", False: "MISSED", None: "n/a"}[target["holds"]]
        low = "" if target.get("low") is None else f"{target['low']} <= "
        lines.append(f"target {low}{name} <= {target['bound']}: {value} ({verdict_text})")
    if results.get("ppl_targets"):
        lines.append("\nTo target (means over seeds; seconds: training time on this machine, evaluations excluded):\n")
        lines.append(to_target_table(results["methods"], results["ppl_targets"]))
    return "\n".join(lines)


# A method's figures that `summary.json` keeps (means, sds and per-seed values), with every ratio and wall per round.
SUMMARY_KEYS = ("seeds", "tokens", "rounds", "wall_seconds", "wall_seconds_seeds", "wall_per_round",
                "wall_per_round_sd", "wall_per_round_seeds", "ppl_at_equal_tokens", "ppl_at_equal_tokens_sd",
                "ppl_at_equal_tokens_seeds", "final_eval_ppl", "final_eval_ppl_seeds", "comm_bytes")  # fmt: skip


def summary(results: dict) -> dict:
    """The compact record of a run (`summary.json`, small enough to keep beside the docs that quote it): per method
    the figures of `SUMMARY_KEYS`, its ratios (`ppl_vs_*`, `wall_per_round_vs_*`, ...) and, per seed, the slowed
    ranks and every round's per-worker batches and seconds per sample (instance id → one list per round); the
    targets, the equal-token point, the seeds and the settings. Everything else stays in `results.json`."""
    methods = {}
    for name, m in results["methods"].items():
        if "error" in m:
            methods[name] = {"error": m["error"]}
            continue
        entry = {key: m.get(key) for key in SUMMARY_KEYS}
        entry.update({k: v for k, v in m.items() if k.startswith(("ppl_vs_", "wall_per_round_vs_", "wall_vs_"))})
        entry["per_seed"] = {
            seed: {
                "slowed_ranks": r.get("slowed_ranks", []),
                "worker_batch_sizes": _per_round(r, "worker_batch_sizes"),
                "worker_sample_seconds": _per_round(r, "worker_sample_seconds"),
            }
            for seed, r in m["seed_results"].items()
            if "error" not in r
        }
        methods[name] = entry
    keep = ("equal_tokens", "targets", "seeds", "settings", "profile", "total_seconds")
    return {"methods": methods, **{key: results.get(key) for key in keep}}


def _per_round(result: dict, key: str) -> dict[str, list]:
    """instance id → [that instance's `key` in each round it trained] from a run's round log."""
    out: dict[str, list] = {}
    for entry in result.get("round_log") or []:
        for instance, value in (entry.get(key) or {}).items():
            out.setdefault(instance, []).append(value)
    return out
