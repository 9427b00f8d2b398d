"""A wall-clock model: how long a run takes on a given device and link, and how long to a target perplexity.

The command line of the `recipes.benchmarks.wallclock` package (its docstring describes the model). From the
repository root:

    # the device profile: 4 processes on the cores, as 4 workers; the Trainer's step at batch 4 for its overhead
    python -m recipes.benchmarks.overhead --step_profile 1 2 3 4 5 6 7 8 10 12 16 --step_profile_processes 4 \\
        --step_profile_trainer_batch 4 --step_profile_only --output_dir outputs/benchmarks/wallclock/profile_4proc
    # one run (convergence's NAME/seed-S/ folders: --seed S, default the first seed), replayed over 100 Mbit/s
    # links, with the time to two perplexities
    python -m recipes.benchmarks.wallclock --run outputs/benchmarks/convergence/adloco --seed 42 \\
        --profile outputs/benchmarks/wallclock/profile_4proc/results.json --bandwidth 1e8 --targets 700 600
    # against links' measurements, with the profile alone, then calibrated on the highest bandwidth
    python -m recipes.benchmarks.wallclock --validate outputs/benchmarks/links/results.json --efficiency 0.95 \\
        --profile outputs/benchmarks/wallclock/profile_4proc/results.json
    python -m recipes.benchmarks.wallclock --validate outputs/benchmarks/links/results.json --efficiency 0.95 \\
        --profile outputs/benchmarks/wallclock/profile_4proc/results.json --calibrate highest
    python -m recipes.benchmarks.wallclock --scenario 1b-h100 --convergence outputs/benchmarks/convergence/results.json

Outputs in `--output_dir` (default `outputs/benchmarks/wallclock`): `replay.json` (per round and total),
`validation.json` and `validation.md`, `scenario/results.json`, `scenario/table.md` and `scenario/time_to_target.png`.
"""

import argparse
import os
from dataclasses import replace

from adloco_hf.inspection import load_rounds
from recipes.benchmarks.toolkit.link_model import DeviceProfile, Link, mbit
from recipes.benchmarks.toolkit.paths import REPO
from recipes.benchmarks.toolkit.results import human_bytes, read_json, table, write_json
from recipes.benchmarks.wallclock.goodput import GoodputAssumptions
from recipes.benchmarks.wallclock.replay import time_to_targets
from recipes.benchmarks.wallclock.runs import replay_folder, resolve_run_folder, rounds_folder, seed_of
from recipes.benchmarks.wallclock.scenario import (
    Scenario,
    format_scenario,
    measured_ratios,
    plot_scenario,
    scenario_assumptions,
    scenario_results,
)
from recipes.benchmarks.wallclock.validate import format_validation, validate


