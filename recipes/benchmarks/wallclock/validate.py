"""Validation against links: predicted against measured wall seconds (and seconds to its target perplexities)
for every method and bandwidth of a links results file, optionally calibrated on the highest bandwidth."""

import os
from typing import Any

from recipes.benchmarks.toolkit.link_model import DeviceProfile, Link, mbit
from recipes.benchmarks.toolkit.results import table
from recipes.benchmarks.toolkit.stats import ratio
from recipes.benchmarks.wallclock.replay import seconds_at_tokens
from recipes.benchmarks.wallclock.runs import replay_folder


def links_entries(obj: Any, method: str | None = None) -> list[dict]:
    """Every measurement of a links results file: a dict with `wall_seconds` and `bandwidth_bits_per_second`,
    wherever it sits; its method is its own `method` or the key it is stored under (the nearest one)."""
    found = []
    if isinstance(obj, dict):
        if "wall_seconds" in obj and "bandwidth_bits_per_second" in obj:
            entry = dict(obj)
            entry.setdefault("method", method)
            found.append(entry)
            return found
        for key, value in obj.items():
            found += links_entries(value, key if isinstance(value, dict) and key not in ("tbf",) else method)
    elif isinstance(obj, list):
        for value in obj:
            found += links_entries(value, method)
    return found


def validate(
    links: dict,
    profile: DeviceProfile | None,
    *,
    latency: float,
    efficiency: float = 1.0,
    calibrate: str = "none",
    ddp_overlap: float = 0.0,
    base_dir: str = ".",
) -> list[dict]:
    """Predicted against measured wall seconds for every method and bandwidth of a links results file.

    `calibrate="highest"`: per method, the compute times are scaled so that the run at the highest bandwidth is
    matched exactly; that row is marked `calibration` and its error is not a prediction's.
    """
    entries = [e for e in links_entries(links) if e.get("wall_seconds") is not None]
    rows = []
    by_method: dict[str, list[dict]] = {}
    for entry in entries:
        by_method.setdefault(str(entry.get("method")), []).append(entry)
    for method, group in sorted(by_method.items()):
        group = sorted(group, key=lambda e: e["bandwidth_bits_per_second"])
        method_profile = profile
        reference = None
        if calibrate == "highest":
            reference = group[-1]
            link = Link(reference["bandwidth_bits_per_second"], latency, efficiency)
            base = replay_folder(_folder(reference, base_dir), profile, link, ddp_overlap=ddp_overlap)
            method_profile = profile.scaled(calibration_factor(method, reference, base["total"]))
        for entry in group:
            link = Link(entry["bandwidth_bits_per_second"], latency, efficiency)
            replay = replay_folder(_folder(entry, base_dir), method_profile, link, ddp_overlap=ddp_overlap)
            predicted, measured = replay["total"]["wall_seconds"], entry["wall_seconds"]
            targets = []
            for ppl, reached in sorted((entry.get("to_target") or {}).items(), key=lambda kv: -float(kv[0])):
                if not reached or reached.get("tokens") is None or not reached.get("seconds"):
                    continue
                at = seconds_at_tokens(replay, reached["tokens"])
                targets.append(
                    {
                        "target_ppl": float(ppl),
                        "tokens": reached["tokens"],
                        "measured_seconds": reached["seconds"],
                        "predicted_seconds": at,
                        "relative_error": None if at is None else (at - reached["seconds"]) / reached["seconds"],
                    }
                )
            rows.append(
                {
                    "method": method,
                    "bandwidth_bits_per_second": entry["bandwidth_bits_per_second"],
                    "measured_seconds": measured,
                    "predicted_seconds": predicted,
                    "predicted_compute_seconds": replay["total"]["compute_seconds"],
                    "predicted_comm_seconds": replay["total"]["comm_seconds"],
                    "relative_error": (predicted - measured) / measured,
                    "role": "calibration" if entry is reference else "prediction",
                    "link_bytes": entry.get("link_bytes_training", entry.get("link_bytes")),
                    "modelled_bytes": replay["total"]["modelled_bytes"],
                    "bytes_ratio": ratio(
                        entry.get("link_bytes_training", entry.get("link_bytes")), replay["total"]["modelled_bytes"]
                    ),
                    "folder": entry.get("folder"),
                    "to_target": targets,
                    "to_target_mean_abs_error": (
                        sum(abs(t["relative_error"]) for t in targets) / len(targets)
                        if targets and all(t["relative_error"] is not None for t in targets)
                        else None
                    ),
                }
            )
    return rows


def calibration_factor(method: str, reference: dict, predicted_total: dict) -> float:
    """The factor on every compute time that makes the replay of `reference` (a links entry) last its measured
    wall seconds: (measured wall − predicted communication) / predicted compute.

    Raises ValueError when it is not positive: the predicted communication alone already exceeds the measured wall
    time (a link model too slow for that run, e.g. the wrong `--efficiency` or latency), or the profile predicts no
    compute; no compute scaling can match such a run.
    """
    wall, comm = reference["wall_seconds"], predicted_total["comm_seconds"]
    compute = predicted_total["compute_seconds"]
    if compute <= 0:
        raise ValueError(f"cannot calibrate {method}: the device profile predicts no compute ({compute:g} s)")
    factor = (wall - comm) / compute
    if factor <= 0:
        bandwidth = mbit(reference["bandwidth_bits_per_second"])
        raise ValueError(
            f"cannot calibrate {method} on its run at {bandwidth}: the predicted communication ({comm:.3g} s) "
            f"is not below the measured wall time ({wall:.3g} s), so no positive compute time matches it; "
            "check the link model (--efficiency, --latency) or calibrate with --calibrate none"
        )
    return factor


def _folder(entry: dict, base_dir: str) -> str:
    folder = entry.get("folder")
    if not folder:
        raise ValueError(f"links entry for {entry.get('method')} has no `folder`")
    return folder if os.path.isabs(folder) else os.path.join(base_dir, folder)


def format_validation(rows: list[dict]) -> str:
    shown = [
        {
            **r,
            "bandwidth": mbit(r["bandwidth_bits_per_second"]),
            "error %": 100 * r["relative_error"],
            "to-target error %": None
            if r.get("to_target_mean_abs_error") is None
            else 100 * r["to_target_mean_abs_error"],
            "link/modelled bytes": r["bytes_ratio"],
        }
        for r in rows
    ]
    columns = [
        "method",
        "bandwidth",
        "measured_seconds",
        "predicted_seconds",
        "predicted_compute_seconds",
        "predicted_comm_seconds",
        "error %",
        "to-target error %",
        "role",
        "link/modelled bytes",
    ]
    lines = [table(shown, columns)]
    errors = [abs(r["relative_error"]) for r in rows if r["role"] == "prediction"]
    if errors:
        lines.append(
            f"\n|relative error| over {len(errors)} predictions: mean {100 * sum(errors) / len(errors):.1f}%, "
            f"max {100 * max(errors):.1f}%"
        )
    lines.append(
        "to-target error %: mean |relative error| of the predicted seconds at which the run reached links' "
        "target perplexities (at the measured tokens), against the measured ones."
    )
    return "\n".join(lines)
