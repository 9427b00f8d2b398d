"""What the benchmarks share: small public modules, each one idea. A benchmark imports them; they import no benchmark
(`tests/test_layout.py` checks both), and they reach the library only through its public API and
`adloco_hf.inspection`.

Results and numbers (pure Python):
- `paths`: the repository root, `docs/results/`, the offline environment;
- `results`: Markdown tables, atomic JSON, the printed report and its `table.md`; `figures`: a PNG written;
- `stats`: ratios, a robust spread, eval curves interpolated and first reached, targets every run reaches;
- `traffic`: the ring all-reduce and start-broadcast byte models, and the bytes a process's sockets sent.

Training runs of the compared methods (`convergence`, `links`, `gpu_bench`):
- `methods`: DDP, DiLoCo, AdLoCo and their variants; `settings`: the shared settings and one launch's spec;
  `options`: their command line; `runs`: the data built once, one method's launch and its result;
- `worker/`: what every launched worker runs (`python -m recipes.benchmarks.toolkit.worker SPEC_JSON`);
- `data`: a spec's corpus, tokenizer, packed blocks, model and eval perplexity;
- `step_times`: timestamps of every inner step around AdLoCo's own callback (one process, no launch);
- `clock/`: the virtual clock's parts: `link_model` (links, device profiles, the time of a ring all-reduce and of small
  control collectives), `virtual_clock` (the library's `Clock` priced by a device profile and links, the worker's
  `--clock virtual`), `device_profiles` (the profiles kept under `docs/results/device_profiles/`, with their source).

Testbeds (root), `testbeds/`: `testbed`, one network namespace per worker, links rate-limited by `tc tbf`;
`machines`, a run's machines on it; `link_faults`, a link cut, stalled or slowed while a run trains; `cgroups`, a
slow worker, in a cgroup with a CPU quota.

Comparing runs: `resumed_runs`, what a resumed run must reproduce of an uninterrupted one; `rank_files`: the
workers' per-rank JSON-lines files (progress, phases), read as they grow.
"""
