"""The virtual clock against a GPU run: a profile fitted on one `headline` step's runs, then every round of another
step's runs priced by `VirtualClock` (the code `convergence --clock virtual` prices with) and set beside its
measured seconds.

A `headline` launch leaves, per method, its rounds file (per round and instance: the workers, their batches, the
micro-batches, the bytes sent, a merge) and its result (`round_marks_per_rank`: per worker at each round's end the
training seconds, the evaluation seconds so far and the inner-step seconds so far); `--pack` keeps what the replay
reads of a step's launches in one results file, `<step>-launches.json`. From the fitting step's runs:

- the inner step: per worker and round, its inner-step seconds over H against its micro-batches, a least-squares
  line α per pass + β per sample (the profile's `micro_batch_seconds` at 1, 2, 4, ... on that line; the optimizer
  step is inside α: `optimizer_seconds` 0). The 4 workers share one GPU, so these are a shared GPU's seconds;
- the round end's local work (`outer_seconds`) and the link (one bandwidth for the all-reduces and merges: gloo
  copies each tensor to the host and through the loopback; latency 100 µs): a least-squares line of the slowest
  worker's seconds beyond its inner steps (the others wait for it) against the ring model's bits, over the rounds
  without a merge: an instance of one worker (no bits), of 2 workers and of 4 (two shares of the payload). Both
  are fitted: whatever a round spends outside the inner-step timer (the Trainer's loop, the data) lands in the
  round end's seconds.

Then each round (from the second: the first holds the start) of the checked step's runs: every worker's clock
priced with its passes, H times, its instance's outer step and any merge it sent; the round costs the slowest
worker's (`align`); against the slowest worker's measured seconds in the same round, evaluations taken out.
Fitting on one seed and checking on the other is the out-of-sample check; the fitting seed itself is shown too.

    python -m recipes.benchmarks.device_profile.replay --results docs/results/gpu/nvidia-h200-2026-11-27 \\
        --fit headline --check headline headline-seed2 --output docs/results/virtual_clock_gpu.json
"""

import argparse
import json
import os
import statistics

from recipes.benchmarks.gpu_bench import LAUNCHES_SUFFIX
from recipes.benchmarks.toolkit.clock.device_profiles import PRICED
from recipes.benchmarks.toolkit.clock.link_model import DeviceProfile, Link, control_seconds
from recipes.benchmarks.toolkit.clock.virtual_clock import VirtualClock
from recipes.benchmarks.toolkit.figures import pyplot, save_figure
from recipes.benchmarks.toolkit.results import write_json
from recipes.benchmarks.toolkit.traffic import ring_all_reduce_bytes


__all__ = ["fit", "load_launch", "main", "measured_rounds", "pack_launch", "replay"]

LATENCY = 1e-4
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}  # a worker's pseudo-gradient, per parameter
SIZES = (1, 2, 4, 8, 16, 32, 64)


ROW_KEYS = (
    "outer_step",
    "workers",
    "batch_size",
    "worker_batch_sizes",
    "accumulation_steps",
    "comm_bytes",
    "merge_seconds",
)  # what the replay reads of a rounds file's line


# How the fitted profile's quantities were obtained (`toolkit/clock/device_profiles.py`'s `sources`).
FITTED_SOURCES = {
    "micro_batch_seconds": "fitted: α + β b over the steps of the fitting launches (no size measured alone)",
    "outer_seconds": "fitted: a round's seconds beyond its inner steps and its all-reduce",
    "max_micro_batch": "none (not measured)",
}


