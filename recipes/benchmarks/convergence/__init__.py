"""Convergence per token and per byte: DDP, DiLoCo, AdLoCo and AdLoCo's ablations under one token budget.

Every method trains the same model from the same initial weights on the same workers, data shards and data order
(as long as the batch sizes agree), with the same inner AdamW and learning rate, and stops once its cumulative
training tokens reach the budget. Each method is one `accelerate launch` of the benchmark worker
(`recipes.benchmarks.toolkit.worker`; the methods and their shared settings are the toolkit's `methods.py` and
`settings.py`).

| method | what it is |
|---|---|
| `ddp` | plain `transformers.Trainer`, real DDP (gloo) over the same workers, global batch = DiLoCo's initial one |
| `diloco` | `AdLoCoTrainer`, 1 instance, fixed batch (`batch_size_test="none"`), Nesterov outer step (lr 0.5, momentum 0.5: the best of a sweep for this run length, see the benchmarks README) |
| `adloco` | 4 instances that merge every `merge_every` rounds, norm-test adaptive batches, switch mode (γ = 2) |
| `adloco_no_adaptive` | `adloco` with a fixed batch (`batch_size_test="none"`) |
| `adloco_no_merge` | `adloco` without merges (`merge_every=0`): 4 instances to the end, merged once at the end |
| `adloco_no_switch` | `adloco` without switch mode's accumulation (`switch_threshold=1e9`): a request above `max_batch_size` is capped there, so the batch never grows past what one forward/backward holds |
| `adloco_paper_outer` | `adloco` with the outer SGD of the paper's table (lr 0.5, no momentum) |
| `adloco_sqrt_lr` | `adloco` with `lr_batch_scaling="sqrt"`: the inner learning rate follows the batch (not in the paper) |
| `diloco_int8`, `diloco_int4` | `diloco` with `pseudo_grad_compression="int8"` / `"int4"` (blocks of `compression_block_size` values with one scale, error feedback) |
| `diloco_overlap` | `diloco` with `outer_overlap=True`: the round's all-reduce runs during the next round's inner steps |
| `diloco_overlap_int4` | `diloco` with both `outer_overlap=True` and `pseudo_grad_compression="int4"` |
| `adloco_int8`, `adloco_int4`, `adloco_overlap` | `adloco` with the same single change |
| `adloco_adam_noise` | `adloco` with `noise_preconditioner="adam"`: the norm test reads the statistics in Adam's metric |
| `diloco_slow1`, `adloco_slow1` | `diloco` / `adloco` with one of the workers (the last rank) in a cgroup with a CPU quota of a quarter of a core (`toolkit/testbeds/cgroups.py`): equal batches wait for it every round |
| `diloco_balanced`, `adloco_balanced` | the same slow worker with `worker_batch_split="speed"`: each worker's share of the instance's batch follows its measured speed |
| `diloco_streaming`, `diloco_streaming_int4`, `adloco_streaming`, `adloco_streaming_int4` | `diloco` / `adloco` as Streaming DiLoCo (`STREAMING`: 5 fragments, each all-reduce overlapped with H // 5 inner steps, α = 0.5), with bf16 or int4 pseudo-gradients |
| `diloco_b4`, `diloco_b8`, `diloco_b16` | `diloco` at that fixed per-worker batch, learning rate × √(b / 4) (issue 25) |
| `adloco_goodput`, `diloco_goodput` | `adloco` / `diloco` with the goodput rule (`batch_size_target="goodput"`), `lr_batch_scaling="sqrt"`, compact merges, `max_batch_size` 16; 1.5 × the token budget |
| `adloco_norm` | `adloco_goodput` with the norm test's request (`batch_size_target="test"`) instead of the rule: what the rule itself adds |

Without `--methods` the first nine run; the compression, overlap and slow-worker variants run only when named. A
slow worker needs root and a cgroup `cpu` controller (v1 `cpu.cfs_quota_us` or v2 `cpu.max`); without them its
methods are skipped with the reason. Each balanced method is compared with its equal-batch twin on the same slow
worker (`wall_per_round_vs_<twin>`, paired by seed) and with the method without a slow worker (`ppl_vs_<base>`). Each variant is
also compared with the method it changes (`variant_of`: `ppl_vs_adloco`, `bytes_vs_adloco`, ... and one report line).

Measured per method: the eval perplexity curve against training tokens (every `eval_every_rounds` rounds; while
several instances train, the model the final merge would produce then: the AdLoCo methods run with
`eval_merged_model=True`, and `curve_kind` says what a curve follows; the demand-weighted mean of the instances'
losses, the library's own `eval_loss`, which no single model achieves, is kept as `curve_instances_mean`, and the
best instance's curve as `curve_best_instance`) and the final model's perplexity (AdLoCo: the merged model after
the final merge),
the communication rounds, the bytes communicated (modelled: 2 (M − 1) × payload per all-reduce, DDP's fp32 gradients
every step, AdLoCo's pseudo-gradients and merge transfers from its logs; and measured: `bytes_sent` of every worker's
TCP sockets from `ss -tinpH` before and after training, evaluations excluded) and the training wall time
(evaluations excluded).

    # From the repository root. The table of docs/results.md (4 CPU workers, tiny Llama, built-in corpus):
    python -m recipes.benchmarks.convergence
    # A quicker set (< 12 minutes on 2 CPU cores):
    python -m recipes.benchmarks.convergence --quick
    # A subset, and a tuning override:
    python -m recipes.benchmarks.convergence --quick --methods ddp diloco adloco --learning_rate 2e-3
    # The pseudo-gradient's compression and the overlapped all-reduce against bf16 DiLoCo:
    python -m recipes.benchmarks.convergence --quick --methods diloco diloco_int8 diloco_int4 diloco_overlap \\
        diloco_overlap_int4 --output_dir outputs/benchmarks/convergence-compression
    # One of 4 workers at a quarter of a core (sudo: a cgroup with a CPU quota), equal batches against a split by speed:
    sudo .venv/bin/python -m recipes.benchmarks.convergence --quick --methods diloco diloco_slow1 diloco_balanced \
        --output_dir outputs/benchmarks/slow-workers
    # The same seconds for every method (evaluations excluded; each stops at the end of the first round after them),
    # the token budget a ceiling:
    python -m recipes.benchmarks.convergence --methods diloco_b4 adloco_norm adloco_goodput --budget_seconds 120 \
        --budget_tokens 2048000 --inner_steps 5
    # GPU: MicroLlama's architecture, 4 workers sharing one GPU over gloo (NCCL-free), fp16:
    python -m recipes.benchmarks.convergence --device cuda --preset microllama --fp16

Outputs in `--output_dir` (default `outputs/benchmarks/convergence`): `results.json`
(`{"methods": {name: {"final_eval_ppl", "tokens", "comm_rounds", "comm_bytes", "wall_seconds", "curve", ...}}}`),
`table.md`, `convergence.png`, and one folder per method with its spec, launch log and AdLoCo run files.

The modules: `seeds.py` (a method over its seeds: means, curves), `comparison.py` (perplexity at equal tokens, the
ratios paired by seed, tokens to target, the targets), `report.py` (the tables, `summary.json`), `figure.py` (the
plot), `cli.py`.
"""

from recipes.benchmarks.convergence.cli import main, parse_args
from recipes.benchmarks.convergence.comparison import check_targets, compare, reach, to_target, verdict
from recipes.benchmarks.convergence.figure import plot
from recipes.benchmarks.convergence.report import format_report, summary
from recipes.benchmarks.convergence.seeds import aggregate, mean_curve, mean_curve_by_index, mean_sd


__all__ = [
    "aggregate",
    "check_targets",
    "compare",
    "format_report",
    "main",
    "mean_curve",
    "mean_curve_by_index",
    "mean_sd",
    "parse_args",
    "plot",
    "reach",
    "summary",
    "to_target",
    "verdict",
]
