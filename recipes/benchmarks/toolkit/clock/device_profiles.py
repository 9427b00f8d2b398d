"""Device profiles as files: what the virtual clock prices a step with, and where each number came from.

A profile file is a `link_model.DeviceProfile` as JSON (`micro_batch_seconds` {b: seconds of one forward/backward of
b sequences}, `optimizer_seconds`, `outer_seconds`, `statistics_seconds`, `max_micro_batch`) plus its provenance:
`source` (the measurement it was derived from and the command that made it), `measured_sizes` (the micro-batch
sizes whose seconds were measured: every other size is interpolated, extrapolated or fitted), `sources` (for each
priced quantity whether it was measured, fitted or estimated, and how: `PRICED`), and what the measurement read
(`measured`) and how the rest was filled in (`interpolated`). The kept ones live in
`docs/results/device_profiles/` (`python -m recipes.benchmarks.device_profile` writes them).

`profile_from_throughput` derives one from `gpu_bench`'s throughput step (`throughput-300m.json`: the `Trainer`,
AdLoCo without and with gradient statistics, at one batch), the step it measures at one micro-batch size b₀:

- a pass of b samples costs α + β b (`batch/throughput.py`'s model of the goodput rule); the optimizer step ω. The
  measurement gives ω + α + β b₀ (AdLoCo's median step); α and ω are given (estimates: the measurement cannot
  separate them from β), and β is what remains per sample;
- the outer step's local work: AdLoCo's timed window less the `Trainer`'s, per round (the same steps, plus the
  round's end);
- a round that measures gradient statistics: AdLoCo-with-statistics' window less AdLoCo's, per round, less the one
  extra pass α of the statistics step's two halves (the passes price that one);
- the largest micro-batch: the peak memory at b₀, less 24 bytes per parameter (float32 weights, gradients, Adam's
  two moments, φ and the outer momentum), is the activations of b₀ samples; the micro-batch whose activations fill
  `memory_fraction` of the device's memory with that fixed part.
"""

import json
import math


__all__ = ["PRICED", "REQUIRED", "load_profile", "profile_from_throughput"]

REQUIRED = ("micro_batch_seconds", "source", "measured_sizes", "sources")
# What the virtual clock prices from a profile: each has its provenance in the file's `sources`.
PRICED = (
    "micro_batch_seconds",
    "optimizer_seconds",
    "step_overhead_seconds",
    "outer_seconds",
    "statistics_seconds",
    "max_micro_batch",
)
SIZES = (1, 2, 4, 8, 16, 32, 64, 128, 256)


def load_profile(path: str) -> dict:
    """A profile file's JSON, checked: every key the clock reads is there, with positive seconds."""
    with open(path, encoding="utf-8") as f:
        profile = json.load(f)
    missing = [key for key in REQUIRED if key not in profile]
    if missing:
        raise ValueError(f"{path}: a device profile needs {', '.join(missing)} (toolkit/clock/device_profiles.py)")
    seconds = profile["micro_batch_seconds"]
    if not seconds or any(not float(s) > 0 for s in seconds.values()):
        raise ValueError(f"{path}: micro_batch_seconds must give positive seconds for at least one size")
    unsourced = [key for key in PRICED if not profile["sources"].get(key)]
    if unsourced:
        raise ValueError(
            f"{path}: `sources` must say how {', '.join(unsourced)} were obtained (measured or estimated)"
        )
    return profile


def profile_from_throughput(
    result: dict,
    *,
    pass_seconds: float,
    optimizer_seconds: float,
    parameters: int,
    compiled: bool = True,
    memory_fraction: float = 0.9,
    source: str = "",
) -> dict:
    """A profile from `gpu_bench`'s throughput result (module docstring); `pass_seconds` (α) and
    `optimizer_seconds` (ω) are the estimates the measurement cannot give, `parameters` the model's."""
    rows = {(r["variant"], bool(r["compiled"])): r for r in result["rows"]}
    try:
        trainer, adloco, stats = (rows[(v, compiled)] for v in ("trainer", "adloco", "adloco_stats"))
    except KeyError as error:
        raise ValueError(f"the throughput result has no {error.args[0]} row (compiled={compiled})") from None
    batch, rounds = adloco["batch"], result["settings"]["timed_rounds"]
    step = adloco["step_seconds"]["median"]
    per_sample = (step - pass_seconds - optimizer_seconds) / batch
    if not per_sample > 0:
        raise ValueError(f"α + ω = {pass_seconds + optimizer_seconds} s leaves nothing of the measured step {step} s")
    outer = (adloco["window_seconds"] - trainer["window_seconds"]) / rounds
    statistics = (stats["window_seconds"] - adloco["window_seconds"]) / rounds - pass_seconds
    fixed = 24 * parameters
    per_sample_memory = (adloco["peak_memory_bytes"] - fixed) / batch
    largest = math.floor((memory_fraction * result["device"]["memory_bytes"] - fixed) / per_sample_memory)
    return {
        "device": result["device"]["name"],
        "preset": result["settings"]["preset"],
        "block_size": adloco["block_size"],
        "parameters": parameters,
        "compiled": compiled,
        "optim": result["settings"].get("optim"),
        "micro_batch_seconds": {str(b): pass_seconds + per_sample * b for b in SIZES},
        "optimizer_seconds": optimizer_seconds,
        "step_overhead_seconds": 0.0,
        "outer_seconds": max(outer, 0.0),
        "statistics_seconds": max(statistics, 0.0),
        "max_micro_batch": largest,
        "source": source,
        "measured_sizes": [batch],
        "sources": {
            "micro_batch_seconds": f"measured at {batch}; every other size on the line α + β b with α estimated",
            "optimizer_seconds": "estimated (given)",
            "step_overhead_seconds": "not measured (0)",
            "outer_seconds": "measured: AdLoCo's timed window less the Trainer's, per round",
            "statistics_seconds": "measured: the statistics run's window less AdLoCo's, per round, less one α",
            "max_micro_batch": f"extrapolated from the peak memory at {batch}",
        },
        "measured": {
            "batch": batch,
            "adloco_step_seconds_median": step,
            "window_seconds": {
                v: r["window_seconds"] for v, r in (("trainer", trainer), ("adloco", adloco), ("adloco_stats", stats))
            },  # fmt: skip
            "timed_rounds": rounds,
            "peak_memory_bytes": adloco["peak_memory_bytes"],
            "device_memory_bytes": result["device"]["memory_bytes"],
        },
        "interpolated": (
            f"Measured at one micro-batch ({batch}). A pass of b samples is taken as α + β b with α = "
            f"{pass_seconds * 1e3:g} ms and the optimizer step ω = {optimizer_seconds * 1e3:g} ms given as estimates "
            f"(not measured), β = {per_sample * 1e3:.4g} ms the rest of the measured step per sample: every size "
            f"but {batch} is interpolated or extrapolated on that line. outer_seconds and statistics_seconds are "
            f"differences of measured windows per round (statistics less the split's extra α). max_micro_batch: "
            f"peak memory extrapolated linearly in b to {memory_fraction:g} of the device's memory."
        ),
    }
