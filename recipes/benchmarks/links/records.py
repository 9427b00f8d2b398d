"""One run's record: the link counters cut to the training window and their peak rates, the figures per round
(rounds 2 to R against their compute-only seconds), and the run's entry of `results.json`."""

import json
import os
from collections.abc import Sequence

from recipes.benchmarks.toolkit.methods import METHODS
from recipes.benchmarks.toolkit.stats import first_reach, ratio
from recipes.benchmarks.toolkit.traffic import start_broadcast_bytes


__all__ = [
    "first_crossing",
    "merged_evaluations",
    "peak_rates",
    "per_round",
    "record",
    "run_record",
    "steady_rounds",
    "virtual_per_round",
    "window_bytes",
]


def first_crossing(curve: Sequence[Sequence[float]], target: float) -> dict | None:
    """Seconds and tokens at which a `[[seconds, tokens, ppl], ...]` curve first reaches `target` ([`first_reach`]:
    log-perplexity interpolated between the two evaluations around the crossing); None if never reached."""
    points = [{"seconds": s, "tokens": t, "eval_ppl": p} for s, t, p in curve if s is not None]
    return first_reach(points, target, {"seconds": "seconds", "tokens": "tokens"})


def window_bytes(timeline: Sequence[Sequence], start: float, end: float) -> list[dict] | None:
    """Per worker `{"tx", "rx"}` bytes between wall-clock times `start` and `end`, interpolated on a timeline of
    `[time, [tx per worker], [rx per worker]]` samples; None when the window is not inside the timeline."""
    if len(timeline) < 2 or start < timeline[0][0] or end > timeline[-1][0] or end < start:
        return None

    def at(t: float) -> tuple[list[float], list[float]]:
        for (t0, tx0, rx0), (t1, tx1, rx1) in zip(timeline, timeline[1:]):
            if t0 <= t <= t1:
                f = 0.0 if t1 == t0 else (t - t0) / (t1 - t0)
                return (
                    [a + f * (b - a) for a, b in zip(tx0, tx1)],
                    [a + f * (b - a) for a, b in zip(rx0, rx1)],
                )
        raise AssertionError("unreachable")

    (tx0, rx0), (tx1, rx1) = at(start), at(end)
    return [{"tx": int(round(b - a)), "rx": int(round(d - c))} for a, b, c, d in zip(tx0, tx1, rx0, rx1)]


def peak_rates(timeline: Sequence[Sequence], start: float, end: float) -> list[float] | None:
    """Per worker, the highest rate its link sent at (bytes per second) over one interval of the counters' timeline
    (`SAMPLE_SECONDS` apart) that lies inside the window [`start`, `end`]; None without such an interval. A link
    saturated by one all-reduce shows its own rate; Streaming DiLoCo's fragments, 1/P of the model each, show a peak
    up to P times lower where the link is not the bottleneck."""
    inside = [sample for sample in timeline if start <= sample[0] <= end]
    if len(inside) < 2:
        return None
    peaks = [0.0] * len(inside[0][1])
    for (t0, tx0, _), (t1, tx1, _) in zip(inside, inside[1:]):
        if t1 > t0:
            peaks = [max(peak, (b - a) / (t1 - t0)) for peak, a, b in zip(peaks, tx0, tx1)]
    return peaks


def steady_rounds(marks_per_rank: Sequence[Sequence[Sequence[float]] | None] | None) -> dict | None:
    """Rounds 2 to R from every worker's round marks (`[global_step, training seconds, evaluation seconds so far,
    inner-step seconds so far]` at each round's end: the worker's `RoundMarks`): the seconds from the end of
    the first round to the end of the last with the evaluations in between taken out (`wall_seconds_per_round`), and
    the inner-step seconds in the same interval (`compute_seconds_per_round`), each per round and the slowest
    worker's. Leaving out the first round leaves out the start (the weights' broadcast, warm-up); a round cut short
    at the end, and what follows the last round's end (with `outer_overlap`, the last all-reduce) are outside too.
    None when no worker has two marks."""
    wall, compute, window = [], [], None
    for marks in marks_per_rank or []:
        if not marks or len(marks) < 2:
            continue
        n = len(marks) - 1
        first, last = marks[0], marks[-1]
        wall.append(((last[1] - first[1]) - (last[2] - first[2])) / n)
        compute.append((last[3] - first[3]) / n)
        window = window or (n, first[0], last[0])
    if window is None:
        return None
    n, after_step, to_step = window
    return {
        "rounds": n,
        "after_step": after_step,
        "to_step": to_step,
        "wall_seconds_per_round": max(wall),
        "compute_seconds_per_round": max(compute),
    }


