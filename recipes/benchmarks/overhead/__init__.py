"""One worker's training throughput under variants alternated side by side: what AdLoCo costs against the plain
Trainer (and the price of the gradient statistics), what a stream costs against the materialised dataset, and what
DataLoader processes change.

One process, one worker, the same model (`tiny`, block 128), fixed batch and inner optimizer (`adamw_torch`) for
every variant of a comparison (`--compare`):

| comparison | variants |
|---|---|
| `trainer` (default) | `trainer`: the plain `transformers.Trainer`; `adloco`: `AdLoCoTrainer`, one instance, fixed batch (`batch_size_test="none"`): sampler, inner step, outer step every H steps; `adloco_stats`: the same with the norm test's statistics on (`batch_size_test="norm"`, `batch_size_cap` = the batch, so it stays fixed): the last step of every round is split in two halves and hooked |
| `streaming` | `materialised`: `build_lm_datasets` of `builtin:python-source`'s train documents, built before timing (the demo's path); `streamed`: the same documents as 16 JSON-lines shards in C4's schema, read through `pretrain_c4.py --streaming`'s path (`load_document_stream` → `build_lm_stream`, eval documents held out by hash → `PackedStream`), tokenised and packed while training |
| `loader_processes` | AdLoCo with 0 (`map`, `stream`) and with `--loader_processes` DataLoader processes (`map_loader`, `stream_loader`), prefetch 2, on both kinds of data of `builtin:python-docs`, batch 16, torch's own threads (issue 38) |

The variants run alternately in one process (the order rotates every repeat, so slow drifts of a shared machine hit
them alike), each from freshly built weights. Only training steps are timed (`toolkit/step_times.py`): a callback
added after AdLoCo's measures from `on_step_begin` of the first timed step (after the warm-up steps) to `on_step_end`
of the last, which ends a round, so every outer step of the run is inside the window; no saving, no evaluation;
tokens = steps × batch × block. A second callback, registered before AdLoCo's, splits each step into the step itself
and AdLoCo's end-of-round work (outer step, round bookkeeping).

Reported (`results.json`, and a table):
- `trainer`: `throughput_ratio`: tokens/s of `adloco` / tokens/s of `trainer`, paired per repeat: median and
  spread; `throughput_ratio_with_stats` the same for `adloco_stats`; `stats_step_extra_seconds`: (statistics step −
  ordinary step) with statistics on, minus the same difference with them off, from per-step medians pooled over the
  repeats. It can be negative: on a CPU, two half-batch passes can be cheaper than one full pass (smaller logits stay
  in cache); `stats_overhead[H]`: that extra time (0 when negative) per round / the round's time, for H = 50 and 200;
  `outer_step_seconds` and `outer_overhead[H]`: AdLoCo's end-of-round work per round, and its share of a round;
- `streaming`: `throughput_ratio` streamed / materialised, paired per repeat, against the criterion (issue 16): ≥
  0.95; `stream_tokens_per_second`: the stream's own throughput (blocks drawn from a `PackedPart` with no training),
  which bounds its cost. The stream tokenises `--tokenize_documents` documents whenever its carry holds less than a
  block (4 source files, ~20 k tokens), so several refills fall inside a timed window and their cost is measured;
- `loader_processes`: per kind of data, tokens/s `without` and `with` the loader processes and their `ratio` per
  repeat (median, min, max, every value), timed from the second round on (the loader processes' start stays out);
  `results.png` draws each repeat's pair;
- `step_profile` (optional, `--step_profile 1 2 4 8 16`): seconds of one forward/backward of b sequences per
  micro-batch size b, of one optimizer step (gradient clipping, AdamW, zero_grad) and of an outer step's local work,
  measured in a bare loop (no Trainer) by `--step_profile_processes` concurrent processes (the median over them), so
  that 4 workers sharing 2 cores can be measured under the same contention. `device_profile --step_profile` makes
  it the virtual clock's device profile.

    python -m recipes.benchmarks.overhead --quick          # from the repository root; < 5 minutes on 2 CPU cores
    python -m recipes.benchmarks.overhead                  # more repeats and rounds
    python -m recipes.benchmarks.overhead --device cuda --preset microllama --fp16
    python -m recipes.benchmarks.overhead --compare streaming --quick      # a few minutes on 2 CPU cores
    python -m recipes.benchmarks.overhead --compare loader_processes --repeats 6
    # only the step profile, 4 processes on the cores as convergence's 4 workers (seconds):
    python -m recipes.benchmarks.overhead --step_profile 1 2 4 8 16 --step_profile_processes 4 --step_profile_only

Outputs in `--output_dir` (default `outputs/benchmarks/overhead`, or `outputs/benchmarks/<comparison>` for the
others): `results.json` and `table.md` (and `results.png`).

The modules: `variants.py` (one timed run of a variant), `pairs.py` (the variants alternated, paired, reported),
`trainer.py`, `streaming.py` and `loader_processes.py` (each comparison's variants, summary and report), `stream.py`
(the streamed data), `step_profile.py` (the device profile), `cli.py`.
"""

from recipes.benchmarks.toolkit.paths import offline


offline()  # before anything imports huggingface_hub (which reads it once)

from recipes.benchmarks.overhead.cli import main, parse_args  # noqa: E402
from recipes.benchmarks.overhead.step_profile import measure_step_profile  # noqa: E402
from recipes.benchmarks.overhead.stream import stream_throughput, write_shards  # noqa: E402
from recipes.benchmarks.overhead.trainer import VARIANTS, format_report, summarize  # noqa: E402
from recipes.benchmarks.overhead.variants import Variant, run_variant  # noqa: E402


__all__ = [
    "VARIANTS",
    "Variant",
    "format_report",
    "main",
    "measure_step_profile",
    "parse_args",
    "run_variant",
    "stream_throughput",
    "summarize",
    "write_shards",
]
