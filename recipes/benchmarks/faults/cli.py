"""`python -m recipes.benchmarks.faults FAMILY [its options]`: one fault benchmark, three families of faults
(`process`, `soak`, `network`), each with its own options (`... FAMILY --help`), table and files."""

import argparse
import sys

from recipes.benchmarks.faults import network, process, soak


__all__ = ["FAMILIES", "main", "parse_args"]

FAMILIES = {
    "process": (process, "a real 2-worker run broken in 13 ways (kills, SIGTERMs, damaged checkpoints, a full disk, a "
                "NaN worker), resumed where the library says, compared with the run uninterrupted"),
    "soak": (soak, "4 workers under `accelerate launch --max_restarts`, a random worker SIGKILLed every few minutes "
             "for a quarter of an hour: the restarts, seconds to the next step, steps redone"),
    "network": (network, "4 machines in network namespaces (root), their links cut, flapping, slowed and split: "
                "seconds to the lost worker named and to the next step, steps redone (docs/faults.md)"),
}  # fmt: skip


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m recipes.benchmarks.faults",
        description="What faults do to an AdLoCo run: one family of faults a call.",
        epilog="\n".join(f"{name}: {what}" for name, (_, what) in FAMILIES.items()),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("family", choices=list(FAMILIES), help="the family of faults (its options: FAMILY --help)")
    return parser


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The family and its own options, parsed by the family's parser (`family` added to its namespace)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    family = _parser().parse_args(argv[:1]).family
    args = FAMILIES[family][0].parse_args(argv[1:])
    args.family = family
    return args


def main(argv: list[str] | None = None):
    """Run one family: its own `main` parses and checks the rest of the command line."""
    argv = list(sys.argv[1:] if argv is None else argv)
    family = _parser().parse_args(argv[:1]).family
    return FAMILIES[family][0].main(argv[1:])
