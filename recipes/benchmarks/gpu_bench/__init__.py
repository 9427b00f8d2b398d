"""`make gpu-bench`: how fast AdLoCo trains where our users train, in resumable steps of at most 8 minutes, one a stay
on a lent GPU machine (15 minutes, its start-up included: `stay.sh`, docs/gpu.md).

| step | what it measures (issues 24 and 38) | module | minutes on an H100 (estimate) |
|---|---|---|---|
| `headline` | (c) the paper's claim: 4 workers sharing the GPU, `llama-50m`, DiLoCo (fixed batch) against AdLoCo with the goodput rule and with the norm test, 90 s of training each; each one's seconds to DiLoCo's final perplexity | `headline` | 7.5 |
| `throughput-50m` | (a) tokens/s, MFU, peak memory a parameter: `Trainer`, AdLoCo, with statistics, with its outer state on the CPU; eager and compiled; bf16; the Arrow data read by 0 and 4 loader workers | `throughput` | 4.5 |
| `growing-batch` | (b) a compiled AdLoCo worker whose request grows 4 → 64: graphs built, tokens/s against a compiled fixed batch | `throughput` | 3 |
| `workers` | (d) DiLoCo on 4 workers sharing the GPU against 1 worker; (e) 4 workers with the int4 ring and with the overlapped outer step against the bf16 all-reduce; tokens/s side by side | `workers` | 6 |
| `headline-seed2` | (c) the second seed | `headline` | 7.5 |
| `throughput-300m` | (a) for MicroLlama's shape | `throughput` | 6 |

The steps that have never been measured come first. Each step runs in its own process (stopped at 8 minutes, its
data included: the corpus is tokenised by one process a core) and writes `<step>.json` and `<step>.png` into the
results folder, `docs/results/gpu/<device>-<date>/`; a step whose JSON exists is skipped, so a later run, on another
day or machine of the same kind, finishes what an earlier one started (the newest unfinished folder of this device
and of this version of the benchmark, `BENCH_VERSION`, is continued). `--max_minutes` starts only the steps whose
estimate fits in what is left. At the end the folder's README.md and the generated section of docs/gpu.md are
rewritten from every results folder, with the targets checked.

    make gpu-bench                                                     # on a machine with an NVIDIA GPU
    python -m recipes.benchmarks.gpu_bench --steps headline            # one step: what fits in one stay
    python -m recipes.benchmarks.gpu_bench --table                     # only regenerate docs/gpu.md
    python -m recipes.benchmarks.gpu_bench --tiny                      # the whole thing on a CPU, tiny (tests)

On a CUDA image with its own torch (not the pinned 2.13.0), `builtin:python-source` comes from its export and
`datasets` from a wheel: `stay.sh prepare` makes both (and the tree to run) on a CPU machine, `stay.sh run STEP` runs
a step on the GPU machine and packs the results into one archive.

A step is a module of this package with `STEPS` (its names), `run(step, results_dir, cache_dir, tiny)` (writes
`<step>.json` last) and the step command line (`step_cli.py`), and one `Step` line in `cli.STEPS`. The modules:
`cli.py` (the steps, the results folder, the runs), `device.py` (device, MFU, the steps' files), `data.py`,
`report.py` (the tables), `headline.py`, `throughput.py` and `workers.py` (the steps).
"""

from recipes.benchmarks.toolkit.paths import offline


offline()  # before anything imports huggingface_hub (which reads it once); the steps run in this process with --tiny

from recipes.benchmarks.gpu_bench.cli import (  # noqa: E402
    STEP_LIMIT_SECONDS,
    STEPS,
    Step,
    choose_folder,
    fits,
    main,
    parse_args,
    pending,
    stop,
)
from recipes.benchmarks.gpu_bench.device import BENCH_VERSION, LAUNCHES_SUFFIX  # noqa: E402


__all__ = [
    "BENCH_VERSION",
    "LAUNCHES_SUFFIX",
    "STEPS",
    "STEP_LIMIT_SECONDS",
    "Step",
    "choose_folder",
    "fits",
    "main",
    "parse_args",
    "pending",
    "stop",
]
