"""The repository's recipes (`pretrain_c4.py`, `finetune_clm.py`, `plot_run.py`, run as scripts) and benchmarks.

A package only so that the benchmarks run as modules from the repository root: `python -m recipes.benchmarks.convergence`.
Not installed with `adloco_hf`.
"""
