"""The 1B/H100 scenario: time to a target perplexity for DDP, DiLoCo and AdLoCo over 0.1 to 100 Gbit/s links, from
an H100 step model, the tokens-to-target ratios measured by convergence and AdLoCo's measured trajectory."""

import math
from dataclasses import dataclass, replace
from typing import Any

from adloco_hf import plan_batch
from adloco_hf.inspection import group_by_round
from recipes.benchmarks.toolkit.figures import pyplot, save_figure
from recipes.benchmarks.toolkit.link_model import DeviceProfile, Link, mbit
from recipes.benchmarks.toolkit.results import table
from recipes.benchmarks.toolkit.stats import ratio
from recipes.benchmarks.wallclock.goodput import GoodputAssumptions, goodput_lines, step_time_model
from recipes.benchmarks.wallclock.replay import (
    RunFacts,
    merge_plan,
    replay_adloco,
    replay_ddp,
    seconds_at_tokens,
    tokens_to_target,
)


H100_BF16_DENSE_FLOPS = 989e12


@dataclass(frozen=True)
class Scenario:
    """A 1B-parameter model on H100s; every number here is printed with the results."""

    params: float = 1.0e9
    sequence_length: int = 2048
    # Sequences per forward/backward on one H100 (max_batch_size): 16 × 2048 tokens of a 1B model in bf16 need about
    # 16 GB of fp32 weights, gradients and AdamW moments plus ~2 GB of activations per sequence. Twice the initial
    # batch, as in convergence's CPU runs (max_batch_size 8, batch 4), so switch mode acts as it did there.
    micro_batch: int = 16
    batch: int = 8  # per-worker batch of DDP and DiLoCo, AdLoCo's initial request
    workers: int = 8
    mfu: float = 0.40
    peak_flops: float = H100_BF16_DENSE_FLOPS
    inner_steps: int = 500
    latency_seconds: float = 1e-4
    ddp_tokens_to_target: float = 20e9  # Chinchilla's 20 tokens per parameter
    pseudo_grad_bytes: int = 2  # bf16 pseudo-gradients
    ddp_grad_bytes: int = 4  # fp32 gradients, as convergence models DDP
    ddp_overlap: float = 0.0  # share of the forward/backward that hides DDP's all-reduce
    hbm_bytes_per_second: float = 3.35e12
    bandwidths: tuple[float, ...] = (1e8, 1e9, 1e10, 1e11)

    def profile(self) -> DeviceProfile:
        """Forward/backward: 6 × params × tokens FLOPs at `mfu` of the peak; the optimizer step and the outer step's
        local work are memory-bound passes over fp32 state (AdamW: read and write θ, grad, two moments = 32 bytes
        per parameter; outer step: about 6 fp32 passes = 24 bytes per parameter)."""
        per_sequence = 6 * self.params * self.sequence_length / (self.mfu * self.peak_flops)
        return DeviceProfile(
            micro_batch_seconds={1: per_sequence, self.micro_batch: per_sequence * self.micro_batch},
            optimizer_seconds=32 * self.params / self.hbm_bytes_per_second,
            outer_seconds=24 * self.params / self.hbm_bytes_per_second,
            source="6 N D FLOPs at MFU × peak",
        )


def measured_ratios(convergence: dict, target: float | None = None) -> dict[str, Any]:
    """Tokens to a target perplexity of diloco and adloco relative to ddp, from convergence's results.json.

    A method whose entry holds an `error` (every seed failed) is left out (listed under `skipped`). The target
    defaults to the worst of the methods' best perplexities: the highest of their curves' lowest points, the lowest
    perplexity that every curve reaches."""
    methods, skipped = {}, {}
    for name in ("ddp", "diloco", "adloco"):
        entry = convergence["methods"].get(name)
        if entry is None:
            continue
        if "error" in entry:
            skipped[name] = entry["error"]
        else:
            methods[name] = entry
    if "ddp" not in methods:
        reason = f" (it failed: {skipped['ddp']})" if "ddp" in skipped else ""
        raise ValueError(f"the convergence results hold no ddp run{reason}")
    if target is None:
        target = max(min(p for _, p in m["curve"] if p is not None and math.isfinite(p)) for m in methods.values())
    tokens = {name: tokens_to_target(m["curve"], target) for name, m in methods.items()}
    return {
        "target_ppl": target,
        "tokens_to_target": tokens,
        "ratios": {name: ratio(t, tokens["ddp"]) for name, t in tokens.items()},
        "skipped": skipped,
    }


