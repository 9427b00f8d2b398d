"""The command line every training benchmark shares: which methods, the budget, the shared settings' overrides
(`--set SECTION.KEY=JSON`), seeds. `settings.shared_settings` turns it into the settings."""

import argparse

from recipes.benchmarks.toolkit.methods import DEFAULT_METHODS, METHODS
from recipes.benchmarks.toolkit.settings import check_matched


__all__ = ["parse_run_args"]


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
        "--allow_repeats",
        action="store_true",
        help="Allow a budget above one epoch of the train split (samples are then seen more than once).",
    )
    args = parser.parse_args(argv)
    if args.fp16 and args.device != "cuda":
        parser.error("--fp16 needs --device cuda")
    if args.seeds < 1:
        parser.error("--seeds must be at least 1")
    if args.budget_seconds is not None and not args.budget_seconds > 0:
        parser.error(f"--budget_seconds must be positive, got {args.budget_seconds}")
    problem = check_matched(args.methods)
    if problem:
        parser.error(problem)
    return args