def pack_launch(folder: str) -> dict:
    """One launch's folder (its rounds file, result and spec) reduced to what the replay reads."""
    with open(os.path.join(folder, "result.json"), encoding="utf-8") as f:
        result = json.load(f)
    with open(os.path.join(folder, "spec.json"), encoding="utf-8") as f:
        spec = json.load(f)
    with open(os.path.join(folder, "adloco_rounds.jsonl"), encoding="utf-8") as f:
        rows = [{key: row.get(key) for key in ROW_KEYS} for row in map(json.loads, f)]
    dtype = spec.get("adloco", {}).get("pseudo_grad_dtype", "float32")
    return {"inner_steps": spec["train"]["inner_steps"], "world": result["world_size"],
            "payload": DTYPE_BYTES[dtype] * result["parameters"],
            "round_marks_per_rank": result["round_marks_per_rank"], "rounds": rows}  # fmt: skip


def load_launch(packed: dict) -> dict:
    """A packed launch as the fit and the replay read it: its rounds grouped by round."""
    rounds: dict[int, list[dict]] = {}
    for row in packed["rounds"]:
        rounds.setdefault(row["outer_step"], []).append(row)
    return {"result": {"round_marks_per_rank": packed["round_marks_per_rank"]}, "inner_steps": packed["inner_steps"],
            "rounds": rounds, "world": packed["world"], "payload": packed["payload"]}  # fmt: skip


def measured_rounds(run: dict) -> dict[int, dict[int, tuple[float, float]]]:
    """{round: {worker: (training seconds, inner-step seconds)}} from the round marks, evaluations taken out; the
    first round is left out (it holds the start)."""
    out: dict[int, dict[int, tuple[float, float]]] = {}
    for worker, marks in enumerate(run["result"]["round_marks_per_rank"]):
        for r, (before, after) in enumerate(zip(marks, marks[1:]), start=2):
            wall = (after[1] - before[1]) - (after[2] - before[2])
            out.setdefault(r, {})[worker] = (wall, after[3] - before[3])
    return out


