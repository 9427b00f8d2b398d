"""`make gpu-bench`: how fast AdLoCo trains where our users train, in resumable steps of at most 9 minutes.

| step | what it measures (issue 24) | module | minutes on an H100 (estimate) |
|---|---|---|---|
| `throughput-50m` | (a) tokens/s, MFU, peak memory: `Trainer`, AdLoCo, AdLoCo with statistics; eager and compiled; bf16 | `throughput` | 4 |
| `growing-batch` | (b) a compiled AdLoCo worker whose request grows 4 → 64: graphs built, tokens/s against a compiled fixed batch | `throughput` | 3 |
| `throughput-300m` | (a) for MicroLlama's shape | `throughput` | 5 |
| `workers` | (d) DiLoCo on 4 workers sharing the GPU against 1 worker; (e) 4 workers with the int4 ring and with the overlapped outer step against the bf16 all-reduce; tokens/s side by side | `workers` | 6 |
| `target-{diloco,adloco,trainer}-seed1` | (c) eval perplexity against seconds, 4 workers sharing the GPU (the Trainer: 1 worker, 4 × the batch), ≤ 5 minutes of training each | `workers` | 6.5 each |
| `target-{diloco,adloco,trainer}-seed2` | (c) the second seed | `workers` | 6.5 each |

Each step runs in its own process (at most 9 minutes, then it is stopped) and writes `<step>.json` and `<step>.png`
into the results folder, `docs/results/gpu/<device>-<date>/`; a step whose JSON exists is skipped, so a later run, on
another day or machine of the same kind, finishes what an earlier one started (the newest unfinished folder of this
device is continued). `--max_minutes` starts only the steps whose estimate fits in what is left. At the end the
folder's README.md and the generated section of docs/gpu.md are rewritten from every results folder, with the
targets checked.

    make gpu-bench                                                     # on a machine with an NVIDIA GPU
    python -m recipes.benchmarks.gpu_bench --max_minutes 8.5           # what fits in one 10-minute command
    python -m recipes.benchmarks.gpu_bench --steps growing-batch workers
    python -m recipes.benchmarks.gpu_bench --table                     # only regenerate docs/gpu.md
    python -m recipes.benchmarks.gpu_bench --tiny                      # the whole thing on a CPU, tiny (tests)

On a CUDA image with its own torch (not the pinned 2.13.0), `builtin:python-source` comes from its export
(`python -m adloco_hf.data.corpus_export DIR` where the pins are installed, then `ADLOCO_SOURCE_CORPUS=DIR`); run the
module with the image's Python and the repository on PYTHONPATH (`make gpu-bench` would install the pinned torch).

A step is a module of this package with `STEPS` (its names), `run(step, results_dir, cache_dir, tiny)` (writes
`<step>.json` last) and the step command line (`step_cli.py`), and one `Step` line in `cli.STEPS`. The modules:
`cli.py` (the steps, the results folder, the runs), `device.py` (device, MFU, the steps' files), `data.py`,
`report.py` (the tables), `throughput.py` and `workers.py` (the steps).
"""

from recipes.benchmarks.toolkit.paths import offline


offline()  # before anything imports huggingface_hub (which reads it once); the steps run in this process with --tiny

from recipes.benchmarks.gpu_bench.cli import (  # noqa: E402
    STEPS,
    Step,
    choose_folder,
    fits,
    main,
    parse_args,
    pending,
    stop,
)


__all__ = ["STEPS", "Step", "choose_folder", "fits", "main", "parse_args", "pending", "stop"]