def _scenario_lines(
    source_lines: list[dict], scenario: Scenario, rounds_needed: int, source_workers: int
) -> list[dict]:
    """AdLoCo's measured trajectory (instances, workers, requests, merges per round) mapped onto the scenario:
    every measured worker becomes workers / source_workers workers, requests scale with the initial batch, switch
    mode is planned again for the H100's micro-batch limit; past the measured rounds the table after the last one
    (its requests, the merge it ended with) repeats."""
    per = scenario.workers // source_workers
    grouped = list(group_by_round(source_lines).values())
    first_batch = grouped[0][0]["batch_size"]
    last = grouped[-1]
    if any(line["merged_from"] for line in last):  # the table after the last measured merge repeats
        plan = merge_plan(last, None, source_workers)
        last = [
            {"instance": inst.id, "workers": list(inst.workers), "batch_size": inst.batch_size, "merged_from": []}
            for inst in plan.after
        ]
    else:
        last = [{**line, "batch_size": line["next_batch_size"]} for line in last]
    out = []
    for index in range(rounds_needed):
        repeat = index >= len(grouped)
        lines = last if repeat else grouped[index]
        for line in lines:
            request = max(1, round(line["batch_size"] * scenario.batch / first_batch))
            plan = plan_batch(request, scenario.micro_batch, 2.0)
            workers = [w * per + k for w in line["workers"] for k in range(per)]
            out.append(
                {
                    "outer_step": index + 1,
                    "global_step": (index + 1) * scenario.inner_steps,
                    "instance": line["instance"],
                    "workers": workers,
                    "batch_size": request,
                    "next_batch_size": request,
                    "micro_batch_size": plan.micro_batch_size,
                    "accumulation_steps": plan.accumulation_steps,
                    "tokens": plan.batch_size * len(workers) * scenario.inner_steps * scenario.sequence_length,
                    "merged_from": list(line["merged_from"]),
                    "comm_bytes": 0,
                }
            )
    return out


def _until_tokens(lines: list[dict], tokens: float) -> list[dict]:
    """The rounds up to the first one at whose end the run has trained `tokens`."""
    kept, total = [], 0
    for group in group_by_round(lines).values():
        kept += group
        total += sum(line["tokens"] for line in group)
        if total >= tokens:
            break
    return kept


def scenario_results(
    scenario: Scenario,
    ratios: dict[str, float],
    adloco_lines: list[dict] | None,
    goodput: GoodputAssumptions | None = None,
) -> dict:
    """Time to target per method and bandwidth; with `goodput`, also DiLoCo whose batch the goodput rule chooses
    (`wallclock/goodput.py`), to DiLoCo's tokens to target weighted by the rule's statistical efficiency."""
    profile = scenario.profile()
    numel = int(scenario.params)
    facts = RunFacts(numel=numel, world_size=scenario.workers, pseudo_grad_bytes=scenario.pseudo_grad_bytes)
    tokens_per_step = scenario.workers * scenario.batch * scenario.sequence_length
    rows = []
    for bandwidth in scenario.bandwidths:
        link = Link(bandwidth, scenario.latency_seconds)
        for method in ("ddp", "diloco", "adloco"):
            if ratios.get(method) is None:
                continue
            target_tokens = scenario.ddp_tokens_to_target * ratios[method]
            if method == "ddp":
                steps = math.ceil(target_tokens / tokens_per_step)
                replay = replay_ddp(
                    steps,
                    scenario.batch,
                    tokens_per_step,
                    facts,
                    profile,
                    link,
                    grad_bytes=scenario.ddp_grad_bytes,
                    overlap=scenario.ddp_overlap,
                    broadcast="pipelined",
                )
            else:
                per_round = tokens_per_step * scenario.inner_steps
                if method == "diloco" or not adloco_lines:
                    lines = [
                        {
                            "outer_step": r + 1,
                            "global_step": (r + 1) * scenario.inner_steps,
                            "instance": 0,
                            "workers": list(range(scenario.workers)),
                            "batch_size": scenario.batch,
                            "next_batch_size": scenario.batch,
                            "micro_batch_size": min(scenario.batch, scenario.micro_batch),
                            "accumulation_steps": plan_batch(scenario.batch, scenario.micro_batch).accumulation_steps,
                            "tokens": per_round,
                            "merged_from": [],
                            "comm_bytes": 0,
                        }
                        for r in range(math.ceil(target_tokens / per_round))
                    ]
                else:
                    source_workers = len({w for line in adloco_lines for w in line["workers"]})
                    lines, needed = [], math.ceil(target_tokens / per_round)
                    while True:  # rounds grow in tokens as requests grow: extend until the target is covered
                        lines = _scenario_lines(adloco_lines, scenario, needed, source_workers)
                        if sum(line["tokens"] for line in lines) >= target_tokens:
                            break
                        needed = math.ceil(needed * 1.25) + 1
                lines = _until_tokens(lines, target_tokens)
                replay = replay_adloco(
                    lines, replace(facts, statistics=method == "adloco"), profile, link, broadcast="pipelined"
                )
            seconds = seconds_at_tokens(replay, target_tokens)
            total = replay["total"]
            rows.append(
                {
                    "method": method,
                    "bandwidth_bits_per_second": bandwidth,
                    "tokens_to_target": target_tokens,
                    "hours_to_target": None if seconds is None else seconds / 3600,
                    "compute_share": total["compute_seconds"] / total["wall_seconds"],
                    "idle_share": total["idle_seconds"] / total["wall_seconds"],
                    "comm_hours": total["comm_seconds"] / 3600,
                    "inner_steps": sum(r["inner_steps"] for r in replay["rounds"]),
                    "rounds": None if method == "ddp" else len(replay["rounds"]),
                }
            )
        if goodput is not None and ratios.get("diloco") is not None:
            rows.append(_goodput_row(scenario, goodput, profile, link, facts, ratios["diloco"]))
    return {"rows": rows, "profile": profile.to_json()}


