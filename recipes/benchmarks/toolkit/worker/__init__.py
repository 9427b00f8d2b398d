"""One method of a training benchmark, run on every worker (`runs.WORKER_MODULE`):

    accelerate launch ... --module recipes.benchmarks.toolkit.worker SPEC_JSON

The benchmark (`convergence`, `links`, `gpu_bench`: `runs.run_method` or `machines.launch_machines`) writes SPEC_JSON
and launches this package from the repository root once per method with the same workers, data, model
initialisation, data order and inner optimizer. Every worker records what it saw; global rank 0 writes
`{output_dir}/result.json`, which the benchmark collects. Not meant to be run by hand.

- `ddp`: the plain `transformers.Trainer` with real DDP (gloo) over the same workers, fed by the same
  `AdaptiveBatchSampler` shards as the AdLoCo workers (fixed batch), so every method sees the same samples in the
  same order on every rank for as long as their batch sizes agree.
- everything else: `AdLoCoTrainer` with the spec's `AdLoCoConfig` overrides; training stops at the end of the first
  round at which the cumulative training tokens of all instances reach the budget.

With `budget_seconds` in the spec (the GPU benchmark's time to target, `gpu_bench`) training also stops at the end
of the first round (DDP: the first multiple of `inner_steps` steps) after that many seconds of training, evaluations
excluded; the workers agree on it with one all-reduce of a flag per round. `bf16`, `optim` and `torch_compile` in the
spec set those `TrainingArguments` fields (default: off, `adamw_torch`, off).

The modules: `trainers.py` (the Trainer and AdLoCoTrainer, each timing and recording its evaluations), `callbacks.py`
(the budgets that stop training, the inner steps' clock, the round marks), `arguments.py` (the spec's
`TrainingArguments` or `AdLoCoConfig`), `result.py` (every worker's figures into `result.json`), `__main__.py` (one
worker's run).
"""
