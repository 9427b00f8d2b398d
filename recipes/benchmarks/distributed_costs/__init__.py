"""What AdLoCo's distributed machinery costs, measured with real workers on this machine: `python -m
recipes.benchmarks.distributed_costs` (`cli.py`'s docstring, also its `--help`, says what it measures and how).

The modules: `worker.py` (what each launched worker records), `cli.py` (the launches, the merge events, the tables).
"""

from recipes.benchmarks.distributed_costs.cli import main, merge_events, parse_args


__all__ = ["main", "merge_events", "parse_args"]