def _goodput_row(
    scenario: Scenario, goodput: GoodputAssumptions, profile: DeviceProfile, link: Link, facts: RunFacts, ratio: float
) -> dict:
    times = step_time_model(
        profile, link, numel=facts.numel, workers=scenario.workers, grad_bytes=scenario.pseudo_grad_bytes
    )
    lines, summary = goodput_lines(
        times,
        goodput,
        workers=scenario.workers,
        batch=scenario.batch,
        micro_batch=scenario.micro_batch,
        inner_steps=scenario.inner_steps,
        sequence_length=scenario.sequence_length,
        target_tokens=scenario.ddp_tokens_to_target * ratio,
    )
    replay = replay_adloco(lines, facts, profile, link, broadcast="pipelined")
    total = replay["total"]
    return {
        "method": "goodput",
        "bandwidth_bits_per_second": link.bandwidth_bits_per_second,
        "tokens_to_target": summary["tokens"],
        "hours_to_target": total["wall_seconds"] / 3600,
        "compute_share": total["compute_seconds"] / total["wall_seconds"],
        "idle_share": total["idle_seconds"] / total["wall_seconds"],
        "comm_hours": total["comm_seconds"] / 3600,
        "inner_steps": sum(r["inner_steps"] for r in replay["rounds"]),
        "rounds": len(replay["rounds"]),
        "mean_batch": summary["mean_batch"],
        "last_batch": summary["last_batch"],
        "step_model": times.as_list(),
    }


