"""`python -m recipes.benchmarks.links`: the testbed built, every method launched at every bandwidth as machines on
it, the records, the checks, the report and the plot; the testbed removed however it ends."""

import argparse
import json
import os
import time

from recipes.benchmarks.links.checks import PRIMARY, add_reference_figures, add_targets, check_links
from recipes.benchmarks.links.records import record
from recipes.benchmarks.links.report import fmt, format_report, plot
from recipes.benchmarks.toolkit.methods import METHODS
from recipes.benchmarks.toolkit.options import parse_run_args
from recipes.benchmarks.toolkit.paths import REPO
from recipes.benchmarks.toolkit.results import human_bytes, write_json, write_report
from recipes.benchmarks.toolkit.runs import prepare, runnable
from recipes.benchmarks.toolkit.settings import (
    check_epochs,
    check_matched,
    matched_for,
    method_spec,
    run_order,
    shared_settings,
)
from recipes.benchmarks.toolkit.testbeds.machines import launch_machines, machine_info
from recipes.benchmarks.toolkit.testbeds.testbed import (
    LATENCY_MS,
    SAMPLE_SECONDS,
    LinkPlan,
    NamespacesUnavailable,
    Sampler,
    Teardown,
    Testbed,
    default_burst,
    existing_namespaces,
    parse_rate,
    unavailable_reason,
)


__all__ = [
    "BUDGET_TOKENS",
    "DEFAULT_BANDWIDTHS",
    "DEFAULT_METHODS",
    "QUICK_BANDWIDTHS",
    "cleanup_line",
    "main",
    "parse_args",
    "run_one",
]

DEFAULT_BANDWIDTHS = ("10mbit", "100mbit", "1gbit")
DEFAULT_METHODS = ("ddp", "diloco", "adloco")
QUICK_BANDWIDTHS = ("100mbit",)
# Training tokens per method (with or without --quick, unless --budget_tokens), chosen for time, not by the epoch
# limit: builtin:python-source's train split holds ~31 M tokens, so this is ~1.3 % of an epoch. With this budget
# --quick (100 Mbit/s; ddp, diloco, adloco) took 3.6 minutes on 2 cores, namespaces and data preparation included
# (measured on the earlier 413 k-token corpus; the seconds per token do not depend on the corpus, and the data cache
# is convergence's), well inside the 10 minutes. The default (10 Mbit/s, 100 Mbit/s, 1 Gbit/s) takes about
# 25 minutes, 12 of them DDP's at 10 Mbit/s (twice the 204,800-token run's 6 minutes).
BUDGET_TOKENS = 409_600


def run_one(
    testbed: Testbed, spec: dict, bandwidth: str, initial_ppl: float | None, reuse: bool, burst: int | None
) -> tuple[dict, dict | None]:
    """One method at one bandwidth: returns its results.json entry and the worker's result (None if it failed)."""
    method = spec["method"]
    rate = parse_rate(bandwidth)
    burst_bytes = default_burst(rate) if burst is None else burst
    folder = spec["output_dir"]
    spec_path, result_path, links_path = (os.path.join(folder, n) for n in ("spec.json", "result.json", "links.json"))
    tag = f"[{bandwidth} {method}]"
    links_setting = {
        "rate_bits": rate,
        "burst": burst_bytes,
        "latency_ms": LATENCY_MS,
        "workers": testbed.plan.workers,
    }
    if reuse and all(os.path.exists(p) for p in (spec_path, result_path, links_path)):
        with open(spec_path, encoding="utf-8") as f, open(links_path, encoding="utf-8") as g:
            old_spec, links = json.load(f), json.load(g)
        if old_spec == spec and links.get("setting") == links_setting:
            print(f"{tag} reusing {result_path}", flush=True)
            with open(result_path, encoding="utf-8") as f:
                result = json.load(f)
            run = record(result, links, method, bandwidth, folder, initial_ppl, spec.get("processes_per_worker", 1))
            return run, result
    os.makedirs(folder, exist_ok=True)
    for path in (result_path, links_path):
        if os.path.exists(path):
            os.remove(path)
    write_json(spec_path, spec)
    testbed.limit(rate, burst_bytes, LATENCY_MS)
    timeout = spec["timeout"] * max(1.0, 1e8 / rate)  # the profile's timeout is for 100 Mbit/s and faster
    print(
        f"{tag} launching {testbed.plan.workers} machines, tbf {bandwidth} both ways (burst {burst_bytes} B, "
        f"latency {LATENCY_MS} ms), logs in {folder}",
        flush=True,
    )
    sampler = Sampler(testbed)
    before = testbed.counters()
    sampler.start()
    try:
        codes, seconds = launch_machines(testbed, spec, spec_path, timeout)
    finally:
        timeline = sampler.stop()
    after = testbed.counters()
    links = {
        "setting": links_setting,
        "before": before,
        "after": after,
        "timeline": timeline,
        "exit_codes": codes,
        "launch_seconds": seconds,
    }
    write_json(links_path, links)
    if not os.path.exists(result_path):
        log = os.path.join(folder, "launch-machine0.log")
        with open(log, encoding="utf-8", errors="replace") as f:
            tail = f.read()[-3000:]
        print(f"{tag} FAILED (exit codes {codes}) after {seconds:.0f}s; end of {log}:\n{tail}", flush=True)
        return {"error": f"exit {codes}", "launch_seconds": seconds, "folder": folder}, None
    with open(result_path, encoding="utf-8") as f:
        result = json.load(f)
    run = record(result, links, method, bandwidth, folder, initial_ppl, spec.get("processes_per_worker", 1))
    print(
        f"{tag} done in {seconds:.0f}s: wall {run['wall_seconds']:.1f}s, ppl {run['final_eval_ppl']:.2f}, "
        f"{run['tokens']:,} tokens, model {human_bytes(run['model_bytes'])}, links "
        f"{human_bytes(run['link_bytes_training'])} in training = {fmt(run.get(PRIMARY))}x model + start broadcast "
        f"(checked; diagnostics: {fmt(run['link_training_vs_model'])}x model alone, "
        f"{human_bytes(run['link_bytes'])} = {fmt(run['link_vs_model'])}x in the whole launch), exit codes {codes}",
        flush=True,
    )
    return run, result


