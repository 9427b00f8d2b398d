"""Network faults (issue 42): links that drop, stall, slow down or split, under the elastic launcher.

Four machines on the links testbed (`toolkit/testbeds/testbed.py`: a network namespace each, joined by a bridge, every link
`tc tbf`-limited both ways), each its own elastic launcher with `--max_restarts` and the benchmark worker's fault run
(`recipes/benchmarks/toolkit/worker/fault_run.py`, `train(resume_from_checkpoint="auto")`), as the soak family runs
it. The benchmark cuts, flaps, slows and splits the links from outside (`toolkit/testbeds/link_faults.py`), at points of the
run it reads from the workers' progress and phase files, and restores every link on every exit path. Per scenario:
what the user saw, the seconds from the fault to the lost worker being named and to the first step after it, the
steps trained again, and the final merged model against the same run's without the fault.

    python -m recipes.benchmarks.faults network --doc docs/faults.md     # every scenario (root: namespaces), the page
    python -m recipes.benchmarks.faults network --scenarios down_in_allreduce,down_then_back
    python -m recipes.benchmarks.faults network --report_only            # the table of the scenarios run so far

The runs set `worker_timeout` (`--worker_timeout`, 30 s) and `ddp_timeout` to the same value: the library's defaults
(1800 s) would name a dead link after half an hour (docs/faults.md#timeouts). Results: `docs/results/netfaults.json`
and `netfaults.png` (`--results_dir`); each run's files stay in `--output_dir`.

Without root (or without `ip`/`tc`) it prints "skipped: <why>" and exits 0. The modules: `scenarios.py` (what each
does, pure), `launch.py` (the machines' launches and their logs), `phases.py` (the workers' phase files),
`driver.py` (a scenario carried out), `measure.py` (its figures, pure), `report.py` (the table, the targets, the
plot), `cli.py`.
"""

from recipes.benchmarks.faults.network.cli import main, parse_args
from recipes.benchmarks.faults.network.measure import detection, fault_window, first_step_after, summary, work_lost
from recipes.benchmarks.faults.network.report import (
    DOC_BEGIN,
    DOC_END,
    check_targets,
    doc_section,
    format_report,
    write_doc,
)
from recipes.benchmarks.faults.network.scenarios import SCENARIO_NAMES, Action, Scenario, When, flapping, scenarios


__all__ = [
    "DOC_BEGIN",
    "DOC_END",
    "SCENARIO_NAMES",
    "Action",
    "Scenario",
    "When",
    "check_targets",
    "detection",
    "doc_section",
    "fault_window",
    "first_step_after",
    "flapping",
    "format_report",
    "main",
    "parse_args",
    "scenarios",
    "summary",
    "work_lost",
    "write_doc",
]