def scenario_assumptions(scenario: Scenario, ratio_info: dict, goodput: GoodputAssumptions | None = None) -> list[str]:
    p = scenario.profile()
    return [
        f"model: {scenario.params / 1e9:g} B parameters, sequences of {scenario.sequence_length} tokens",
        f"H100 step: 6 × params × tokens FLOPs at MFU {scenario.mfu:.0%} of {scenario.peak_flops / 1e12:g} TFLOP/s "
        f"(bf16 dense): forward/backward {p.forward_backward_seconds(1):.4f} s per sequence; AdamW step "
        f"{1000 * p.optimizer_seconds:.1f} ms and outer step {1000 * p.outer_seconds:.1f} ms (memory-bound passes at "
        f"{scenario.hbm_bytes_per_second / 1e12:g} TB/s)",
        f"{scenario.workers} workers (one H100 each), each with its own link (full duplex, non-blocking switch), "
        f"latency {1000 * scenario.latency_seconds:g} ms per message (one latency for every bandwidth)",
        f"per-worker batch {scenario.batch} sequences (DDP, DiLoCo; AdLoCo's initial request), micro-batch limit "
        f"{scenario.micro_batch} (switch mode γ = 2: requests up to {2 * scenario.micro_batch} are capped at "
        f"{scenario.micro_batch}, larger ones accumulate)",
        f"DiLoCo/AdLoCo: H = {scenario.inner_steps} inner steps per round, bf16 pseudo-gradients "
        f"({scenario.pseudo_grad_bytes} bytes/parameter) in ring all-reduces (buckets of 2^25 elements); merges "
        "as merging.py sends them (fp32 φ and momentum, fp32 AdamW moments), the final merge, the initial broadcast",
        f"DDP: one gradient ring all-reduce per step ({scenario.ddp_grad_bytes} bytes/parameter, 25 MiB buckets), "
        + (
            "not overlapped with the backward"
            if scenario.ddp_overlap == 0
            else f"hidden behind {scenario.ddp_overlap:.0%} of the forward/backward time"
        ),
        "no compute/communication overlap anywhere (no streaming DiLoCo); no stragglers; instances run their H steps "
        "in lockstep, so an instance with a smaller batch waits for the slowest at the round's end (idle_share, "
        "counted in the compute share)",
        f"tokens to target: DDP {scenario.ddp_tokens_to_target / 1e9:g} B (20 tokens per parameter); DiLoCo and AdLoCo "
        f"× their measured ratios to DDP at perplexity {ratio_info.get('target_ppl', float('nan')):.1f} "
        f"({ratio_info.get('source', 'given')}): "
        + ", ".join(f"{m} {r:.3f}" for m, r in ratio_info["ratios"].items() if r is not None)
        + "".join(f"; {m} left out (every seed failed: {e})" for m, e in ratio_info.get("skipped", {}).items())
        + " — measured on a tiny model over a short budget; treat them as an assumption, not as a 1B fact",
        _goodput_assumption(scenario, goodput),
        "AdLoCo's trajectory (instances, merges, requests per round) is the measured run's "
        f"({ratio_info.get('adloco_trajectory', 'none found: AdLoCo replayed as DiLoCo rounds')}), each measured "
        f"worker mapped to {scenario.workers} / (its workers) workers and requests scaled by the initial batch; after "
        "the measured rounds the table after the last one repeats (its requests, no further merges)",
    ]


def _goodput_assumption(scenario: Scenario, goodput: GoodputAssumptions | None) -> str:
    if goodput is None:
        return "goodput: not replayed"
    return (
        "goodput: one instance of all the workers, the per-worker batch chosen every round by the library's goodput "
        "rule (adloco_hf.batch.goodput) from the step model above and the modelled round communication, with a noise "
        f"scale growing linearly over the run from {goodput.noise_start_tokens:.3g} to {goodput.noise_end_tokens:.3g} "
        "tokens (an assumption: the critical batch of a 1B model starts small and grows, Merrill et al. 2025; not "
        f"measured), hysteresis {goodput.hysteresis:g}, requests in [{scenario.batch}, {goodput.cap}] sequences; it "
        "trains until its tokens, each weighted by the rule's efficiency (B + M b0) / (B + M b) (M workers), reach DiLoCo's tokens to "
        "target"
    )


def format_scenario(rows: list[dict]) -> str:
    shown = [
        {
            **r,
            "bandwidth": mbit(r["bandwidth_bits_per_second"]),
            "tokens (B)": r["tokens_to_target"] / 1e9,
            "hours": r["hours_to_target"],
            "compute share": r["compute_share"],
        }
        for r in rows
    ]
    columns = ["bandwidth", "method", "tokens (B)", "hours", "compute share", "idle_share", "comm_hours"]
    return table(shown, [*columns, "inner_steps", "rounds", "mean_batch", "last_batch"])


def plot_scenario(rows: list[dict], path: str, title: str) -> str:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 5))
    for method in ("ddp", "diloco", "adloco", "goodput"):
        points = [
            (r["bandwidth_bits_per_second"] / 1e9, r["hours_to_target"])
            for r in rows
            if r["method"] == method and r["hours_to_target"]
        ]
        if points:
            x, y = zip(*points)
            ax.plot(x, y, marker="o", label=method, linewidth=2)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("link bandwidth per worker (Gbit/s)")
    ax.set_ylabel("hours to target perplexity")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    ax.set_title(title, fontsize=9)
    return save_figure(fig, path)