def parse_args(argv: list[str] | None = None) -> tuple[argparse.Namespace, argparse.Namespace]:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog="Every other option is convergence's (--budget_tokens, --inner_steps, --set SECTION.KEY=JSON ...).",
    )
    parser.add_argument("--quick", action="store_true", help="100mbit only, a small budget (< 10 minutes, 2 cores).")
    parser.add_argument(
        "--bandwidth",
        "--bandwidths",
        nargs="+",
        default=None,
        help="tc rates, e.g. 10mbit 100mbit 1gbit (the default; --quick: 100mbit).",
    )
    parser.add_argument("--methods", nargs="+", choices=list(METHODS), default=list(DEFAULT_METHODS))
    parser.add_argument("--output_dir", default="outputs/benchmarks/links")
    parser.add_argument("--workers", type=int, default=4, help="Workers, one network namespace each.")
    parser.add_argument(
        "--processes_per_worker",
        type=int,
        default=1,
        help="Processes per worker (machine): AdLoCo's processes_per_worker, DDP inside the machine; DDP's "
        "baseline runs over all of them.",
    )
    parser.add_argument("--prefix", default="adlk", help="Namespace name prefix (<prefix>-br, <prefix>-wK).")
    parser.add_argument("--subnet", default="10.213.87", help="The private /24 of the testbed (first three octets).")
    parser.add_argument("--burst", type=int, default=None, help="tbf burst in bytes (default: max(64 KiB, 4 ms)).")
    parser.add_argument(
        "--reuse", action="store_true", help="Keep a run's result when its spec and link are unchanged."
    )
    args, rest = parser.parse_known_args(argv)
    for bandwidth in args.bandwidth or ():
        try:
            parse_rate(bandwidth)
        except ValueError as error:
            parser.error(str(error))
    conv_argv = [*rest, "--output_dir", args.output_dir, "--methods", *args.methods]
    if args.quick:
        conv_argv.append("--quick")
    conv = parse_run_args(conv_argv)
    if conv.device != "cpu":
        parser.error("links runs its workers on the CPU (use_cpu), one per namespace")
    if conv.budget_tokens is None:
        conv.budget_tokens = BUDGET_TOKENS
    if args.bandwidth is None:
        args.bandwidth = list(QUICK_BANDWIDTHS if args.quick else DEFAULT_BANDWIDTHS)
    problem = check_matched(args.methods)
    if problem:
        parser.error(problem)
    return args, conv


def cleanup_line(plan: LinkPlan, done: Teardown | None) -> str:
    """What is left of the testbed after its removal (`done`: what the removal reported)."""
    present = existing_namespaces()
    if present is None:
        state = "`ip netns list` failed, cannot tell whether namespaces are left"
    else:
        left = sorted(present & set(plan.namespaces))
        state = f"namespaces left: {' '.join(left)}" if left else "no namespace left"
    if done is not None and done.failed:
        state += "; could not delete: " + "; ".join(f"{ns} ({error})" for ns, error in done.failed.items())
    return f"cleanup: {state}"


