"""`python -m recipes.benchmarks.convergence`: every method once per seed, the comparison, the report, the plot."""

import os
import time

from recipes.benchmarks.convergence.comparison import compare, to_target
from recipes.benchmarks.convergence.figure import plot
from recipes.benchmarks.convergence.report import format_report, summary
from recipes.benchmarks.convergence.seeds import CURVES, aggregate
from recipes.benchmarks.convergence.study import format_study, plot_study, run_study, study_results
from recipes.benchmarks.convergence.virtual import format_virtual, plot_virtual
from recipes.benchmarks.convergence.virtual_runs import run_virtual, virtual_results
from recipes.benchmarks.toolkit.methods import METHODS
from recipes.benchmarks.toolkit.options import parse_run_args
from recipes.benchmarks.toolkit.paths import REPO
from recipes.benchmarks.toolkit.results import write_json, write_report
from recipes.benchmarks.toolkit.runs import prepare, run_method, runnable
from recipes.benchmarks.toolkit.settings import check_epochs, matched_for, method_spec, run_order, shared_settings


__all__ = ["main", "parse_args"]

DESCRIPTION = "Convergence per token and per byte: DDP, DiLoCo, AdLoCo and AdLoCo's ablations under one token budget."


def parse_args(argv: list[str] | None = None):
    """The methods' command line (`toolkit/options.py`), checked; `--clock virtual` needs its bandwidths and budget
    here (`links` gives its own links)."""
    args = parse_run_args(argv, description=DESCRIPTION)
    if args.clock == "virtual":
        problems = []
        if not args.bandwidth:
            problems.append("--bandwidth (the links to price, e.g. 10gbit 1gbit 100mbit)")
        if args.budget_virtual_seconds is None:
            problems.append("--budget_virtual_seconds (one per bandwidth, or one for all)")
        if any("matched_to" in METHODS[n] for n in args.methods):
            problems.append("no matched method (its batch comes from a real-clock run)")
        if problems:
            raise SystemExit("convergence --clock virtual needs " + "; ".join(problems))
    return args


def main(argv: list[str] | None = None) -> dict:
    """Run the methods of the command line and write `results.json`, `summary.json`, `table.md` and the plot."""
    args = parse_args(argv)
    os.chdir(REPO)
    start = time.perf_counter()
    settings = shared_settings(args)
    if settings["device"] == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise SystemExit("--device cuda: no CUDA device is visible")
    output_dir = os.path.abspath(args.output_dir)
    os.makedirs(output_dir, exist_ok=True)
    seeds = [settings["seed"] + i for i in range(args.seeds)]
    names, unavailable = runnable(run_order(args.methods))
    if unavailable is not None:
        skipped = [n for n in args.methods if n not in names]
        print(f"skipping {', '.join(skipped)}: a slow worker needs a cgroup with a CPU quota ({unavailable})")
    print("preparing data and the initial perplexities ...", flush=True)
    initial_ppl = {}
    for seed in seeds + [args.selection_seed + i for i in range(args.selection_seeds)]:
        initial_ppl[seed], train_tokens = prepare(settings, seed)
    check_epochs(settings, train_tokens, args.allow_repeats)
    if args.selection_seeds:
        return _study(args, settings, output_dir, seeds, names, initial_ppl, start)
    if args.clock == "virtual":
        return _virtual(args, settings, output_dir, seeds, names, initial_ppl, start)
    per_seed: dict[str, dict[int, dict]] = {name: {} for name in names}
    runs, done = len(seeds) * len(names), 0
    for seed in seeds:
        for name in names:
            done += 1
            print(
                f"--- run {done}/{runs}: {name}, seed {seed} ({time.perf_counter() - start:.0f}s so far)", flush=True
            )
            try:
                matched = matched_for(
                    name, {n: runs_of[seed] for n, runs_of in per_seed.items() if seed in runs_of}, settings
                )
            except ValueError as error:
                per_seed[name][seed] = {"error": str(error)}
                continue
            spec = method_spec(name, settings, output_dir, seed=seed, matched_batch_size=matched)
            result = run_method(name, spec, args.reuse)
            if "curve" in result:
                for key in CURVES:
                    if key in result:  # a reused result may predate curve_instances_mean
                        result[key].insert(0, [0, initial_ppl[seed]])
                result["matched_batch_size"] = matched
                reference = METHODS[name].get("matched_to")
                if reference is not None:  # how close the integer batch came to the reference's tokens per round
                    ours, theirs = result, per_seed[reference][seed]
                    result["tokens_per_round_vs_reference"] = (ours["tokens"] / ours["rounds"]) / (
                        theirs["tokens"] / theirs["rounds"]
                    )
            per_seed[name][seed] = result
    methods = {name: aggregate(per_seed[name]) for name in args.methods if name in names}
    results = {
        "methods": methods,
        "settings": settings,
        "seeds": seeds,
        "initial_eval_ppl": initial_ppl,
        "train_tokens_available": train_tokens,
        "profile": "quick" if args.quick else "full",
    }
    results["ppl_targets"] = to_target(methods, initial_ppl)
    results.update(compare(methods))
    results["total_seconds"] = time.perf_counter() - start
    write_json(os.path.join(output_dir, "results.json"), results)
    write_json(os.path.join(output_dir, "summary.json"), summary(results))
    write_report(output_dir, format_report(results))
    if any("curve" in m for m in methods.values()):
        print(f"wrote {plot(results, os.path.join(output_dir, 'convergence.png'))}")
    print(f"wrote {os.path.join(output_dir, 'results.json')} ({results['total_seconds']:.0f}s in all)")
    return results