def profile_from_args(args: argparse.Namespace) -> DeviceProfile | None:
    if args.profile:
        profile = DeviceProfile.from_json(read_json(args.profile), source=args.profile)
    elif args.step_seconds:
        points = {}
        for item in args.step_seconds.split(","):
            b, _, s = item.partition("=")
            points[int(b)] = float(s)
        profile = DeviceProfile(points, args.optimizer_seconds or 0.0, source="command line")
    else:
        return None
    changes = {
        k: getattr(args, k)
        for k in ("optimizer_seconds", "step_overhead_seconds", "outer_seconds", "startup_seconds")
        if getattr(args, k) is not None
    }
    return replace(profile, **changes) if changes else profile


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m recipes.benchmarks.wallclock", description=__doc__.split("\n\n")[0]
    )
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument(
        "--run",
        help="A method's output folder: a run folder (adloco_rounds.jsonl, spec.json, result.json) or convergence's "
        "NAME/ with one seed-S/ run folder per seed.",
    )
    mode.add_argument("--validate", metavar="LINKS_RESULTS", help="links' results.json.")
    mode.add_argument("--scenario", choices=["1b-h100"])
    parser.add_argument(
        "--seed", type=int, default=None, help="--run: replay NAME/seed-SEED (default: the first seed folder, sorted)."
    )
    parser.add_argument("--output_dir", default="outputs/benchmarks/wallclock")
    parser.add_argument("--profile", help="overhead's results.json (its step_profile) or a profile JSON.")
    parser.add_argument("--step_seconds", help="Forward/backward seconds per micro-batch size: '4=0.05,8=0.09'.")
    parser.add_argument("--optimizer_seconds", type=float, default=None)
    parser.add_argument("--step_overhead_seconds", type=float, default=None, help="Other per-step work.")
    parser.add_argument("--outer_seconds", type=float, default=None, help="An outer step's local work.")
    parser.add_argument("--startup_seconds", type=float, default=None)
    parser.add_argument("--bandwidth", type=float, default=1e9, help="Bits per second per worker link.")
    parser.add_argument("--latency", type=float, default=1e-4, help="Seconds per message.")
    parser.add_argument(
        "--efficiency", type=float, default=1.0, help="Payload share of the wire rate (TCP over Ethernet: 0.956)."
    )
    parser.add_argument("--ddp_overlap", type=float, default=0.0, help="Share of forward/backward hiding DDP's comm.")
    parser.add_argument(
        "--device_max_micro_batch",
        type=int,
        default=None,
        help="--run: the largest micro-batch of the modelled device (default: the run's own switch-mode plan).",
    )
    parser.add_argument("--targets", type=float, nargs="*", default=[], help="Perplexities to time (--run).")
    parser.add_argument("--curve", help="A JSON file with a [[tokens, ppl], ...] curve (default: result.json's).")
    parser.add_argument("--parameters", type=int, default=None, help="Trainable parameters (if not in the run).")
    parser.add_argument("--world_size", type=int, default=None)
    parser.add_argument("--calibrate", choices=["none", "highest"], default="none", help="--validate only.")
    parser.add_argument(
        "--convergence",
        default="outputs/benchmarks/convergence/results.json",
        help="--scenario: convergence's results, for the tokens-to-target ratios and AdLoCo's trajectory.",
    )
    parser.add_argument("--ratios", help="--scenario: 'diloco=1.2,adloco=1.4' instead of the measured ratios.")
    parser.add_argument("--target_ppl", type=float, default=None, help="--scenario: target of the ratios.")
    parser.add_argument("--ddp_grad_bytes", type=int, default=4, help="--scenario: bytes per gradient element.")
    scenario_flags = (
        ("mfu", 0.4),
        ("workers", 8),
        ("inner_steps", 500),
        ("scenario_latency", 1e-4),
        ("micro_batch", 16),
    )
    for name, default in scenario_flags:
        parser.add_argument(f"--{name}", type=type(default), default=default, help="--scenario.")
    parser.add_argument(
        "--goodput_noise_tokens",
        type=float,
        nargs=2,
        default=[0.25e6, 2.0e6],
        metavar=("START", "END"),
        help="--scenario: the goodput rule's noise scale in tokens, linear over the run (an assumption).",
    )
    parser.add_argument("--goodput_cap", type=int, default=128, help="--scenario: the goodput rule's largest request.")
    parser.add_argument("--no_goodput", action="store_true", help="--scenario: leave the goodput rule out.")
    return parser.parse_args(argv)


def main_run(args: argparse.Namespace, profile: DeviceProfile) -> dict:
    folder = resolve_run_folder(args.run, args.seed)
    if folder is None:
        which = f"seed-{args.seed}/ " if args.seed is not None else "no seed-*/ folder and "
        raise SystemExit(f"{args.run}: {which}holds no run (adloco_rounds.jsonl, spec.json or result.json)")
    seed = seed_of(folder)
    print(f"replaying {folder}" + (f" (seed {seed})" if seed is not None else ""))
    link = Link(args.bandwidth, args.latency, args.efficiency)
    overrides = {"numel": args.parameters, "world_size": args.world_size}
    replay = replay_folder(
        folder,
        profile,
        link,
        ddp_overlap=args.ddp_overlap,
        device_max_micro_batch=args.device_max_micro_batch,
        **overrides,
    )
    curve = replay.pop("curve")
    if args.curve:
        loaded = read_json(args.curve)
        curve = loaded.get("curve") if isinstance(loaded, dict) else loaded
    replay["targets"] = time_to_targets(replay, curve, args.targets)
    replay.update(link=link.__dict__, profile=profile.to_json(), run=folder, seed=seed)
    columns = ["global_step", "instances", "total_tokens", "compute_seconds", "comm_seconds", "wall_seconds"]
    print(table(replay["rounds"], ["outer_step", *columns, "cumulative_wall_seconds"]))
    total = replay["total"]
    print(
        f"\ntotal: compute {total['compute_seconds']:.2f} s, communication {total['comm_seconds']:.2f} s "
        f"(start broadcast {total['start_broadcast_seconds']:.2f} s, final merge {total['final_merge_seconds']:.2f} s), "
        f"wall {total['wall_seconds']:.2f} s over {mbit(link.bandwidth_bits_per_second)}, "
        f"{human_bytes(total['modelled_bytes'])} modelled"
    )
    for t in replay["targets"]:
        seconds = "not reached" if t["seconds"] is None else f"{t['seconds']:.2f} s ({t['tokens']:,.0f} tokens)"
        print(f"time to perplexity {t['target_ppl']:g}: {seconds}")
    write_json(os.path.join(args.output_dir, "replay.json"), replay)
    return replay


