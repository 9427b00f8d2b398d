"""The links report: the table per bandwidth and method, the per-round table, the to-target table, what each
column means, the checks; and the figure (eval perplexity against training seconds, one panel per bandwidth)."""

from recipes.benchmarks.links.checks import PRIMARY, TOLERANCE
from recipes.benchmarks.toolkit.figures import pyplot, save_figure
from recipes.benchmarks.toolkit.results import human_bytes, table
from recipes.benchmarks.toolkit.stats import ratio


__all__ = ["COLUMNS", "PER_ROUND_COLUMNS", "fmt", "format_report", "per_round_rows", "plot", "virtual_rows"]

COLUMNS = [
    "bandwidth",
    "method",
    "tokens",
    "wall s",
    "wall/ddp",
    "comm s (model)",
    "final ppl",
    "model bytes",
    "model+bcast",
    "link bytes (train)",
    "train/(model+bcast)",
    "train/model",
    "link bytes (launch)",
    "launch/model",
]


PER_ROUND_COLUMNS = [
    "bandwidth",
    "method",
    "rounds",
    "link B/round",
    "model B/round",
    "B/round vs base",
    "wall s/round",
    "steady s/round",
    "compute s/round",
    "blocked s/round",
    "blocked vs base",
    "peak Mbit/s",
    "peak vs base",
    "steady/compute",
    "s to diloco ppl",
    "ppl vs base",
]


def per_round_rows(bandwidths: dict[str, dict[str, dict]]) -> list[dict]:
    """The per-round table's rows ([`per_round`], [`add_reference_figures`])."""
    rows = []
    for bandwidth, methods in bandwidths.items():
        for method, run in methods.items():
            if "error" in run:
                continue
            base = run.get("base")
            hit = run.get("to_diloco_final_ppl")
            rows.append(
                {
                    "bandwidth": bandwidth,
                    "method": method,
                    "rounds": run.get("rounds"),
                    "link B/round": human_bytes(run.get("link_bytes_per_round")),
                    "model B/round": human_bytes(run.get("model_bytes_per_round")),
                    "B/round vs base": None
                    if run.get("link_bytes_per_round_vs_base") is None
                    else f"{run['link_bytes_per_round_vs_base']:.3f} ({base})",
                    "wall s/round": run.get("wall_seconds_per_round"),
                    "steady s/round": run.get("steady_wall_seconds_per_round"),
                    "compute s/round": run.get("compute_seconds_per_round"),
                    "blocked s/round": run.get("blocked_seconds_per_round"),
                    "blocked vs base": run.get("blocked_seconds_vs_base"),
                    "peak Mbit/s": None
                    if run.get("peak_link_bits_per_second") is None
                    else run["peak_link_bits_per_second"] / 1e6,
                    "peak vs base": run.get("peak_link_rate_vs_base"),
                    "steady/compute": run.get("steady_vs_compute"),
                    "s to diloco ppl": None if hit is None else hit.get("seconds"),
                    "ppl vs base": None
                    if run.get("final_ppl_vs_base") is None
                    else f"{run['final_ppl_vs_base']:.3f} ({base})",
                }
            )
    return rows


def virtual_rows(bandwidths: dict[str, dict[str, dict]]) -> list[dict]:
    """Per run timed by a virtual clock: its seconds per round against the measured steady rounds."""
    rows = []
    for bandwidth, methods in bandwidths.items():
        for method, run in methods.items():
            if run.get("virtual_seconds_per_round") is not None:
                error = run.get("virtual_error")
                rows.append(
                    {
                        "bandwidth": bandwidth,
                        "method": method,
                        "steady s/round": run.get("steady_wall_seconds_per_round"),
                        "virtual s/round": run["virtual_seconds_per_round"],
                        "error": None if error is None else f"{100 * error:+.1f} %",
                    }
                )
    return rows


