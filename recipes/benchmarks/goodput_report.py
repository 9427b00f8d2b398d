"""Issue 25's targets from the results of `links` and `convergence`: does the goodput rule pay for itself?

Every ratio is computed inside one run of a benchmark (its methods side by side), per seed, then summarised as the
mean ± the sample standard deviation over seeds (one `links` run per seed: `--set seed=43`).

- Wall time, per bandwidth of `links` (and for `convergence`'s 4 workers on one machine, no link limit): the best
  fixed batch (`diloco_b4`, `diloco_b8`, `diloco_b16`: the lowest final perplexity) sets the target perplexity, its
  final one, and the time it took (`wall_seconds`, evaluations excluded); `adloco_goodput`'s time to reach that
  perplexity (its eval curve over training seconds, log-perplexity interpolated between evaluations; never: it did
  not reach it) over that time. Targets: ≤ 0.8 at 10 Mbit/s, ≤ 1.0 at 100 Mbit/s, ≤ 1.05 without a link limit.
- Perplexity at equal tokens (`convergence`): `adloco_goodput` / `diloco_b4`, both curves interpolated at the
  smaller final token count of the two. Target ≤ 1.05.
- Merges over the 100 Mbit/s links: each merge's `merge_seconds` (the rounds file: the slowest worker's merge,
  redistribution included) over the time one bf16 copy of the model takes on the link (2 bytes × parameters × 8 /
  rate). Target ≤ 3.

    python -m recipes.benchmarks.goodput_report \\
        --links outputs/benchmarks/links-goodput-42/results.json outputs/benchmarks/links-goodput-43/results.json \\
        --convergence outputs/benchmarks/convergence-goodput/results.json --output_dir outputs/benchmarks/goodput

Outputs: `results.json`, `table.md` and `goodput.png` (each seed's ratios against the targets) in `--output_dir`.
"""

import argparse
import json
import math
import os
import statistics

from recipes.benchmarks._common import interpolate_curve, ratio, table, write_json


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


def _link_curve(run: dict) -> list[tuple[float, float]]:
    return [(s, p) for s, _, p in run["curve"]]


def links_figures(results: dict, method: str = GOODPUT) -> dict:
    out = {}
    for bandwidth, runs in results["bandwidths"].items():
        label = "no limit" if bandwidth in UNLIMITED else bandwidth
        entry = {"wall": wall_ratio(runs, _link_curve, method)}
        if method in runs and "timings" in runs[method]:
            numel = _parameters(runs[method])
            entry["merge_model_times"] = merge_times(runs[method], numel) if numel else []
        out[label] = entry
    return out


def _parameters(run: dict) -> int | None:
    path = os.path.join(run["folder"], "result.json")
    if os.path.exists(path):
        with open(path, encoding="utf-8") as f:
            return json.load(f).get("parameters")
    return None


def _eval_points(run: dict) -> list[tuple[float, float]]:
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
        row["wall"] = wall_ratio(runs, lambda run, first=initial: [(0.0, first)] + _eval_points(run), method)
        if method in runs and "diloco_b4" in runs:
            a, b = runs[method]["curve"], runs["diloco_b4"]["curve"]
            tokens = min(a[-1][0], b[-1][0])
            row["tokens"] = tokens
            row["ppl_vs_b4"] = interpolate_curve(a, tokens) / interpolate_curve(b, tokens)
        out.append(row)
    return out