def main_validate(args: argparse.Namespace, profile: DeviceProfile) -> dict:
    links = read_json(args.validate)
    if links is None:
        raise SystemExit(f"{args.validate} not found")
    options = {name: getattr(args, name) for name in ("latency", "efficiency", "calibrate", "ddp_overlap")}
    rows = validate(links, profile, base_dir=REPO, **options)
    report = format_validation(rows)
    print(report)
    name = "validation" if args.calibrate == "none" else f"validation_calibrated_{args.calibrate}"
    results = {
        "rows": rows,
        "profile": profile.to_json(),
        "latency_seconds": args.latency,
        "efficiency": args.efficiency,
        "calibrate": args.calibrate,
        "ddp_overlap": args.ddp_overlap,
        "links_results": args.validate,
    }
    write_json(os.path.join(args.output_dir, f"{name}.json"), results)
    with open(os.path.join(args.output_dir, f"{name}.md"), "w", encoding="utf-8") as f:
        f.write(report + "\n")
    return results


def main_scenario(args: argparse.Namespace) -> dict:
    scenario = Scenario(
        mfu=args.mfu,
        workers=args.workers,
        inner_steps=args.inner_steps,
        latency_seconds=args.scenario_latency,
        micro_batch=args.micro_batch,
        ddp_grad_bytes=args.ddp_grad_bytes,
        ddp_overlap=args.ddp_overlap,
    )
    convergence = read_json(args.convergence)
    adloco_lines = None
    if args.ratios:
        given = {k: float(v) for k, v in (item.split("=") for item in args.ratios.split(","))}
        ratio_info = {"ratios": {"ddp": 1.0, **given}, "target_ppl": float("nan"), "source": "given"}
    else:
        if convergence is None:
            raise SystemExit(f"{args.convergence} not found: run convergence first, or give --ratios")
        ratio_info = measured_ratios(convergence, args.target_ppl)
        ratio_info["source"] = f"{args.convergence}, profile {convergence.get('profile')}"
    if convergence is not None and "adloco" in convergence.get("methods", {}):
        folder = rounds_folder(os.path.join(os.path.dirname(os.path.abspath(args.convergence)), "adloco"))
        if folder is not None:
            adloco_lines = load_rounds(folder)
            ratio_info["adloco_trajectory"] = folder
    source_workers = len({w for line in adloco_lines for w in line["workers"]}) if adloco_lines else 1
    if adloco_lines and scenario.workers % source_workers:
        raise SystemExit(f"--workers must be a multiple of the measured run's {source_workers} workers")
    goodput = None
    if not args.no_goodput:
        start, end = args.goodput_noise_tokens
        goodput = GoodputAssumptions(noise_start_tokens=start, noise_end_tokens=end, cap=args.goodput_cap)
    results = scenario_results(scenario, ratio_info["ratios"], adloco_lines, goodput)
    assumptions = scenario_assumptions(scenario, ratio_info, goodput)
    report = format_scenario(results["rows"])
    print("assumptions:\n" + "\n".join(f"- {a}" for a in assumptions) + "\n\n" + report)
    out = os.path.join(args.output_dir, "scenario")
    write_json(
        os.path.join(out, "results.json"),
        {**results, "assumptions": assumptions, "scenario": scenario.__dict__, "ratios": ratio_info},
    )
    with open(os.path.join(out, "table.md"), "w", encoding="utf-8") as f:
        f.write("Assumptions:\n" + "\n".join(f"- {a}" for a in assumptions) + "\n\n" + report + "\n")
    title = (
        f"{scenario.params / 1e9:g}B model, {scenario.workers}× H100 (MFU {scenario.mfu:.0%}), H={scenario.inner_steps}: "
        "time to target"
    )
    print(f"wrote {plot_scenario(results['rows'], os.path.join(out, 'time_to_target.png'), title)}")
    return results


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    os.chdir(REPO)
    if args.scenario:
        return main_scenario(args)
    profile = profile_from_args(args)
    if profile is None:
        raise SystemExit("give a device profile: --profile FILE or --step_seconds '4=0.05,8=0.09'")
    return main_run(args, profile) if args.run else main_validate(args, profile)


if __name__ == "__main__":
    main()
