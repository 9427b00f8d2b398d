"""The command line every training benchmark shares: which methods, the budget, the shared settings' overrides
(`--set SECTION.KEY=JSON`), seeds. `settings.shared_settings` turns it into the settings."""

import argparse
import os
import sys

from recipes.benchmarks.toolkit.methods import DEFAULT_METHODS, METHODS
from recipes.benchmarks.toolkit.settings import check_matched
from recipes.benchmarks.toolkit.testbeds.testbed import parse_rate


__all__ = ["chosen_names", "parse_run_args"]


def parse_run_args(argv: list[str] | None = None, description: str | None = None) -> argparse.Namespace:
    """The command line of a training benchmark's methods (`convergence`'s; `links` passes it every option it does
    not know itself), checked: errors exit through argparse, naming the option."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--quick", action="store_true", help="The smaller budget (< 12 minutes on 2 CPU cores).")
    parser.add_argument(
        "--methods",
        nargs="+",
        choices=list(METHODS),
        default=list(DEFAULT_METHODS),
        help=f"Methods to run (default: {' '.join(DEFAULT_METHODS)}).",
    )
    parser.add_argument("--output_dir", default="outputs/benchmarks/convergence")
    parser.add_argument("--cache_dir", default="outputs/cache", help="Tokenizer and packed data cache.")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--preset", default=None, help="Model preset (default: tiny on CPU, microllama on CUDA).")
    parser.add_argument("--fp16", action="store_true", help="Mixed precision (CUDA only).")
    parser.add_argument("--budget_tokens", type=int, default=None, help="Training tokens per method.")
    parser.add_argument(
        "--budget_seconds",
        type=float,
        default=None,
        help="Training seconds per method (evaluations excluded): every method stops at the end of the first round "
        "after them, the same for all, and --budget_tokens (x each method's budget factor) becomes a ceiling.",
    )
    parser.add_argument(
        "--clock",
        choices=["real", "virtual"],
        default="real",
        help="virtual: every step priced by --device_profile and every round's communication by the link model at "
        "each --bandwidth (toolkit/clock/virtual_clock.py); seconds, budgets and the goodput rule's timings are virtual.",
    )
    parser.add_argument("--device_profile", default=None, help="The virtual clock's device profile (JSON).")
    parser.add_argument(
        "--bandwidth",
        "--bandwidths",
        nargs="+",
        default=None,
        help="The virtual clock's links, e.g. 10gbit 1gbit 100mbit (each worker's own link, both ways).",
    )
    parser.add_argument("--latency", type=float, default=1e-4, help="The virtual clock's latency per message (s).")
    parser.add_argument(
        "--link_efficiency",
        type=float,
        default=0.95,
        help="The virtual clock's payload share of a link's rate (TCP/IP over Ethernet, MTU 1500: 1448/1514; "
        "measured 0.95 on the links testbed, DESIGN §9).",
    )
    parser.add_argument(
        "--budget_virtual_seconds",
        nargs="+",
        type=float,
        default=None,
        help="With --clock virtual: virtual seconds of training per method, one per --bandwidth (or one for all); "
        "each stops at the end of the first round after them, --budget_tokens a ceiling.",
    )
    parser.add_argument("--batch_size", type=int, default=None, help="Initial per-worker batch (DDP: fixed).")
    parser.add_argument("--learning_rate", type=float, default=None, help="Inner AdamW learning rate (all methods).")
    parser.add_argument("--inner_steps", type=int, default=None, help="H, inner steps per round.")
    parser.add_argument("--eval_every_rounds", type=int, default=None)
    parser.add_argument("--warmup_steps", type=int, default=None)
    parser.add_argument("--eta", type=float, default=None, help="η of the norm test.")
    parser.add_argument("--max_batch_size", type=int, default=None)
    parser.add_argument("--batch_size_cap", type=int, default=None)
    parser.add_argument("--merge_every", type=int, default=None)
    parser.add_argument("--outer_lr", type=float, default=None, help="Outer lr of the methods that use the default.")
    parser.add_argument("--timeout", type=int, default=None, help="Seconds before one method's launch is killed.")
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="SECTION.KEY=JSON",
        help="Override any shared setting, e.g. --set adloco.outer_momentum=0 --set train.adam_beta2=0.95.",
    )
    parser.add_argument("--reuse", action="store_true", help="Keep a method's result when its spec is unchanged.")
    parser.add_argument(
        "--seeds", type=int, default=3, help="Seeds per method (model weights and data order): seed, seed + 1, ..."
    )
    parser.add_argument(
        "--selection_seeds",
        type=int,
        default=0,
        help="With --clock virtual: run the fixed batches of --methods on this many selection seeds first, pick the "
        "best per bandwidth there, and compare only it with the other methods on the --seeds (convergence/study.py).",
    )
    parser.add_argument("--selection_seed", type=int, default=100, help="The first selection seed.")
    parser.add_argument(
        "--guess",
        default=None,
        choices=list(METHODS),
        help="With --selection_seeds: run this method on the selection seeds too and compare it with every fixed "
        "batch of the sweep (what a batch picked without a sweep costs).",
    )
    parser.add_argument(
        "--target_time_ratio",
        type=float,
        default=1.0,
        help="With --selection_seeds: the target of a method's time to the best fixed batch's perplexity over that "
        "batch's (issue 51: 1.0; 0.85 in a long regime).",
    )
    parser.add_argument(
        "--allow_repeats",
        action="store_true",
        help="Allow a budget above one epoch of the train split (samples are then seen more than once).",
    )
    args = parser.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)  # the command that regenerates the results
    if args.fp16 and args.device != "cuda":
        parser.error("--fp16 needs --device cuda")
    if args.seeds < 1:
        parser.error("--seeds must be at least 1")
    if args.budget_seconds is not None and not args.budget_seconds > 0:
        parser.error(f"--budget_seconds must be positive, got {args.budget_seconds}")
    problem = check_matched(args.methods)
    if problem:
        parser.error(problem)
    check_clock(parser, args)
    if args.selection_seeds:
        if args.clock != "virtual":
            parser.error("--selection_seeds compares in virtual seconds: add --clock virtual")
        if not any("batch_size" in METHODS[n] for n in args.methods):
            parser.error("--selection_seeds picks the best fixed batch: name some in --methods (diloco_b4, ...)")
    if args.guess is not None and not args.selection_seeds:
        parser.error("--guess runs on the selection seeds: add --selection_seeds")
    return args


def check_clock(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """The virtual clock's options: a profile, rates that parse, one budget per bandwidth, no DDP (its steps are the
    plain Trainer's, which the clock does not time)."""
    virtual = args.clock == "virtual"
    for name in ("device_profile", "budget_virtual_seconds"):
        if getattr(args, name) is not None and not virtual:
            parser.error(f"--{name} needs --clock virtual")
    if not virtual:
        return
    if args.device_profile is None:
        parser.error("--clock virtual prices the steps with a device profile: pass --device_profile FILE (e.g. "
                     "docs/results/device_profiles/nvidia-h200-microllama.json)")  # fmt: skip
    if not os.path.isfile(args.device_profile):
        parser.error(f"--device_profile {args.device_profile}: no such file")
    args.device_profile = os.path.abspath(args.device_profile)  # the benchmark then runs from the repository root
    if "ddp" in args.methods:
        parser.error("--clock virtual times AdLoCoTrainer's workers; ddp runs the plain Trainer: leave it out")
    if args.budget_seconds is not None:
        parser.error("--clock virtual: give the budget in virtual seconds (--budget_virtual_seconds)")
    for bandwidth in args.bandwidth or ():
        try:
            parse_rate(bandwidth)
        except ValueError as error:
            parser.error(f"--bandwidth: {error}")
    budgets, bandwidths = args.budget_virtual_seconds, args.bandwidth or ()
    if budgets is not None:
        if any(not b > 0 for b in budgets):
            parser.error(f"--budget_virtual_seconds must be positive, got {budgets}")
        if not 0 < args.link_efficiency <= 1:
            parser.error(f"--link_efficiency must be in (0, 1], got {args.link_efficiency}")
        if len(budgets) not in (1, len(bandwidths)):
            parser.error(f"--budget_virtual_seconds: one value, or one per --bandwidth ({len(bandwidths)})")


def chosen_names(parser: argparse.ArgumentParser, text: str, known) -> list[str]:
    """The comma-separated names of `text` (`--scenarios a,b`), each one of `known`; an unknown one is a usage error
    naming the choices."""
    names = [name.strip() for name in text.split(",") if name.strip()]
    unknown = [name for name in names if name not in known]
    if unknown:
        parser.error(f"unknown scenario(s) {unknown}; choose from {', '.join(known)}")
    return names