def per_round(result: dict, link_bytes_training: int | None, broadcast: int | None) -> dict:
    """A run's figures per round (DDP: per step, one all-reduce each), from the worker's result.json and the
    training-window link bytes:

    - `link_bytes_per_round`: (training-window link bytes - the modelled start broadcast) / rounds: the broadcast
      happens once per run, not per round (all link bytes when the broadcast is unknown);
    - `model_bytes_per_round`: comm_bytes / rounds; `wall_seconds_per_round`: training seconds / rounds (the whole
      training window: the start broadcast and the end included, evaluations excluded);
    - `steady_wall_seconds_per_round`, `compute_seconds_per_round`: rounds 2 to R ([`steady_rounds`]): the wall
      seconds of a round, and its compute-only seconds, the inner steps' (forward, backward, optimizer: what runs
      between the Trainer's `on_step_begin` and `on_step_end`; the round's end, data loading and evaluations not),
      the slowest worker's each; `steady_vs_compute` = their ratio (1 when communication is hidden or free);
    - `blocked_seconds_per_round`: the mean over the same rounds of the library's `comm_seconds` (the round's slowest
      instance): the outer step as the worker waited for it (with `outer_overlap`, the wait for the background
      all-reduce). AdLoCo kinds only: DDP's all-reduce runs inside its backward, so its steps are not compute-only.
    """
    rounds = result.get("rounds") or result.get("steps") or None
    steady = steady_rounds(result.get("round_marks_per_rank"))
    blocked = None
    if steady is not None and result.get("round_log"):
        inside = [
            r.get("comm_seconds")
            for r in result["round_log"]
            if steady["after_step"] < r["global_step"] <= steady["to_step"]
        ]
        if inside and None not in inside:
            blocked = sum(inside) / len(inside)
    link = None if link_bytes_training is None else link_bytes_training - (broadcast or 0)
    steady_wall = None if steady is None else steady["wall_seconds_per_round"]
    compute = None if steady is None else steady["compute_seconds_per_round"]
    virtual = virtual_per_round(result, steady)
    return {
        "rounds": rounds,
        "link_bytes_per_round": None if link is None or not rounds else link / rounds,
        "model_bytes_per_round": result["comm_bytes"] / rounds if rounds else None,
        "wall_seconds_per_round": result["wall_seconds"] / rounds if rounds else None,
        "steady_rounds": None if steady is None else steady["rounds"],
        "steady_wall_seconds_per_round": steady_wall,
        "compute_seconds_per_round": compute,
        "steady_vs_compute": ratio(steady_wall, compute),
        "blocked_seconds_per_round": blocked,
        # With --clock virtual: the clock's seconds per round over the same rounds, and its error against them.
        "virtual_seconds_per_round": virtual,
        "virtual_error": None if virtual is None or not steady_wall else virtual / steady_wall - 1,
    }


def virtual_per_round(result: dict, steady: dict | None) -> float | None:
    """The virtual clock's seconds per round (`result["virtual_round_ends"]`, the worker's `VirtualRounds`) over the
    rounds `steady` measured (from the end of its first round to the end of its last); None without either."""
    ends = {int(end[0]): end[1] for end in result.get("virtual_round_ends") or []}
    if steady is None or steady["after_step"] not in ends or steady["to_step"] not in ends:
        return None
    return (ends[steady["to_step"]] - ends[steady["after_step"]]) / steady["rounds"]


def merged_evaluations(path: str) -> int:
    """How many in-training evaluations of the merged model an eval log holds (`eval_merged_model`; the final one,
    after the final merge, costs no all-reduce)."""
    if not os.path.exists(path):
        return 0
    with open(path) as handle:
        lines = [json.loads(line) for line in handle if line.strip()]
    return sum(1 for line in lines if line.get("instance") == "merged" and line.get("final") is False)


