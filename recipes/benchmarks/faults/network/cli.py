"""`python -m recipes.benchmarks.faults network`: the testbed built, each scenario's uninterrupted reference run (once per
launcher, links and config, kept for later invocations), the scenarios, one JSON file each; then the table, the
targets, `netfaults.json` and `netfaults.png` over every scenario run so far in `--output_dir`."""

import argparse
import os
import time

from adloco_hf.inspection import default_peer_timeout
from recipes.benchmarks.faults.network.driver import Watched, run_scenario
from recipes.benchmarks.faults.network.measure import round_figures, summary, work_lost
from recipes.benchmarks.faults.network.report import check_targets, format_report, plot, write_doc
from recipes.benchmarks.faults.network.scenarios import CONFIG, SCENARIO_NAMES, TIMEOUT_KEYS, Scenario, scenarios
from recipes.benchmarks.faults.progress import Progress, thin_timeline
from recipes.benchmarks.toolkit.options import chosen_names
from recipes.benchmarks.toolkit.paths import RESULTS
from recipes.benchmarks.toolkit.results import read_json, write_json, write_report
from recipes.benchmarks.toolkit.resumed_runs import merged_weights
from recipes.benchmarks.toolkit.testbeds.machines import machine_info
from recipes.benchmarks.toolkit.testbeds.testbed import (
    LinkPlan,
    NamespacesUnavailable,
    Testbed,
    default_burst,
    parse_rate,
    unavailable_reason,
)


__all__ = ["PLAN", "main", "parse_args", "scenario_result"]

