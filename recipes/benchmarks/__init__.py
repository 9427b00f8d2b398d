"""Benchmarks of AdLoCo, a tool set: one folder per benchmark, run from the repository root as a module
(`python -m recipes.benchmarks.NAME`, its `__main__.py`), over the shared public modules of `toolkit/`
(README.md in this folder: the benchmarks, their commands and results, and the layout's rules):

    python -m recipes.benchmarks.convergence --quick
    python -m recipes.benchmarks.overhead --quick
"""
