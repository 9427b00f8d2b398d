"""Faults: what each failure does to a real AdLoCo run, and whether the run comes back to the model it would have
made. One benchmark, three families, each its own subpackage, table and files:

- `process/`: a 2-worker run broken in 13 ways (kill -9 of one or every worker, inside a save, SIGTERMs, a changed
  setting, damaged checkpoints, a hung save, a full disk, a NaN worker), resumed where the library says to;
  `faults.json`, `faults.png`.
- `soak/`: 4 workers under `accelerate launch --max_restarts`, a random worker SIGKILLed from outside every few
  minutes, the launcher left to restart them; `fault_soak.json`, `fault_soak.png`.
- `network/`: 4 machines on the links testbed (root), their links cut, flapping, slowed and split under the elastic
  launchers; `netfaults.json`, `netfaults.png` and docs/faults.md's table.

    python -m recipes.benchmarks.faults process --scenarios sigterm_round_end,kill_all
    python -m recipes.benchmarks.faults soak --minutes 1 --kill_every 20 --kills 2 --output_dir outputs/fault_soak_smoke
    sudo .venv/bin/python -m recipes.benchmarks.faults network --doc docs/faults.md

Every family launches the same worker (`worker.py`: the benchmark worker with a spec of kind "faults",
`recipes/benchmarks/toolkit/worker/fault_run.py`, which injects the faults by name) and the soak and network families
watch it through the same progress files (`progress.py`).
"""

from recipes.benchmarks.faults.cli import FAMILIES, main, parse_args


__all__ = ["FAMILIES", "main", "parse_args"]
