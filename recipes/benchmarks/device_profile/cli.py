"""`python -m recipes.benchmarks.device_profile`: a device profile file from a GPU throughput result or a CPU step
profile, with its source."""

import argparse
import json
import os
import shlex
import sys

from recipes.benchmarks.toolkit.clock.device_profiles import load_profile, profile_from_throughput
from recipes.benchmarks.toolkit.clock.link_model import DeviceProfile
from recipes.benchmarks.toolkit.results import write_json


__all__ = ["main", "parse_args"]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    given = parser.add_mutually_exclusive_group(required=True)
    given.add_argument("--throughput", help="gpu_bench's throughput result (throughput-300m.json).")
    given.add_argument("--step_profile", help="overhead --step_profile's results.json.")
    parser.add_argument("--pass_seconds", type=float, default=None, help="α: a pass's fixed seconds (estimate).")
    parser.add_argument("--optimizer_seconds", type=float, default=None, help="ω: the optimizer step (estimate).")
    parser.add_argument("--parameters", type=int, default=None, help="The model's parameters (memory bound).")
    parser.add_argument("--memory_fraction", type=float, default=0.9)
    parser.add_argument("--eager", action="store_true", help="The throughput result's eager rows, not compiled.")
    parser.add_argument("--output", required=True, help="The profile file to write.")
    args = parser.parse_args(argv)
    if args.throughput is not None:
        for name in ("pass_seconds", "optimizer_seconds", "parameters"):
            if getattr(args, name) is None:
                parser.error(f"--throughput needs --{name}: the measurement at one batch cannot give it")
    return args


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    command = "python -m recipes.benchmarks.device_profile " + shlex.join(sys.argv[1:] if argv is None else argv)
    if args.throughput is not None:
        with open(args.throughput, encoding="utf-8") as f:
            result = json.load(f)
        device = result["device"]
        source = (
            f"{args.throughput}: gpu_bench {result['step']} on one {device['name']} (torch {device['torch']}, "
            f"transformers {device['transformers']}); made by `{command}`"
        )
        profile = profile_from_throughput(
            result,
            pass_seconds=args.pass_seconds,
            optimizer_seconds=args.optimizer_seconds,
            parameters=args.parameters,
            compiled=not args.eager,
            memory_fraction=args.memory_fraction,
            source=source,
        )
    else:
        with open(args.step_profile, encoding="utf-8") as f:
            measured = json.load(f)
        step = measured.get("step_profile", measured)
        profile = DeviceProfile.from_json(step).to_json()
        profile.update(
            parameters=step.get("parameters"),  # the model measured: the virtual clock prices bytes as its
            source=f"{args.step_profile}: overhead --step_profile ({step.get('processes', '?')} processes on "
            f"{step.get('device', 'cpu')}); made by `{command}`",
            measured={"sizes": sorted(int(b) for b in step["micro_batch_seconds"])},
            measured_sizes=sorted(int(b) for b in step["micro_batch_seconds"]),
            sources={
                "micro_batch_seconds": "measured at every size listed; others interpolated or extrapolated",
                "optimizer_seconds": "measured",
                "step_overhead_seconds": "measured",
                "outer_seconds": "measured",
                "statistics_seconds": "not measured (0)",
                "max_micro_batch": "none (no memory limit measured)",
            },
            interpolated="Sizes between the measured ones piecewise linear, beyond them linear through the two "
            "nearest (link_model.DeviceProfile).",
        )
    write_json(args.output, profile)
    load_profile(args.output)  # what the clock will read back
    print(f"wrote {os.path.abspath(args.output)}: " + json.dumps({k: profile[k] for k in profile if k != "measured"}))
    return profile
