"""Benchmarks of AdLoCo, run from the repository root as modules (see README.md in this folder):

    python -m recipes.benchmarks.convergence --quick
    python -m recipes.benchmarks.overhead --quick
    python -m recipes.benchmarks.distributed_costs

`_common` holds their pure-Python arithmetic; `_convergence_worker` is what `convergence` launches on every worker.
"""