def replay_figures(results: dict, profile, bandwidths: list[float], method: str = GOODPUT) -> list[dict]:
    """Without a links run: `convergence`'s runs replayed by the wall-clock model (`wallclock`: the rounds file's
    batches, merges and all-reduces over a link of `bandwidth` bits/s, latency 0.1 ms, efficiency 0.95, compute from
    `profile`), per bandwidth and seed: the goodput method's modelled time to the best fixed batch's final perplexity
    over that batch's modelled wall time. The replay keeps the batches the goodput rule chose on the machine the runs
    measured (it does not choose again for the modelled link) and charges merges as float32 point-to-point transfers
    (more than compact merges send): both make the goodput method's modelled time an upper bound."""
    from recipes.benchmarks.wallclock.link_model import Link
    from recipes.benchmarks.wallclock.replay import seconds_at_tokens, tokens_to_target
    from recipes.benchmarks.wallclock.runs import replay_folder

    root, out = results["folder"], []
    for bandwidth in bandwidths:
        link = Link(bandwidth, 1e-4, 0.95)
        for seed in results["seeds"]:
            finals = {}
            for name in (*FIXED, method):
                seed_results = results["methods"].get(name, {}).get("seed_results", {})
                run = seed_results.get(str(seed), seed_results.get(seed))
                if run and "final_eval_ppl" in run:
                    finals[name] = run["final_eval_ppl"]
            fixed = [name for name in FIXED if name in finals]
            if method not in finals or not fixed:
                continue
            best = min(fixed, key=finals.get)
            walls = {
                name: replay_folder(os.path.join(root, name, f"seed-{seed}"), profile, link)
                for name in (*fixed, method)
            }
            tokens = tokens_to_target(walls[method]["curve"], finals[best])
            reached = None if tokens is None else seconds_at_tokens(walls[method], tokens)
            best_wall = walls[best]["total"]["wall_seconds"]
            out.append(
                {
                    "bandwidth_bits_per_second": bandwidth,
                    "seed": seed,
                    "best_fixed": best,
                    "target_ppl": finals[best],
                    "modelled_wall_seconds": {name: r["total"]["wall_seconds"] for name, r in walls.items()},
                    "modelled_comm_seconds": {name: r["total"]["comm_seconds"] for name, r in walls.items()},
                    "goodput_seconds_to_target": reached,
                    "ratio": None if reached is None else reached / best_wall,
                }
            )
    return out


def mean_sd(values: list[float | None]) -> str:
    known = [v for v in values if v is not None]
    if not known:
        return "never"
    text = f"{statistics.mean(known):.3f}" + (f" ± {statistics.stdev(known):.3f}" if len(known) > 1 else "")
    return text + (f" ({len(values) - len(known)} never)" if len(known) < len(values) else "")


def verdict(values: list[float | None], bound: float) -> str:
    if not values or any(v is None for v in values):
        return "MISSED"
    return "holds" if statistics.mean(values) <= bound else "MISSED"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--links", nargs="*", default=[], help="links results.json, one per seed")
    parser.add_argument("--convergence", default=None, help="convergence results.json")
    parser.add_argument("--output_dir", default="outputs/benchmarks/goodput")
    parser.add_argument(
        "--replay_bandwidths",
        type=float,
        nargs="*",
        default=[],
        help="bits/s: replay --convergence's runs over these links with the wall-clock model (no links run)",
    )
    parser.add_argument(
        "--step_seconds", help="--replay_bandwidths: forward/backward seconds per micro-batch: '4=0.06'"
    )
    parser.add_argument("--optimizer_seconds", type=float, default=0.0, help="--replay_bandwidths: per inner step")
    parser.add_argument("--outer_seconds", type=float, default=0.0, help="--replay_bandwidths: per round")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    links_results = []
    for path in args.links:
        with open(path, encoding="utf-8") as f:
            links_results.append((path, json.load(f)))
    convergence_results = None
    if args.convergence:
        with open(args.convergence, encoding="utf-8") as f:
            convergence_results = json.load(f)
        convergence_results["folder"] = os.path.dirname(os.path.abspath(args.convergence))
    out, sections = {}, []
    for method in VARIANTS:
        ran = any(method in runs for _, r in links_results for runs in r["bandwidths"].values())
        ran = ran or (convergence_results is not None and method in convergence_results["methods"])
        if not ran:
            continue
        figures = method_figures(method, links_results, convergence_results)
        if args.replay_bandwidths and convergence_results is not None:
            figures["replay"] = replay_figures(convergence_results, _profile(args), args.replay_bandwidths, method)
            figures["report"] += "\n\n" + replay_report(figures["replay"])
        out[method] = figures
        sections.append(f"### {method}\n\n" + figures["report"])
    if GOODPUT in out and NORM in out:
        out[GOODPUT]["vs_norm_test"] = paired_vs_norm(out[GOODPUT]["rows"], out[NORM]["rows"])
        sections.append(
            f"### {GOODPUT} / {NORM}, final ppl paired by seed\n\n" + paired_report(out[GOODPUT]["vs_norm_test"])
        )
    report = "\n\n".join(sections) if sections else "(no goodput run)"
    os.makedirs(args.output_dir, exist_ok=True)
    write_json(os.path.join(args.output_dir, "results.json"), out)
    if out:
        print(f"wrote {plot(out, os.path.join(args.output_dir, 'goodput.png'))}")
    with open(os.path.join(args.output_dir, "table.md"), "w", encoding="utf-8") as f:
        f.write(report + "\n")
    print(report)
    return out