def format_report(results: dict) -> str:
    rows = []
    for bandwidth, methods in results["bandwidths"].items():
        ddp = methods.get("ddp", {})
        for method, run in methods.items():
            if "error" in run:
                rows.append({"bandwidth": bandwidth, "method": method, "tokens": run["error"]})
                continue
            rows.append(
                {
                    "bandwidth": bandwidth,
                    "method": method,
                    "tokens": f"{run['tokens']:,}",
                    "wall s": run["wall_seconds"],
                    "wall/ddp": ratio(run["wall_seconds"], ddp.get("wall_seconds")),
                    "comm s (model)": run["model_comm_seconds"],
                    "final ppl": run["final_eval_ppl"],
                    "model bytes": human_bytes(run["model_bytes"]),
                    "model+bcast": human_bytes(run.get("model_bytes_with_broadcast")),
                    "link bytes (train)": human_bytes(run["link_bytes_training"]),
                    "train/(model+bcast)": run.get(PRIMARY),
                    "train/model": run["link_training_vs_model"],
                    "link bytes (launch)": human_bytes(run["link_bytes"]),
                    "launch/model": run["link_vs_model"],
                }
            )
    lines = [table(rows, COLUMNS)]
    per_round_table = per_round_rows(results["bandwidths"])
    if per_round_table:
        lines += ["", table(per_round_table, PER_ROUND_COLUMNS)]
    targets = results.get("targets") or []
    if targets:
        columns = [
            "bandwidth",
            "method",
            *(f"s to ppl {t:g}" for t in targets),
            *(f"tokens to {t:g}" for t in targets),
        ]
        rows = []
        for bandwidth, methods in results["bandwidths"].items():
            for method, run in methods.items():
                if "error" in run:
                    continue
                row = {"bandwidth": bandwidth, "method": method}
                for t in targets:
                    hit = run["to_target"].get(f"{t:g}")
                    row[f"s to ppl {t:g}"] = None if hit is None else hit["seconds"]
                    row[f"tokens to {t:g}"] = None if hit is None else f"{hit['tokens']:,.0f}"
                rows.append(row)
        lines += ["", table(rows, columns)]
    lines += [
        "",
        "wall s: training seconds (evaluations excluded; the slowest worker). comm s (model): the modelled bytes one "
        "link carries (1/M of the ring all-reduce total) at the link's rate. model bytes: comm_bytes, the ring "
        "all-reduce model 2 (M - 1) x payload, summed over the run. model+bcast: comm_bytes plus the start "
        "broadcast, (M - 1) x 4 x parameters (rank 0 sends its fp32 weights once to every other worker at the start, "
        "inside the training window: DDP's module sync, AdLoCo's initialisation; the ring model leaves it out; "
        "computed from first principles, not fitted), and with eval_merged_model each in-training evaluation of the "
        "merged model, one all-reduce of fp32 weights, 2 (M - 1) x 4 x parameters. link bytes: the bytes every worker's link sent (sum over the "
        "workers of lnkK's tx_bytes; each also received about as much): (train) between the first worker's start of "
        "training and the last one's end, evaluations included, interpolated on a 0.25 s timeline; (launch) the "
        "whole launch: the training window plus torchrun's rendezvous, gloo's connection set-up and the result "
        "gathering. Both count Ethernet/IP/TCP headers and ACKs (MTU 1500). The check (one criterion): "
        f"train/(model+bcast) within {TOLERANCE:.0%} of 1. train/model and launch/model (against comm_bytes "
        "alone) are diagnostics only, not checked. to-target: interpolated on the eval curves (log-perplexity "
        "linear between evaluations).",
        "",
        "Per round (DDP: per step): link B/round: training-window link bytes less the modelled start broadcast, "
        "/ rounds; model B/round: comm_bytes / rounds; B/round vs base: link B/round against the method this one "
        "varies (diloco for diloco_int8 ...). wall s/round: training seconds / rounds (the whole window, the start "
        "broadcast included). steady s/round: rounds 2 to R, from the end of the first round to the end of the last, "
        "evaluations excluded, the slowest worker. compute s/round: the compute-only time of a round, the same "
        "rounds' inner-step seconds (forward, backward, optimizer: from on_step_begin to on_step_end; the round's "
        "end, data loading and evaluations excluded), the slowest worker; not for DDP, whose all-reduce runs inside "
        "backward. blocked s/round: the library's comm_seconds, the outer step as the workers waited for it (with "
        "outer_overlap the wait for the background all-reduce; with fragments every send and apply of the round), "
        "mean over the same rounds; blocked vs base: against the method this one varies. peak Mbit/s: the highest "
        "rate any link sent at over one 0.25 s sample of the training window (a link saturated by an all-reduce "
        "shows its own rate); peak vs base: against the base method's. steady/compute: 1 when "
        "communication costs no time. s to diloco ppl: training seconds until the eval perplexity first reaches "
        "diloco's final perplexity at the same bandwidth (- never). ppl vs base: final perplexity / the base "
        "method's.",
    ]
    virtual = virtual_rows(results["bandwidths"])
    if virtual:
        lines += ["", "The virtual clock (--clock virtual) against the measured rounds (the same rounds 2 to R):", ""]
        lines.append(table(virtual, ["bandwidth", "method", "steady s/round", "virtual s/round", "error"]))
    verdict = {True: "holds", False: "MISSED", None: "n/a"}
    for check in results.get("checks", []):
        diagnostics = check.get("diagnostics", {})
        lines.append(
            f"check {check['bandwidth']} {check['method']}: training-window link bytes / (model bytes + start "
            f"broadcast) = {fmt(check['ratio'])}, within {check['tolerance']:.0%}: {verdict[check['holds']]} "
            f"(diagnostics, not checked: training window / comm_bytes alone "
            f"{fmt(diagnostics.get('link_training_vs_model'))}, whole launch / comm_bytes "
            f"{fmt(diagnostics.get('link_vs_model'))})"
        )
    for bandwidth, methods in results["bandwidths"].items():
        ddp, diloco = methods.get("ddp"), methods.get("diloco")
        if ddp and diloco and "error" not in ddp and "error" not in diloco:
            lines.append(
                f"{bandwidth}: ddp {ddp['wall_seconds']:.1f} s for {ddp['tokens']:,} tokens vs diloco "
                f"{diloco['wall_seconds']:.1f} s for {diloco['tokens']:,} tokens: ddp/diloco wall "
                f"{ddp['wall_seconds'] / diloco['wall_seconds']:.2f}x; training-window link bytes / (model + start "
                f"broadcast) ddp {fmt(ddp.get(PRIMARY))}, diloco {fmt(diloco.get(PRIMARY))}"
            )
    return "\n".join(lines)


def fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def plot(results: dict, path: str) -> str:
    plt = pyplot()
    bandwidths = list(results["bandwidths"])
    fig, axes = plt.subplots(1, len(bandwidths), figsize=(max(8.0, 5.5 * len(bandwidths)), 4.8), squeeze=False)
    for ax, bandwidth in zip(axes[0], bandwidths):
        for method, run in results["bandwidths"][bandwidth].items():
            if "curve" not in run:
                continue
            seconds, _, ppl = zip(*run["curve"])
            ax.plot(seconds, ppl, marker="o", markersize=3, label=method)
        for t in results.get("targets") or []:
            ax.axhline(t, color="grey", linewidth=0.6, linestyle=":")
        ax.set_title(f"{bandwidth} per link, both ways")
        ax.set_xlabel("training seconds (evaluations excluded)")
        ax.set_ylabel("eval perplexity")
        ax.set_yscale("log")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    settings = results["settings"]
    fig.suptitle(
        f"{settings['preset']}, {settings['world_size']} workers in {settings['world_size']} network namespaces, "
        f"budget {settings['budget_tokens']:,} tokens, H={settings['train']['inner_steps']}"
    )
    return save_figure(fig, path)
