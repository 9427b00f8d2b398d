"""Fault injection: what each failure does to a real 2-worker AdLoCo run, and whether resuming gives the same model.

Every scenario launches real CPU workers (`accelerate launch --multi_gpu`, gloo) running the benchmark worker's fault
run (`recipes/benchmarks/toolkit/worker/fault_run.py`: a tiny Llama with attention dropout, 2 instances that merge,
growing batches, per-worker learning rates), breaks something, then resumes where the library says to, and compares
the final merged model with an uninterrupted run's. Prints one table and writes `faults.json` and `faults.png`.

    python -m recipes.benchmarks.faults process               # every scenario (~10 min on 2 cores)
    python -m recipes.benchmarks.faults process --scenarios sigterm_round_end,kill_all --output_dir outputs/faults

Columns: the outcome (what the user sees), the work lost (inner steps every worker has to train again after the
resume) and whether the resumed run ends with the uninterrupted run's merged model (max difference ≤ 1e-6).

The modules: `scenarios.py` (the launches, the scenarios, what the user reads), `cli.py` (the table, the plot).
"""

from recipes.benchmarks.faults.process.cli import main, parse_args
from recipes.benchmarks.faults.process.scenarios import SCENARIOS, Outcome


__all__ = ["SCENARIOS", "Outcome", "main", "parse_args"]
