"""A compact merge's model against today's float32 merge: eval perplexity of the same merges (issue 25, part 2).

Four copies of the benchmark model (`convergence`'s preset, data and inner optimizer: the toolkit's settings) start
from the same weights, as AdLoCo's instances do (`instance_init="shared"`), and each trains on its own shard of fresh
tokens. Then AdLoCo's merges of four instances: 0 with 1 (equal demands), 2 with 3 (demands 3 : 1), then the two
survivors (3 : 2); every merge is computed twice from the same inputs:

- float32 (`merge_payload="float32"`): w_s φ_s + w_m φ_m in float32, as the all-reduce computes it;
- compact (`merge_payload="compact"`, `adloco_hf/instances/payload.py`): each member's w_i / n_i × φ_i rounded to
  bfloat16 and summed in bfloat16 member by member (each partial sum rounded, as a ring's hops round them: the
  worst case of the bf16 all-reduce), for n = 4 members (2 workers per instance) and n = 2.

The second-level merge takes each side's own first-level result (the compact chain compounds its rounding). Reported
per seed and merge: the eval perplexity (first 512 held-out blocks) of both, and their ratio; the criterion is
|compact / float32 − 1| ≤ 0.5 %.

    python -m recipes.benchmarks.merge_precision                    # 2 seeds, 300 steps per instance
    python -m recipes.benchmarks.merge_precision --seeds 3 --steps 600

Outputs in `--output_dir` (default `outputs/benchmarks/merge_precision`): `results.json` and `table.md`.

The modules: `merges.py` (the two merges of the same inputs), `cli.py` (training the instances, the report).
"""

from recipes.benchmarks.merge_precision.cli import main, parse_args
from recipes.benchmarks.merge_precision.merges import compact_merge, float32_merge


__all__ = ["compact_merge", "float32_merge", "main", "parse_args"]