def _chunks(row: dict, share: int) -> list[int]:
    """A worker's micro-batches in one inner step: its share of the request, as switch mode cut it."""
    steps = max(int(row["accumulation_steps"]), 1)
    return [-(-int(share) // steps)] * steps


def _merge_bytes(row: dict, payload: float) -> float:
    return (
        max(float(row.get("comm_bytes") or 0) - ring_all_reduce_bytes(payload, len(row["workers"])), 0.0)
        if row.get("merge_seconds")
        else 0.0
    )


def fit(runs: list[dict]) -> tuple[DeviceProfile, Link, dict]:
    """The profile and the link that the `runs` (one step's methods) measured (module docstring)."""
    passes, steps_s, local, ring = [], [], [], []
    for run in runs:
        payload = run["payload"]
        for r, workers in measured_rounds(run).items():
            for row in run["rounds"].get(r, []):
                shares = row.get("worker_batch_sizes") or [row["batch_size"]] * len(row["workers"])
                for worker, share in zip(row["workers"], shares):
                    if worker not in workers:
                        continue
                    wall, inner = workers[worker]
                    chunks = _chunks(row, share)
                    passes.append((len(chunks), sum(chunks)))
                    steps_s.append(inner / run["inner_steps"])
            # The round end's own seconds: the slowest worker's (the others' include their wait for it), in
            # rounds without a merge (a transfer's seconds are the merge's).
            slowest = max(workers, key=lambda w: workers[w][1])
            row = next((row for row in run["rounds"].get(r, []) if slowest in row["workers"]), None)
            if row is None or any(row.get("merge_seconds") for row in run["rounds"].get(r, [])):
                continue
            wall, inner = workers[slowest]
            m = len(row["workers"])
            beyond = wall - inner - control_seconds(run["world"], Link(1.0, LATENCY))  # the clock prices those
            (local if m == 1 else ring).append((2 * (m - 1) / m * payload * 8.0, beyond, 2 * (m - 1)))
    # s = n α + β Σb: least squares in (α, β).
    saa = sum(n * n for n, _ in passes)
    sab = sum(n * b for n, b in passes)
    sbb = sum(b * b for _, b in passes)
    say = sum(n * y for (n, _), y in zip(passes, steps_s))
    sby = sum(b * y for (_, b), y in zip(passes, steps_s))
    det = saa * sbb - sab * sab
    alpha, beta = (say * sbb - sby * sab) / det, (saa * sby - sab * say) / det
    # beyond − hops × latency = outer + bits / bandwidth: least squares in (outer, 1 / bandwidth) over the rounds
    # of one-worker instances (no bits) and of all-reduces among 2 and 4 workers (two payload shares).
    points = [(bits, beyond - hops * LATENCY) for bits, beyond, hops in local + ring]
    n, sx, sy = len(points), sum(x for x, _ in points), sum(y for _, y in points)
    sxx, sxy = sum(x * x for x, _ in points), sum(x * y for x, y in points)
    inverse = (n * sxy - sx * sy) / (n * sxx - sx * sx)
    outer = (sy - inverse * sx) / n
    profile = DeviceProfile(micro_batch_seconds={b: alpha + beta * b for b in SIZES}, outer_seconds=outer)
    link = Link(1.0 / inverse, LATENCY)
    fitted = {"alpha_seconds": alpha, "beta_seconds_per_sample": beta, "outer_seconds": outer,
              "link_bits_per_second": link.bandwidth_bits_per_second, "samples": {"steps": len(passes),
              "local_rounds": len(local), "all_reduces": len(ring)}}  # fmt: skip
    return profile, link, fitted


def replay(run: dict, profile: DeviceProfile, link: Link) -> list[dict]:
    """Every measured round of `run` priced by a `VirtualClock` per worker, against its measured seconds."""
    payload = run["payload"]
    out = []
    for r, workers in sorted(measured_rounds(run).items()):
        clocks = {w: VirtualClock(profile, [link], world=run["world"], statistics=False) for w in workers}
        for row in run["rounds"].get(r, []):
            shares = row.get("worker_batch_sizes") or [row["batch_size"]] * len(row["workers"])
            sent = _merge_bytes(row, payload)
            for worker, share in zip(row["workers"], shares):
                clock = clocks.get(worker)
                if clock is None:
                    continue
                for _ in range(run["inner_steps"]):
                    clock.passes(tuple(_chunks(row, share)))
                    clock.step_rest()
                clock.outer_step(round_number=r, workers=len(row["workers"]), payload_bytes=int(payload))
                if sent:
                    clock.merge(round_number=r, sent_bytes=(int(sent),))
        if not clocks:
            continue
        virtual = max(c.now() for c in clocks.values())
        measured = max(wall for wall, _ in workers.values())
        merges = sum(1 for row in run["rounds"].get(r, []) if row.get("merge_seconds"))
        out.append({"round": r, "measured": measured, "virtual": virtual, "merges": merges})
    return out


def summary(rounds: list[dict]) -> dict:
    measured = sum(r["measured"] for r in rounds)
    virtual = sum(r["virtual"] for r in rounds)
    errors = [r["virtual"] / r["measured"] - 1 for r in rounds if r["measured"] > 0]
    return {"rounds": len(rounds), "measured_seconds": measured, "virtual_seconds": virtual,
            "error": virtual / measured - 1, "round_error_median": statistics.median(errors),
            "round_error_abs_max": max(abs(e) for e in errors)}  # fmt: skip


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--pack",
        default=None,
        help="A gpu_bench step's launches folder (runs/<folder>/<step>): "
        "write what the replay reads of its methods to --output (<step>-launches.json), nothing else.",
    )
    parser.add_argument("--results", help="A gpu_bench results folder with <step>-launches.json files.")
    parser.add_argument("--fit", help="The step whose runs give the profile and the link.")
    parser.add_argument("--check", nargs="+", help="The steps whose rounds are priced.")
    parser.add_argument("--output", required=True, help="The JSON to write (a PNG beside it).")
    parser.add_argument("--profile_output", default=None, help="Also write the fitted profile as a profile file.")
    args = parser.parse_args(argv)
    if args.pack is None and not (args.results and args.fit and args.check):
        parser.error("--results, --fit and --check (or --pack)")
    return args


def _methods(results: str, step: str) -> dict[str, dict]:
    path = os.path.join(results, f"{step}{LAUNCHES_SUFFIX}.json")
    if not os.path.exists(path):
        raise SystemExit(f"{path}: no launches of step {step!r} (`--pack` writes it from gpu_bench's runs folder)")
    with open(path, encoding="utf-8") as f:
        return {method: load_launch(packed) for method, packed in sorted(json.load(f).items())}


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    if args.pack is not None:
        packed = {m: pack_launch(os.path.join(args.pack, m, sorted(os.listdir(os.path.join(args.pack, m)))[0]))
                  for m in sorted(os.listdir(args.pack))}  # fmt: skip
        write_json(args.output, packed)
        return packed
    fitting = _methods(args.results, args.fit)
    profile, link, fitted = fit(list(fitting.values()))
    checks = {}
    for step in args.check:
        checks[step] = {}
        for method, run in _methods(args.results, step).items():
            rounds = replay(run, profile, link)
            checks[step][method] = {**summary(rounds), "per_round": rounds}
    out = {"results": args.results, "fit": args.fit, "fitted": fitted, "profile": profile.to_json(),
           "link": {"bits_per_second": link.bandwidth_bits_per_second, "latency_seconds": link.latency_seconds},
           "checks": checks, "note": "virtual: priced by toolkit/clock/virtual_clock.py (simulated); measured: the "
           "launches' round marks, evaluations taken out"}  # fmt: skip
    write_json(args.output, out)
    print(f"fitted on {args.fit}: α {fitted['alpha_seconds'] * 1e3:.2f} ms a pass, β "
          f"{fitted['beta_seconds_per_sample'] * 1e3:.3f} ms a sample, round end {fitted['outer_seconds'] * 1e3:.1f} "
          f"ms, link {link.bandwidth_bits_per_second / 1e9:.2f} Gbit/s")  # fmt: skip
    print("| step | method | rounds | measured s/round | virtual s/round | error | per-round error, median | worst |")
    print("|---|---|---|---|---|---|---|---|")
    for step, methods in checks.items():
        for method, s in methods.items():
            print(f"| {step} | {method} | {s['rounds']} | {s['measured_seconds'] / s['rounds']:.3f} | "
                  f"{s['virtual_seconds'] / s['rounds']:.3f} | {s['error']:+.1%} | {s['round_error_median']:+.1%} | "
                  f"{s['round_error_abs_max']:.1%} |")  # fmt: skip
    _plot(checks, os.path.splitext(args.output)[0] + ".png")
    if args.profile_output:
        write_json(
            args.profile_output,
            {
                **profile.to_json(),
                "fitted": fitted,
                "measured_sizes": [],
                "sources": {key: FITTED_SOURCES.get(key, "not measured (0)") for key in PRICED},
                "source": f"{args.results}: "
                f"gpu_bench {args.fit}'s launches; made by `python -m recipes.benchmarks.device_profile.replay`",
            },
        )
    return out


def _plot(checks: dict, path: str) -> None:
    plt = pyplot()
    fig, axes = plt.subplots(1, len(checks), figsize=(5.5 * len(checks), 4), squeeze=False)
    for ax, (step, methods) in zip(axes[0], checks.items()):
        for method, s in methods.items():
            rounds = s["per_round"]
            line = ax.plot([r["round"] for r in rounds], [r["measured"] for r in rounds], label=f"{method} measured")
            ax.plot([r["round"] for r in rounds], [r["virtual"] for r in rounds], "--", color=line[0].get_color(),
                    label=f"{method} virtual")  # fmt: skip
        ax.set(title=f"{step}: seconds a round", xlabel="round", ylabel="seconds (virtual: simulated)")
        ax.legend(fontsize=7)
    save_figure(fig, path, dpi=110)


if __name__ == "__main__":
    main()