def main(argv: list[str] | None = None) -> dict:
    args, conv = parse_args(argv)
    output_dir = os.path.abspath(args.output_dir)  # relative to where it was called, before the chdir below
    reason = unavailable_reason()
    if reason:
        print(f"skipped: {reason}", flush=True)
        return {"skipped": reason}
    os.chdir(REPO)
    start = time.perf_counter()
    plan = LinkPlan(workers=args.workers, prefix=args.prefix, subnet=args.subnet)
    settings = shared_settings(conv)
    settings["world_size"] = args.workers * args.processes_per_worker
    if args.processes_per_worker > 1:
        settings["processes_per_worker"] = args.processes_per_worker
        settings["adloco"]["processes_per_worker"] = args.processes_per_worker
    os.makedirs(output_dir, exist_ok=True)
    results: dict = {"bandwidths": {}, "settings": settings, "machine": machine_info()}
    results["links"] = {
        "workers": plan.workers,
        "namespaces": plan.namespaces,
        "addresses": {plan.namespace(k): plan.address(k) for k in range(plan.workers)},
        "subnet": f"{plan.subnet}.0/24",
        "qdisc": "tbf on both ends of every veth (worker egress = upload, bridge port egress = download)",
        "latency_ms": LATENCY_MS,
        "burst_bytes": {b: default_burst(parse_rate(b)) if args.burst is None else args.burst for b in args.bandwidth},
        "mtu": 1500,
        "counter_timeline_seconds": SAMPLE_SECONDS,
    }
    seed = settings["seed"]
    print("preparing data and the initial perplexity ...", flush=True)
    initial_ppl, train_tokens = prepare(settings, seed)
    check_epochs(settings, train_tokens, conv.allow_repeats)
    results["initial_eval_ppl"] = initial_ppl
    names, unavailable = runnable(run_order(args.methods))
    if unavailable is not None:
        skipped = [n for n in args.methods if n not in names]
        print(f"skipping {', '.join(skipped)}: a slow worker needs a cgroup with a CPU quota ({unavailable})")
    testbed = Testbed(plan)
    try:
        with testbed:
            print(
                f"testbed: {plan.workers} namespaces ({plan.namespace(0)} ... {plan.namespace(plan.workers - 1)}, "
                f"{plan.subnet}.0/24) on a bridge in {plan.bridge_namespace} ({time.perf_counter() - start:.0f}s)",
                flush=True,
            )
            total, done = len(args.bandwidth) * len(names), 0
            for bandwidth in args.bandwidth:
                runs: dict[str, dict] = {}
                raw: dict[str, dict] = {}  # the worker's result.json per method, or the failed run's entry
                for name in names:
                    done += 1
                    print(
                        f"--- run {done}/{total}: {name} at {bandwidth} ({time.perf_counter() - start:.0f}s so far)",
                        flush=True,
                    )
                    try:
                        matched = matched_for(name, raw, settings)
                    except ValueError as error:
                        runs[name] = raw[name] = {"error": f"{error} (at {bandwidth})"}
                        continue
                    spec = method_spec(name, settings, output_dir, seed=seed, matched_batch_size=matched)
                    spec["output_dir"] = os.path.join(output_dir, bandwidth, name)
                    if spec.get("clock") is not None:  # --clock virtual: priced on this testbed link alone, the
                        # bytes its links carry (not scaled to the profile's model: `virtual_clock.bytes_scale`)
                        spec["clock"].update(
                            labels=[bandwidth],
                            bandwidths=[parse_rate(bandwidth)],
                            budget_seconds=None,
                            scale_bytes=False,
                        )
                    runs[name], result = run_one(testbed, spec, bandwidth, initial_ppl, args.reuse, args.burst)
                    raw[name] = runs[name] if result is None else result
                    if matched is not None:
                        runs[name]["matched_batch_size"] = matched
                results["bandwidths"][bandwidth] = {name: runs[name] for name in args.methods if name in names}
    except NamespacesUnavailable as error:
        print(f"skipped: {error}", flush=True)
        return {"skipped": str(error)}
    finally:
        print(cleanup_line(plan, testbed.teardown), flush=True)
    results["targets"] = add_targets(results["bandwidths"])
    add_reference_figures(results["bandwidths"])
    results["checks"] = check_links(results["bandwidths"])
    results["total_seconds"] = time.perf_counter() - start
    write_json(os.path.join(output_dir, "results.json"), results)
    write_report(output_dir, format_report(results))
    if any("curve" in run for runs in results["bandwidths"].values() for run in runs.values()):
        print(f"wrote {plot(results, os.path.join(output_dir, 'links.png'))}")
    print(f"wrote {os.path.join(output_dir, 'results.json')} ({results['total_seconds']:.0f}s in all)")
    return results
