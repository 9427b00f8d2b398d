"""Summarise and plot an AdLoCo run from the logs in its output_dir.

Prints a summary table and writes a 2×2 overview (batch size per worker, instances, losses, bytes
communicated over tokens seen) to OUTPUT_DIR/adloco_run.png, or to --out:

    python recipes/plot_run.py outputs/demo
    python recipes/plot_run.py outputs/demo --out /tmp/demo.png

Works on a finished run, on one still training and on one that crashed (a truncated last line is skipped).
"""

import argparse
import sys

from adloco_hf.inspection import format_summary, plot_run, summarize_run


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("output_dir", help="the run's output_dir, holding adloco_rounds.jsonl")
    parser.add_argument("--out", default=None, help="where to write the PNG (default: OUTPUT_DIR/adloco_run.png)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)

    try:
        summary = summarize_run(args.output_dir)
    except (FileNotFoundError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    print(format_summary(summary))
    print(f"wrote {plot_run(args.output_dir, args.out)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
