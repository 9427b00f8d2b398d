"""What a links run is checked and compared on: target perplexities every run reaches, the time to DiLoCo's final
perplexity and a variant's figures against its base method's, and the one check of the link bytes."""

from recipes.benchmarks.links.records import first_crossing
from recipes.benchmarks.toolkit.methods import METHODS
from recipes.benchmarks.toolkit.stats import choose_targets, ratio


__all__ = ["CRITERION", "DIAGNOSTICS", "PRIMARY", "TOLERANCE", "add_reference_figures", "add_targets", "check_links"]

# The done-criterion of the issue: measured link bytes within 15 % of the modelled ones ([`check_links`]).
TOLERANCE = 0.15


def add_targets(bandwidths: dict[str, dict[str, dict]]) -> list[float]:
    """Choose targets every run reaches ([`choose_targets`]) and fill each run's `to_target`
    (`{"<ppl>": {"seconds", "tokens"}}`)."""
    runs = [run for methods in bandwidths.values() for run in methods.values() if "curve" in run]
    targets = choose_targets([min((p[2] for p in run["curve"] if p[2] is not None), default=None) for run in runs])
    for run in runs:
        run["to_target"] = {f"{t:g}": first_crossing(run["curve"], t) for t in targets}
    return targets


def add_reference_figures(bandwidths: dict[str, dict[str, dict]]) -> None:
    """Per bandwidth, fill each run's `to_diloco_final_ppl` (`{"ppl", "seconds", "tokens"}`: when its eval curve
    first reaches the final perplexity of `diloco` (bf16 pseudo-gradients, no overlap) at the same bandwidth, or
    None if it never does or diloco did not run) and, for a variant (`methods.METHODS[name]["variant_of"]`),
    `base`, `link_bytes_per_round_vs_base`, `steady_seconds_per_round_vs_base`, `wall_seconds_vs_base` and
    `final_ppl_vs_base` against the run of its base method at the same bandwidth."""
    for methods in bandwidths.values():
        diloco = methods.get("diloco")
        target = None if not diloco or "error" in diloco else diloco.get("final_eval_ppl")
        for name, run in methods.items():
            if "error" in run:
                continue
            hit = None if target is None else first_crossing(run.get("curve", []), target)
            run["to_diloco_final_ppl"] = None if hit is None else {"ppl": target, **hit}
            base_name = METHODS.get(name, {}).get("variant_of")
            base = methods.get(base_name) if base_name else None
            if base is None or "error" in base:
                continue
            run["base"] = base_name
            run["link_bytes_per_round_vs_base"] = ratio(
                run.get("link_bytes_per_round"), base.get("link_bytes_per_round")
            )
            run["steady_seconds_per_round_vs_base"] = ratio(
                run.get("steady_wall_seconds_per_round"), base.get("steady_wall_seconds_per_round")
            )
            run["wall_seconds_vs_base"] = ratio(run.get("wall_seconds"), base.get("wall_seconds"))
            run["final_ppl_vs_base"] = ratio(run.get("final_eval_ppl"), base.get("final_eval_ppl"))
            run["blocked_seconds_vs_base"] = ratio(
                run.get("blocked_seconds_per_round"), base.get("blocked_seconds_per_round")
            )
            run["peak_link_rate_vs_base"] = ratio(
                run.get("peak_link_bits_per_second"), base.get("peak_link_bits_per_second")
            )


PRIMARY = "link_training_vs_model_with_broadcast"
DIAGNOSTICS = ("link_training_vs_model", "link_vs_model")
CRITERION = (
    "training-window link bytes (the interfaces' tx counters, cut to the training window) within {tolerance:.0%} of "
    "the modelled bytes including the start broadcast: comm_bytes (ring all-reduce model) + (M - 1) x 4 x "
    "parameters (rank 0 sends its fp32 weights once to every other worker, inside the window; computed, not fitted)"
)


def check_links(bandwidths: dict[str, dict[str, dict]], tolerance: float = TOLERANCE) -> list[dict]:
    """Per run, the one check: training-window link bytes against the modelled bytes including the start broadcast
    (`link_training_vs_model_with_broadcast`), within `tolerance`. The ratios against comm_bytes alone (training
    window, whole launch) are carried as diagnostics, not checked."""
    checks = []
    for bandwidth, methods in bandwidths.items():
        for method, run in methods.items():
            if "error" in run:
                continue
            value = run.get(PRIMARY)
            checks.append(
                {
                    "bandwidth": bandwidth,
                    "method": method,
                    "criterion": CRITERION.format(tolerance=tolerance),
                    "tolerance": tolerance,
                    "ratio": value,
                    "holds": None if value is None else abs(value - 1) <= tolerance,
                    "diagnostics": {key: run.get(key) for key in DIAGNOSTICS},
                }
            )
    return checks
