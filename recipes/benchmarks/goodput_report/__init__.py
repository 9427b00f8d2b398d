"""Issue 25's targets from the results of `links` and `convergence`: does the goodput rule pay for itself?

Every ratio is computed inside one run of a benchmark (its methods side by side), per seed, then summarised as the
mean ± the sample standard deviation over seeds (one `links` run per seed: `--set seed=43`).

- Wall time, per bandwidth of `links` (and for `convergence`'s 4 workers on one machine, no link limit): the best
  fixed batch (`diloco_b4`, `diloco_b8`, `diloco_b16`: the lowest final perplexity) sets the target perplexity, its
  final one, and the time it took (`wall_seconds`, evaluations excluded); `adloco_goodput`'s time to reach that
  perplexity (its eval curve over training seconds, log-perplexity interpolated between evaluations; never: it did
  not reach it) over that time. Targets: ≤ 0.8 at 10 Mbit/s, ≤ 1.0 at 100 Mbit/s, ≤ 1.05 without a link limit.
- Perplexity at equal tokens (`convergence`): `adloco_goodput` / `diloco_b4`, both curves interpolated at the
  smaller final token count of the two. Target ≤ 1.05.
- Merges over the 100 Mbit/s links: each merge's `merge_seconds` (the rounds file: the slowest worker's merge,
  redistribution included) over the time one bf16 copy of the model takes on the link (2 bytes × parameters × 8 /
  rate). Target ≤ 3.

    python -m recipes.benchmarks.goodput_report \\
        --links outputs/benchmarks/links-goodput-42/results.json outputs/benchmarks/links-goodput-43/results.json \\
        --convergence outputs/benchmarks/convergence-goodput/results.json --output_dir outputs/benchmarks/goodput

Outputs: `results.json`, `table.md` and `goodput.png` (each seed's ratios against the targets) in `--output_dir`.

The modules: `figures.py` (the ratios from `links`' and `convergence`'s results), `report.py` (rows, targets, the
paired ratios, the plot), `cli.py`.
"""

from recipes.benchmarks.goodput_report.cli import main, parse_args
from recipes.benchmarks.goodput_report.figures import (
    convergence_figures,
    merge_link_model_times,
    merge_times,
    time_to,
    wall_ratio,
)
from recipes.benchmarks.goodput_report.report import verdict


__all__ = [
    "convergence_figures",
    "main",
    "merge_link_model_times",
    "merge_times",
    "parse_args",
    "time_to",
    "verdict",
    "wall_ratio",
]
