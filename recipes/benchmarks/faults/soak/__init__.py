"""Fault soak: 4 workers under `accelerate launch --max_restarts`, a random worker SIGKILLed every few minutes.

The workers run the benchmark worker's fault run (`recipes/benchmarks/toolkit/worker/fault_run.py`: a tiny Llama
with attention dropout 0.1, 2 instances that merge, growing batches, per-worker learning rates, fresh data
throughout) and resume with `train(resume_from_checkpoint="auto")`: the newest intact checkpoint, else a fresh
start. This driver, outside the workers as a real preemption would be, kills a random worker with SIGKILL about every
`--kill_every` seconds of training; the launcher restarts all 4 and the run goes on by itself. An uninterrupted run of
the same config runs first, for the comparison. Prints one table and writes `fault_soak.json` and `fault_soak.png`
(step against wall time of both runs, the kills marked).

    python -m recipes.benchmarks.faults soak                   # ~15 min of training, a kill every ~3 min (~40 min)
    python -m recipes.benchmarks.faults soak --minutes 1 --kill_every 20 --kills 2 --output_dir outputs/fault_soak_smoke

Per kill: the step the killed attempt had reached (the furthest worker), the step the next attempt resumed from, the
steps redone (their difference: at most one checkpoint interval), and the seconds from the kill to the first step
completed after the restart. The summary adds the restarts, whether the run finished by itself, and the final
merged model against the uninterrupted run's (max difference, target ≤ 1e-6) with the rounds file on the keys a
resumed run must reproduce.

The modules: `config.py` (the run's config and size), `soak.py` (a launch watched from outside, the kills; the
workers' progress files through `faults/progress.py`), `report.py` (each kill measured, the summary, the plot), `cli.py`.
"""

from recipes.benchmarks.faults.progress import Progress, thin_timeline
from recipes.benchmarks.faults.soak.cli import main, parse_args
from recipes.benchmarks.faults.soak.config import run_config, steps_for
from recipes.benchmarks.faults.soak.report import measure_kills


__all__ = ["Progress", "main", "measure_kills", "parse_args", "run_config", "steps_for", "thin_timeline"]
