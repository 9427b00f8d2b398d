"""Training throughput from a stream against the materialised dataset, on the demo model.

One worker, one process, the same model (`tiny`, block 128), tokenizer (the 4096-token BPE of the demo), documents,
fixed batch and inner optimizer for both variants:

| variant | what it is |
|---|---|
| `materialised` | `build_lm_datasets` of `builtin:python-source`'s train documents, built before timing (the demo's path) |
| `streamed` | the same documents as 16 JSON-lines shards in C4's schema, read through `pretrain_c4.py --streaming`'s path: `load_document_stream` → `build_lm_stream` (eval documents held out by hash) → `PackedStream`, tokenised and packed while training |

Each worker reads its own part of a stream and tokenises it itself, so one worker measures what the stream costs a
worker. The variants alternate (the order rotates every repeat) and each is timed as in `overhead`
(`toolkit/step_times.py`): from `on_step_begin` of the first step after the warm-up to `on_step_end` of the last
(AdLoCo's end-of-round work included), tokens = steps × batch × block. The streamed variant tokenises
`--tokenize_documents` documents whenever its carry holds less than a block (4 source files, ~20 k tokens); a timed
window holds 95 (quick) or 195 steps of 1024 tokens, so several refills fall inside it and their cost is measured, not
left to the warm-up. Also reported: the stream's own throughput (blocks drawn from a `PackedPart` with no training,
tokens/s), which bounds its cost.

    python -m recipes.benchmarks.streaming --quick    # from the repository root; a few minutes on 2 CPU cores
    python -m recipes.benchmarks.streaming

Outputs in `--output_dir` (default `outputs/benchmarks/streaming`): `results.json` and `table.md`. Criterion (issue
16): the median paired ratio streamed / materialised ≥ 0.95.

The modules: `shards.py` (the corpus as C4 shards, the stream's own throughput), `variants.py` (one timed run, the
pairs, the report), `cli.py`.
"""

from recipes.benchmarks.toolkit.paths import offline


offline()  # before anything imports huggingface_hub (which reads it once)

from recipes.benchmarks.streaming.cli import main, parse_args  # noqa: E402
from recipes.benchmarks.streaming.shards import stream_throughput, write_shards  # noqa: E402
from recipes.benchmarks.streaming.variants import format_report, run_variant, summarize  # noqa: E402


__all__ = ["format_report", "main", "parse_args", "run_variant", "stream_throughput", "summarize", "write_shards"]
