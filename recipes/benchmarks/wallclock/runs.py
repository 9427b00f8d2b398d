"""Runs on disk: a run folder's facts (spec.json, result.json), its replay, its eval curve as convergence holds
it, and the run folder to read under a method's folder (convergence writes one `seed-S/` folder per seed)."""

import math
import os
from typing import Any

from adloco_hf.inspection import load_rounds
from recipes.benchmarks.toolkit.link_model import DeviceProfile, Link
from recipes.benchmarks.toolkit.results import read_json
from recipes.benchmarks.toolkit.traffic import ring_all_reduce_bytes
from recipes.benchmarks.wallclock.replay import RunFacts, replay_adloco, replay_ddp


DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
ROUNDS_FILE = "adloco_rounds.jsonl"


def run_facts(folder: str, **overrides) -> tuple[RunFacts, dict, dict]:
    """A run folder's facts from its spec.json and result.json (`toolkit/worker/`); overrides win."""
    spec = read_json(os.path.join(folder, "spec.json")) or {}
    result = read_json(os.path.join(folder, "result.json")) or {}
    adloco = spec.get("adloco", {})
    numel = overrides.get("numel") or result.get("parameters")
    world = overrides.get("world_size") or spec.get("world_size") or result.get("world_size")
    dtype = overrides.get("pseudo_grad_dtype") or adloco.get("pseudo_grad_dtype", "bfloat16")
    lines = load_rounds(folder) if spec.get("kind", "adloco") != "ddp" else []
    if world is None and lines:
        world = len({w for line in lines for w in line["workers"]})
    if numel is None and lines:  # from the logged all-reduce bytes: `ring_all_reduce_bytes(numel × dtype bytes, M)`
        line = next(x for x in lines if len(x["workers"]) > 1)
        numel = (line["comm_bytes"] - (line.get("merge_bytes") or 0)) // ring_all_reduce_bytes(1, len(line["workers"]))
        numel //= DTYPE_BYTES[dtype]
    if numel is None or world is None:
        raise ValueError(f"{folder}: give --parameters and --world_size (no spec.json/result.json to read them from)")
    momentum = overrides.get("outer_momentum", adloco.get("outer_momentum", 0.9))
    facts = RunFacts(
        numel=int(numel),
        world_size=int(world),
        pseudo_grad_bytes=DTYPE_BYTES[dtype],
        with_momentum=float(momentum) > 0,
        save_merges=bool(adloco.get("save_merges", False)),
        statistics=adloco.get("batch_size_test", "norm") != "none",
        merge_transport=adloco.get("merge_transport", "point_to_point"),
    )
    return facts, spec, result


def replay_folder(
    folder: str,
    profile: DeviceProfile,
    link: Link,
    *,
    ddp_overlap: float = 0.0,
    device_max_micro_batch: int | None = None,
    **overrides,
) -> dict[str, Any]:
    """Replay one method's output folder (AdLoCo/DiLoCo: its rounds file; DDP: its spec and step count)."""
    facts, spec, result = run_facts(folder, **overrides)
    if spec.get("kind") == "ddp":
        batch = spec["train"]["batch_size"]
        tokens_per_step = facts.world_size * batch * spec["block_size"]
        steps = result.get("steps") or math.ceil(result["tokens"] / tokens_per_step)
        replay = replay_ddp(
            steps,
            batch,
            tokens_per_step,
            facts,
            profile,
            link,
            steps_per_record=spec["train"].get("inner_steps"),
            overlap=ddp_overlap,
            device_max_micro_batch=device_max_micro_batch,
        )
    else:
        replay = replay_adloco(
            load_rounds(folder), facts, profile, link, device_max_micro_batch=device_max_micro_batch
        )
    replay["facts"] = facts.__dict__
    replay["curve"] = result.get("curve")
    curve = _convergence_curve(folder)
    if curve:  # convergence's copy starts with the initial perplexity at 0 tokens
        replay["curve"] = curve
    return replay


def _convergence_curve(folder: str) -> list | None:
    """The run's curve as convergence's results.json holds it (with the initial point): for `<dir>/<method>` or,
    with several seeds, `<dir>/<method>/seed-<seed>`."""
    folder = os.path.abspath(folder)
    name, seed = os.path.basename(folder), None
    if name.startswith("seed-"):
        seed, folder = name[len("seed-") :], os.path.dirname(folder)
        name = os.path.basename(folder)
    results = read_json(os.path.join(os.path.dirname(folder), "results.json")) or {}
    method = results.get("methods", {}).get(name, {})
    if seed is None:
        return method.get("curve")
    return (method.get("seed_results", {}).get(seed) or {}).get("curve")


def _seed_folders(folder: str) -> list[str]:
    """`folder`'s `seed-S` subfolders, by seed (numerically where the seeds are numbers)."""
    if not os.path.isdir(folder):
        return []
    names = [d for d in os.listdir(folder) if d.startswith("seed-") and os.path.isdir(os.path.join(folder, d))]

    def key(name: str) -> tuple:
        seed = name[len("seed-") :]
        return (0, int(seed), "") if seed.lstrip("-").isdigit() else (1, 0, seed)

    return [os.path.join(folder, d) for d in sorted(names, key=key)]


def _is_run(folder: str, need_rounds: bool = False) -> bool:
    files = (ROUNDS_FILE,) if need_rounds else (ROUNDS_FILE, "spec.json", "result.json")
    return any(os.path.exists(os.path.join(folder, f)) for f in files)


def resolve_run_folder(folder: str, seed: int | str | None = None, *, need_rounds: bool = False) -> str | None:
    """The run folder to read for `folder`: convergence writes `NAME/seed-S/`, one folder per seed.

    With `seed`: `folder/seed-<seed>` (None if it holds no run). Without: the first `seed-*` subfolder, by seed, that
    holds a run, else `folder` itself if it holds one (a run folder given directly, or the one-folder layout).
    `need_rounds`: only folders with a rounds file (`adloco_rounds.jsonl`) count. None when nothing matches.
    """
    if seed is not None:
        candidates = [os.path.join(folder, f"seed-{seed}")]
    else:
        candidates = [*_seed_folders(folder), folder]
    return next((c for c in candidates if os.path.isdir(c) and _is_run(c, need_rounds)), None)


def seed_of(folder: str) -> str | None:
    """The seed of a `seed-S` run folder, or None for a folder of another name."""
    name = os.path.basename(os.path.normpath(folder))
    return name[len("seed-") :] if name.startswith("seed-") else None


def rounds_folder(folder: str) -> str | None:
    """The run folder with a rounds file under a method's folder (`resolve_run_folder`, first seed)."""
    return resolve_run_folder(folder, need_rounds=True)