def paired_vs_norm(goodput_rows: list[dict], norm_rows: list[dict]) -> dict:
    """Per setting (bandwidth, or one machine): the goodput method's final perplexity over the norm test's, paired by
    seed (the same seconds for both when the runs had --budget_seconds): what the rule itself changes."""
    norm = {(r["bandwidth"], r["seed"]): r.get("final ppl") for r in norm_rows}
    out: dict[str, dict] = {}
    for row in goodput_rows:
        value = ratio(row.get("final ppl"), norm.get((row["bandwidth"], row["seed"])))
        if value is not None:
            out.setdefault(row["bandwidth"], {"seeds": [], "ratios": []})
            out[row["bandwidth"]]["seeds"].append(row["seed"])
            out[row["bandwidth"]]["ratios"].append(value)
    for entry in out.values():
        entry["mean_sd"] = mean_sd(entry["ratios"])
    return out


def paired_report(paired: dict) -> str:
    rows = [
        {"setting": setting, "per seed": ", ".join(f"{v:.3f}" for v in e["ratios"]), "mean ± sd": e["mean_sd"]}
        for setting, e in paired.items()
    ]
    return table(rows, ["setting", "per seed", "mean ± sd"]) if rows else "(no paired runs)"


def plot(out: dict, path: str) -> str:
    """Per method and setting (bandwidth, or one machine), each seed's time to the best fixed batch's final
    perplexity over that batch's time (left; a hollow marker at the top: never reached) and its final perplexity over
    the best fixed batch's (right; equal seconds when every method had the same --budget_seconds), with the targets."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    settings = sorted({row["bandwidth"] for figures in out.values() for row in figures["rows"]})
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    width = 0.8 / max(1, len(out))
    for k, (method, figures) in enumerate(out.items()):
        for column, ax in (("ratio", axes[0]), ("final / best fixed", axes[1])):
            xs, ys, never = [], [], []
            for row in figures["rows"]:
                x = settings.index(row["bandwidth"]) + (k - (len(out) - 1) / 2) * width
                if row.get(column) is None:
                    never.append(x)
                else:
                    xs.append(x)
                    ys.append(row[column])
            color = f"C{k}"
            ax.scatter(xs, ys, color=color, label=method)
            if never:
                top = max([1.6] + ys)
                ax.scatter(never, [top] * len(never), facecolors="none", edgecolors=color)
    for i, setting in enumerate(settings):
        bound = WALL_TARGETS.get("no limit" if setting.startswith("no limit") else setting)
        if bound is not None:
            axes[0].hlines(bound, i - 0.45, i + 0.45, colors="grey", linestyles="dashed")
    axes[0].set_title("time to the best fixed batch's final ppl / its time\n(dashed: target; hollow at top: never)")
    axes[1].set_title("final ppl / the best fixed batch's final ppl")
    for ax in axes:
        ax.axhline(1.0, color="black", linewidth=0.5)
        ax.set_xticks(range(len(settings)), settings)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def _profile(args: argparse.Namespace):
    from recipes.benchmarks.wallclock.link_model import DeviceProfile

    if not args.step_seconds:
        raise SystemExit("--replay_bandwidths needs --step_seconds")
    points = {int(b): float(t) for b, _, t in (item.partition("=") for item in args.step_seconds.split(","))}
    return DeviceProfile(points, args.optimizer_seconds, outer_seconds=args.outer_seconds, source="command line")


def replay_report(rows: list[dict]) -> str:
    """The replayed ratios per link (mean ± sd over seeds) and each seed's modelled times."""
    shown = [
        {
            "link Mbit/s": r["bandwidth_bits_per_second"] / 1e6,
            "seed": r["seed"],
            "best fixed": r["best_fixed"],
            "its final ppl": r["target_ppl"],
            **{f"{n} s": round(t, 1) for n, t in r["modelled_wall_seconds"].items()},
            "goodput s to it": r["goodput_seconds_to_target"],
            "ratio": r["ratio"],
        }
        for r in rows
    ]
    summary = [
        {
            "link Mbit/s": bandwidth / 1e6,
            "ratio (mean ± sd over seeds)": mean_sd(
                [r["ratio"] for r in rows if r["bandwidth_bits_per_second"] == bandwidth]
            ),
        }
        for bandwidth in sorted({r["bandwidth_bits_per_second"] for r in rows})
    ]
    if not shown:
        return "(nothing replayed)"
    columns = sorted({k for row in shown for k in row}, key=lambda k: list(shown[0]).index(k) if k in shown[0] else 99)
    return "Replayed (wall-clock model):\n\n" + table(shown, columns) + "\n\n" + table(summary, list(summary[0]))