DESCRIPTION = (
    "Network faults: 4 machines in network namespaces under an elastic launcher, their links cut, flapping, slowed "
    "and split; what the user sees, how fast the lost worker is named, the work lost and the merged model."
)
# Names and addresses of its own, apart from `links`' testbed, so that both can run on one machine.
PLAN = LinkPlan(workers=4, prefix="adnf", subnet="10.213.89")
WORKER_TIMEOUT = 30.0  # a dead link named within half a minute; a round's spread here is a few seconds
# Why a scenario's merged model may differ from the uninterrupted run's (issue 42: "or the difference explained").
EXPLAINED = {
    "elastic": "after the restart 3 workers draw other batches than 4 did (an elastic resume re-splits the data)",
    "speed": "worker_batch_split='speed' splits each round's batch by measured step times, which differ between runs",
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m recipes.benchmarks.faults network", description=DESCRIPTION)
    parser.add_argument(
        "--scenarios", default=",".join(SCENARIO_NAMES), help=f"comma-separated, of {', '.join(SCENARIO_NAMES)}"
    )
    parser.add_argument("--output_dir", default="outputs/benchmarks/netfaults")
    parser.add_argument(
        "--worker_timeout",
        type=float,
        default=WORKER_TIMEOUT,
        help="AdLoCo's worker_timeout, and ddp_timeout with it (the library's default, 1800 s, names a dead link after "
        "30 minutes)",
    )
    parser.add_argument("--results_dir", default=RESULTS, help="where netfaults.json and netfaults.png go")
    parser.add_argument(
        "--max_steps", type=int, default=CONFIG["max_steps"], help="steps of every run (the scenarios act by step 50)"
    )
    parser.add_argument("--doc", default=None, help="a page whose netfaults section gets the table (docs/faults.md)")
    parser.add_argument("--report_only", action="store_true", help="the table and files from the scenarios run so far")
    args = parser.parse_args(argv)
    args.names = chosen_names(parser, args.scenarios, SCENARIO_NAMES)
    return args


def timeouts(worker_timeout: float) -> dict:
    """The runs' timeouts (docs/faults.md#timeouts): ddp_timeout, torch's backstop on the default group (over which
    the single instance after the merge runs its outer all-reduce), no longer than worker_timeout, so that a dead link
    is named within worker_timeout wherever it is met."""
    return {"worker_timeout": worker_timeout, "ddp_timeout": int(-(-worker_timeout // 1))}


def run_timeouts(config: dict) -> dict:
    """A run's worker_timeout, ddp_timeout and the peer_timeout its AdLoCoConfig resolves (`config/timeouts.py`)."""
    peer = config.get("peer_timeout")
    if peer is None:
        peer = default_peer_timeout(config["worker_timeout"])
    return {"worker_timeout": config["worker_timeout"], "ddp_timeout": config["ddp_timeout"], "peer_timeout": peer}


def _same_run(config: dict, other: dict | None) -> bool:
    """The timeouts do not change what an uninterrupted run computes: a reference is kept across them."""
    drop = TIMEOUT_KEYS
    return other is not None and {k: v for k, v in config.items() if k not in drop} == {
        k: v for k, v in other.items() if k not in drop
    }


def _timeline(watched: Watched) -> list[list[float]]:
    return thin_timeline(watched.progress.timeline(), watched.started)


def reference(testbed: Testbed, scenario: Scenario, root: str, config: dict) -> dict:
    """The uninterrupted run of `scenario`'s launcher, links and config: run once, then read back."""
    folder = os.path.join(root, "references", scenario.reference_key)
    path = os.path.join(folder, "reference.json")
    done = read_json(path)
    if done and _same_run({**config, **scenario.config}, done.get("config")):
        return done
    print(f"  the uninterrupted run ({scenario.reference_key}) ...", flush=True)
    _limit(testbed, scenario.bandwidth)
    watched = run_scenario(testbed, scenario, folder, config, actions=False)
    if not os.path.isdir(os.path.join(watched.out, "merged")):
        raise RuntimeError(f"the uninterrupted run failed (exit codes {watched.codes}), see {folder}")
    done = {"config": {**config, **scenario.config}, "out": watched.out, "timeline": _timeline(watched),
            "seconds": watched.ended - watched.started}  # fmt: skip
    write_json(path, done)
    return done


def _limit(testbed: Testbed, bandwidth: str) -> None:
    rate = parse_rate(bandwidth)
    testbed.limit(rate, default_burst(rate))


def scenario_result(scenario: Scenario, watched: Watched, ref: dict, config: dict) -> dict:
    """The scenario's JSON record: its figures (`measure.summary`), the merged model against the reference's, the
    timelines for the plot."""
    starts, steps = watched.progress.starts, watched.progress.steps
    result = {
        "scenario": scenario.name,
        "what": scenario.what,
        "launcher": scenario.launcher,
        "expect": scenario.expect,
        "bandwidth": scenario.bandwidth,
        "config": scenario.config,
        "timeouts": run_timeouts({**config, **scenario.config}),
        "seconds": round(watched.ended - watched.started, 1),
        **summary(
            events=watched.events,
            lines=watched.lines,
            starts=starts,
            steps=steps,
            inner_steps=config["inner_steps"],
            codes=watched.codes,
            stopped_at_deadline=watched.stopped_at_deadline,
        ),
        "events": [
            {"time": e.time, "action": e.action, "workers": list(e.workers), "detail": e.detail}
            for e in watched.events
        ],
        "actions_not_applied": len(watched.actions_left),
    }
    resumed = [min(starts[a].values()) for a in sorted(starts) if a > 0 and starts[a]]
    result["resumed_from"] = resumed[0] if resumed else None
    if os.path.isdir(os.path.join(watched.out, "merged")):
        result["merged_max_difference"] = (merged_weights(watched.out) - merged_weights(ref["out"])).abs().max().item()
    else:
        result["merged_max_difference"] = None
    if scenario.expect == "elastic":
        result["difference_explained"] = EXPLAINED["elastic"]
    elif scenario.config.get("worker_batch_split") == "speed":
        result["difference_explained"] = EXPLAINED["speed"]
    slowed = [a.when.step for a in scenario.actions if a.kind == "slow"]
    if slowed:
        result["rounds"] = round_figures(watched.out, slowed[0])
    result["timeline"] = _timeline(watched)
    result["reference_timeline"] = ref["timeline"]
    result["fault_spans"] = _spans(watched)
    return result


def _spans(watched: Watched) -> list[list[float | None]]:
    spans, open_at = [], None
    for event in watched.events:
        if event.action in ("cut", "partition", "slow") and open_at is None:
            open_at = event.time - watched.started
        elif event.action in ("restore", "heal", "unslow") and open_at is not None:
            spans.append([round(open_at, 2), round(event.time - watched.started, 2)])
            open_at = None
    if open_at is not None:
        spans.append([round(open_at, 2), None])
    return spans


def remeasured(result: dict, runs: str) -> dict:
    """`result` with the work lost measured again from its run's progress files, where they are kept (the measure
    may have been refined since the scenario ran)."""
    probe = os.path.join(runs, result["scenario"], "probe")
    if "error" in result or not os.path.isdir(probe):
        return result
    progress = Progress(probe, PLAN.workers)
    progress.read()
    return {**result, "work_lost_steps": work_lost(progress.starts, progress.steps)}


def main(argv: list[str] | None = None) -> dict | None:
    args = parse_args(argv)
    worker_timeout = args.worker_timeout
    config = {**CONFIG, "max_steps": args.max_steps, **timeouts(worker_timeout)}
    table = scenarios(worker_timeout)
    folder = os.path.join(args.output_dir, "scenarios")
    if not args.report_only:
        reason = unavailable_reason()
        if reason:
            print(f"skipped: {reason}; network faults need network namespaces (run it as root)", flush=True)
            return None
        try:
            with Testbed(PLAN) as testbed:
                for index, name in enumerate(args.names, 1):
                    scenario = table[name]
                    print(f"[{index}/{len(args.names)}] {name}: {scenario.what} ...", flush=True)
                    started = time.time()
                    try:
                        ref = reference(testbed, scenario, args.output_dir, config)
                        _limit(testbed, scenario.bandwidth)
                        watched = run_scenario(testbed, scenario, os.path.join(args.output_dir, "runs", name), config)
                        result = scenario_result(scenario, watched, ref, config)
                    except Exception as error:  # a scenario that breaks is a finding, not the end of the benchmark
                        result = {"scenario": name, "what": scenario.what, "launcher": scenario.launcher,
                                  "expect": scenario.expect, "error": f"{type(error).__name__}: {error}"}  # fmt: skip
                    write_json(os.path.join(folder, f"{name}.json"), result)
                    print(f"    done in {time.time() - started:.0f} s", flush=True)
        except NamespacesUnavailable as error:
            print(f"skipped: {error}", flush=True)
            return None
    results = [read_json(os.path.join(folder, f"{name}.json")) for name in SCENARIO_NAMES]
    results = [remeasured(r, os.path.join(args.output_dir, "runs")) for r in results if r is not None]
    if not results:
        print(f"no scenario has run yet in {args.output_dir}")
        return None
    settings = {"workers": PLAN.workers, "bandwidth": "10mbit (100mbit for slow_link*)",
                "worker_timeout": worker_timeout, "ddp_timeout": config["ddp_timeout"],
                "save_steps": config["save_steps"], "config": config}  # fmt: skip
    checks = check_targets(results, config["save_steps"])
    report = {"settings": settings, "machine": machine_info(), "scenarios": results, "checks": checks}
    os.makedirs(args.results_dir, exist_ok=True)
    write_json(os.path.join(args.results_dir, "netfaults.json"), report)
    write_report(args.output_dir, format_report(results, checks, settings))
    plot(results, os.path.join(args.results_dir, "netfaults.png"))
    if args.doc:
        write_doc(args.doc, report)
    return report
