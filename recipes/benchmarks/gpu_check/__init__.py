"""`make gpu-check`: everything that needs CUDA, in one run of about 12 minutes on one H100, summed up in one table.

The library is developed on CPU machines; this is what to run whenever a GPU is at hand. Steps, in order (each runs
even if an earlier one failed; its outcome is a row of the table):

| step | what it runs | reported |
|---|---|---|
| `cuda tests` | `pytest -m cuda` (fp16 with a real GradScaler and an overflow step, `max_batch_size="auto"`) | passed / failed |
| `4 workers, gloo, fp16` | `convergence --device cuda --fp16 --methods diloco`: 4 workers share the GPU over gloo | tokens/s, final ppl, peak memory |
| `1 worker, gloo, fp16` | the same with one worker (same per-worker batch) | tokens/s, final ppl, peak memory |
| `4 workers / 1 worker` | tokens/s of the two runs above, same backend and batch (the paper's claim: several workers sharing a GPU train faster) | ratio |
| `1 worker, nccl, fp16, auto` | one worker over NCCL with `max_batch_size="auto"` | found max batch, peak memory, tokens/s |
| `overhead` | `overhead --device cuda --fp16 --quick`: AdLoCo's throughput against the plain Trainer on the GPU | throughput ratio |
| `4 workers, gloo, fp16, comm` | `convergence --methods diloco_overlap_int4 adloco`: the int4 ring with error feedback on a thread with its own CUDA stream, the overlapped outer step, merges by all-reduce, merged-model evaluation | tokens/s, final ppl, per method |

    make gpu-check                                     # from the repository root; exits 1 when a step failed
    python -m recipes.benchmarks.gpu_check --skip overhead

On a CUDA image whose torch is not the pinned 2.13.0 (the built-in corpus is made of its source), export the corpus
where the pins are installed and point the GPU machine at it; `make gpu-check` would reinstall torch, so call the
module with the image's own Python there (its transformers and accelerate serve when in the supported range,
`adloco_hf/common/versions.py`):

    python -m adloco_hf.data.corpus_export .corpus                                # on a machine with the pins
    ADLOCO_SOURCE_CORPUS=$PWD/.corpus python -m recipes.benchmarks.gpu_check     # on the GPU machine

Outputs in `--output_dir` (default `outputs/benchmarks/gpu_check`): `results.json`, `table.md`, and each step's
folder and log. Without a visible CUDA device it runs nothing and exits 2 with a message.

The modules: `steps.py` (every step's command, and the table from their outcomes), `cli.py` (the run).
"""

from recipes.benchmarks.gpu_check.cli import main, parse_args
from recipes.benchmarks.gpu_check.steps import COMM_METHODS, STEPS, pytest_counts, step_commands, summarise


__all__ = ["COMM_METHODS", "STEPS", "main", "parse_args", "pytest_counts", "step_commands", "summarise"]