def method_figures(method: str, links_results: list, convergence_results: dict | None) -> dict:
    """One goodput method's rows (per seed and bandwidth) and targets."""
    links = [
        {"path": path, "seed": results["settings"]["seed"], "figures": links_figures(results, method)}
        for path, results in links_results
    ]
    convergence = None
    if convergence_results is not None:
        root = convergence_results.get("folder")
        convergence = {"seeds": convergence_figures(convergence_results, method, root)}
    rows, targets = [], []
    for run in links:
        for bandwidth, entry in run["figures"].items():
            rows.append(_row("links", run["seed"], bandwidth, entry["wall"], entry.get("merge_model_times") or []))
    for seed in (convergence or {}).get("seeds", []):
        merges = seed.get("merge_model_times") or []
        rows.append(_row("convergence", seed["seed"], "no limit (one machine)", seed.get("wall"), merges))
    for bandwidth, bound in WALL_TARGETS.items():
        values = [
            r["figures"][bandwidth]["wall"]["ratio"] for r in links if (r["figures"].get(bandwidth) or {}).get("wall")
        ]
        if bandwidth == "no limit" and convergence:
            values += [s["wall"]["ratio"] for s in convergence["seeds"] if s.get("wall")]
        if values:
            targets.append(
                {"target": f"wall {bandwidth} <= {bound}", "value": mean_sd(values), "verdict": verdict(values, bound)}
            )
    if convergence:
        values = [s.get("ppl_vs_b4") for s in convergence["seeds"]]
        targets.append(
            {
                "target": f"ppl / diloco_b4 at equal tokens <= {PPL_TARGET}",
                "value": mean_sd(values),
                "verdict": verdict(values, PPL_TARGET),
            }
        )
    merges = [m for r in links for m in (r["figures"].get("100mbit") or {}).get("merge_model_times", [])]
    where = "at 100 Mbit/s (links, measured seconds)"
    if not merges and convergence:  # no links run: the bytes each merge put on its busiest link
        merges = [m for s in convergence["seeds"] for m in s.get("merge_model_times", [])]
        where = "(convergence: bytes on the busiest link)"
    if merges:
        targets.append(
            {
                "target": f"every merge {where} <= {MERGE_TARGET} model-times",
                "value": f"max {max(merges):.2f} of {len(merges)} ({', '.join(f'{m:.2f}' for m in merges)})",
                "verdict": "holds" if max(merges) <= MERGE_TARGET else "MISSED",
            }
        )
    report = table(rows, list(rows[0])) if rows else "(no runs)"
    if targets:
        report += "\n\n" + table(targets, ["target", "value", "verdict"])
    return {"links": links, "convergence": convergence, "rows": rows, "targets": targets, "report": report}


def _row(benchmark: str, seed, bandwidth: str, wall: dict | None, merges: list[float]) -> dict:
    wall = wall or {}
    return {
        "benchmark": benchmark,
        "seed": seed,
        "bandwidth": bandwidth,
        "best fixed": wall.get("best_fixed"),
        "its final ppl": wall.get("target_ppl"),
        "its wall s": wall.get("best_wall_seconds"),
        "s to it": wall.get("goodput_seconds_to_target"),
        "ratio": wall.get("ratio"),
        "final ppl": wall.get("goodput_final_ppl"),
        "wall s": wall.get("goodput_wall_seconds"),
        # With the same seconds for every method (--budget_seconds), its final ppl over the best fixed batch's.
        "final / best fixed": ratio(wall.get("goodput_final_ppl"), wall.get("target_ppl")),
        "merges (model-times)": ", ".join(f"{m:.2f}" for m in merges) or "-",
    }


if __name__ == "__main__":
    main()