def _virtual(args, settings, output_dir, seeds, names, initial_ppl, start) -> dict:
    """`--clock virtual`: the runs, then per bandwidth the comparison in virtual seconds (`virtual.py`)."""

    def progress(what: str, done: int, total: int) -> None:
        print(f"--- run {done}/{total}: {what} ({time.perf_counter() - start:.0f}s so far)", flush=True)

    runs = run_virtual(args, settings, output_dir, seeds, names, progress)
    results = virtual_results(runs, settings, initial_ppl)
    results.update(
        settings={k: v for k, v in settings.items() if k != "clock"},
        seeds=seeds,
        initial_eval_ppl=initial_ppl,
        methods=names,
        total_seconds=time.perf_counter() - start,
    )
    write_json(os.path.join(output_dir, "results.json"), results)
    write_report(output_dir, format_virtual(results))
    print(f"wrote {plot_virtual(results, os.path.join(output_dir, 'convergence_virtual.png'))}")
    print(f"wrote {os.path.join(output_dir, 'results.json')} ({results['total_seconds']:.0f}s in all)")
    return results


def _study(args, settings, output_dir, seeds, names, initial_ppl, start) -> dict:
    """`--selection_seeds`: the best fixed batch picked on selection seeds, compared on the others (`study.py`)."""
    count = [0]

    def progress(what: str) -> None:
        count[0] += 1
        print(f"--- run {count[0]}: {what} ({time.perf_counter() - start:.0f}s so far)", flush=True)

    runs = run_study(args, settings, output_dir, seeds, names, progress)
    results = study_results(runs, settings, initial_ppl, args.guess, args.target_time_ratio, output_dir)
    results.update(
        settings={k: v for k, v in settings.items() if k != "clock"},
        seeds=seeds,
        initial_eval_ppl=initial_ppl,
        methods=names,
        best_fixed=runs["best"],
        command=" ".join(["python -m recipes.benchmarks.convergence", *(args.argv or [])]),
        total_seconds=time.perf_counter() - start,
    )
    write_json(os.path.join(output_dir, "results.json"), results)
    write_report(output_dir, format_study(results))
    print(f"wrote {plot_study(results, os.path.join(output_dir, 'study.png'))}")
    print(f"wrote {os.path.join(output_dir, 'results.json')} ({results['total_seconds']:.0f}s in all)")
    return results