def run_record(
    result: dict,
    *,
    method: str,
    bandwidth: str,
    rate_bits: int,
    burst: int,
    latency_ms: int,
    folder: str,
    initial_ppl: float | None,
    before: list[dict],
    after: list[dict],
    training: list[dict] | None,
    exit_codes: list[int],
    launch_seconds: float,
    processes_per_worker: int = 1,
    peaks: list[float] | None = None,
) -> dict:
    """One run's entry of results.json, from the worker's result.json and the link counters. With
    `processes_per_worker` = G each machine runs one worker of G processes, and only what crosses between machines
    (workers) reaches the links."""
    processes = result["world_size"]
    world = processes // processes_per_worker  # machines, each one worker (DDP: G of its processes)
    per_worker = [{"tx": a["tx"] - b["tx"], "rx": a["rx"] - b["rx"]} for a, b in zip(after, before)]
    link_bytes = sum(w["tx"] for w in per_worker)  # every byte crosses its sender's link once, then the receiver's
    link_training = None if training is None else sum(w["tx"] for w in training)
    curve = [[p["seconds"], p["tokens"], p["eval_ppl"]] for p in result["evals"] if p.get("seconds") is not None]
    if initial_ppl is not None:
        curve.insert(0, [0.0, 0, initial_ppl])
    model = result["comm_bytes"]
    if processes_per_worker > 1 and METHODS.get(method, {}).get("kind") == "ddp":
        # DDP's ring runs over all the processes, G consecutive ones per machine: of its P hops only the M between
        # machines cross a link (the others stay on the machine), so the links carry M / P of its ring model.
        model = model * world // processes
    # Not in comm_bytes (the ring model): at the start of training rank 0 sends its fp32 weights to every other
    # worker once (DDP's module sync, AdLoCo's initialisation), inside the training window. Computed, not fitted.
    broadcast = start_broadcast_bytes(world, result["parameters"]) if result.get("parameters") else None
    # Nor are the merged-model evaluations (`eval_merged_model`): each sums the instances' fp32 weights over the world
    # in one all-reduce, 2 (M − 1) × 4 × parameters, inside the training window (with G processes per worker, on each
    # of its G local ranks). Counted from the eval log.
    evaluations = merged_evaluations(os.path.join(folder, "adloco_eval.jsonl"))
    eval_bytes = (
        evaluations * processes_per_worker * 2 * max(world - 1, 0) * 4 * result["parameters"]
        if result.get("parameters")
        else 0
    )
    if broadcast is not None:
        broadcast += eval_bytes
    model_with_broadcast = None if broadcast is None else model + broadcast
    steps = result.get("steps") or 0
    rounds_file = os.path.join(folder, "adloco_rounds.jsonl")
    return {
        "method": method,
        "bandwidth": bandwidth,
        "bandwidth_bits_per_second": rate_bits,
        "tbf": {"rate_bits_per_second": rate_bits, "burst_bytes": burst, "latency_ms": latency_ms, "both_ways": True},
        "world_size": processes,
        "workers": world,
        "processes_per_worker": processes_per_worker,
        "folder": folder,
        "wall_seconds": result["wall_seconds"],
        "tokens": result["tokens"],
        "final_eval_ppl": result["final_eval_ppl"],
        "model_bytes": model,
        "link_bytes": link_bytes,
        "link_bytes_per_worker": per_worker,
        "link_bytes_training": link_training,
        "link_bytes_training_per_worker": training,
        # The highest rate any link sent at over one 0.25 s sample of the training window ([`peak_rates`]).
        "peak_link_bits_per_second": None if not peaks else 8 * max(peaks),
        "peak_link_bits_per_second_per_worker": None if peaks is None else [8 * p for p in peaks],
        # The check's ratio ([`check_links`]): training-window link bytes / (comm_bytes + the start broadcast).
        "broadcast_bytes_model": broadcast,  # the start broadcast + the merged-model evaluations' all-reduces
        "merged_evaluations": evaluations,
        "merged_evaluation_bytes": eval_bytes,
        "model_bytes_with_broadcast": model_with_broadcast,
        "link_training_vs_model_with_broadcast": ratio(link_training, model_with_broadcast),
        # Diagnostics only: against comm_bytes alone, in the training window and over the whole launch.
        "link_training_vs_model": ratio(link_training, model),
        "link_vs_model": ratio(link_bytes, model),
        # Serialisation time of the modelled bytes on one link (each worker sends 1/M of them): the ring model's
        # communication time at this rate, latency and overlap aside.
        "model_comm_seconds": model / world * 8 / rate_bits,
        "comm_rounds": result.get("comm_rounds"),
        # Per round: link and model bytes, wall and compute-only seconds ([`per_round`]).
        **per_round(result, link_training, broadcast),
        "curve": curve,
        "to_target": {},
        "timings": {
            "steps": steps,
            "rounds": result.get("rounds"),
            "seconds_per_step": result["wall_seconds"] / steps if steps else None,
            "wall_seconds_with_eval": result.get("wall_seconds_with_eval"),
            "eval_seconds": result.get("eval_seconds"),
            "train_started_at": result.get("train_started_at"),
            "train_ended_at": result.get("train_ended_at"),
            "launch_seconds": launch_seconds,
            # per evaluation: training seconds so far (evaluations excluded), tokens, inner steps, rounds, model bytes
            "evals": [
                [p.get("seconds"), p["tokens"], p.get("inner_steps"), p.get("rounds"), p.get("comm_bytes")]
                for p in result["evals"]
            ],
            "rounds_file": rounds_file if os.path.exists(rounds_file) else None,
        },
        "exit_codes": exit_codes,
        "budget_reached": result.get("budget_reached"),
    }


def record(
    result: dict, links: dict, method: str, bandwidth: str, folder: str, initial_ppl, processes_per_worker: int = 1
) -> dict:
    training = peaks = None
    start, end = result.get("train_started_at"), result.get("train_ended_at")
    if start is not None and end is not None:
        training = window_bytes(links["timeline"], start, end)
        peaks = peak_rates(links["timeline"], start, end)
    setting = links["setting"]
    return run_record(
        result,
        method=method,
        bandwidth=bandwidth,
        rate_bits=setting["rate_bits"],
        burst=setting["burst"],
        latency_ms=setting["latency_ms"],
        folder=folder,
        initial_ppl=initial_ppl,
        before=links["before"],
        after=links["after"],
        training=training,
        exit_codes=links["exit_codes"],
        launch_seconds=links["launch_seconds"],
        processes_per_worker=processes_per_worker,
        peaks=peaks,
    )
