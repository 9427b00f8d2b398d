"""The benchmark worker, run on every worker process (`runs.WORKER_MODULE`): one method of a training benchmark, or
one run of a fault benchmark (a spec of kind "faults").

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

A spec of kind "faults" (`faults process`, `soak`, `network`: `recipes/benchmarks/faults/worker.py` writes it)
trains a tiny Llama with AdLoCo and breaks it where the spec says (`fault_run.py`): a worker killed, hung, poisoned
with NaN, out of disk or preempted at a chosen step, SIGKILLs at chosen points of chosen launch attempts, and every
step and round phase recorded for the benchmark watching from outside.

The modules: `trainers.py` (the Trainer and AdLoCoTrainer, each timing and recording its evaluations), `callbacks.py`
(the budgets that stop training, the inner steps' clock, the round marks), `arguments.py` (the spec's
`TrainingArguments` or `AdLoCoConfig`), `result.py` (every worker's figures into `result.json`), `fault_run.py` (a
fault benchmark's run), `faults.py` and `kills.py` (its faults and records, which the test suite's worker arms too),
`__main__.py` (one worker's run, by the spec's kind).
"""

__all__ = ["FAULTS"]

FAULTS = "faults"  # the kind of a fault benchmark's spec (`fault_run.py`); every other kind names a training method
