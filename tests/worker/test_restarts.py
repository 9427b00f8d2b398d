"""A killed worker costs one checkpoint interval, not a person: real launches with `--max_restarts`, workers killed
with SIGKILL at chosen points of chosen attempts (`recipes/benchmarks/toolkit/worker/kills.py`), each attempt
resuming with `train(resume_from_checkpoint="auto")`, and the run ending by itself with the uninterrupted run's merged
model.

Both elastic launchers our users reach for: `accelerate launch --max_restarts` (static rendezvous) and `torchrun
--rdzv-backend c10d --max-restarts`. Both keep one store for every attempt (`adloco_hf/config/restart.py`): without
the attempt's own namespace the first restart fails in gloo's connectFullMesh, dialling the dead attempt's workers.
"""

import json
import os
import sys

import pytest
from helpers import (
    RESUME_CONFIG,
    SCRIPTS,
    assert_no_worker_killed_by_launcher,
    comparable_rounds,
    free_port,
    merged_params,
    run_launch,
    worker_spec,
)

from adloco_hf.testing import launch_command
from recipes.benchmarks.faults.progress import Progress


pytestmark = pytest.mark.multiprocess

WORKER = os.path.join(SCRIPTS, "adloco_worker.py")


def run_with_restarts(tmp_path, kills: list, command, *, config: dict | None = None, **extra):
    """Launch the resume tests' config on 2 workers with `kills`; the launch must end by itself (exit 0). Returns the
    output folder, each attempt's start and last step (`attempts[a][rank]`, from the workers' progress files) and the
    launch's output."""
    out, probe = str(tmp_path / "out"), tmp_path / "probe"
    spec = worker_spec(out, probe, 2, {**RESUME_CONFIG, **(config or {})}, dropout=0.1, probes=False, kills=kills,
                       resume="auto", progress=True, **extra)  # fmt: skip
    result = run_launch(command(json.dumps(spec)), timeout=400, check=False)
    output = result.stdout + result.stderr
    assert result.returncode == 0, f"the run did not finish by itself (exit {result.returncode}):\n{output[-6000:]}"
    assert_no_worker_killed_by_launcher(output)
    progress = Progress(str(probe), world_size=2)
    progress.read()
    attempts = [
        [
            {
                "started_at_step": start,
                "last_step": max((s for s, _ in progress.steps.get(a, {}).get(r, [])), default=start),
            }
            for r, start in sorted(progress.starts[a].items())
        ]
        for a in sorted(progress.starts)
    ]
    reports = [json.load(open(probe / f"report-rank{r}.json")) for r in range(2)]
    assert [r["world_size"] for r in reports] == [2, 2], reports
    return out, attempts, output


def check_same_run(out, reference) -> None:
    assert comparable_rounds(out) == comparable_rounds(reference)
    assert (merged_params(out) - merged_params(reference)).abs().max().item() <= 1e-6


def test_accelerate_launch_restarts_after_three_kills_and_ends_with_the_uninterrupted_model(
    tmp_path, resume_reference
):
    # Mid-round (resumes from checkpoint-10), in the middle of writing checkpoint-20 (which is then not a checkpoint:
    # checkpoint-10 again) and in the final merge (after checkpoint-30: only the end is redone).
    kills = [[0, 1, "step", 13], [1, 0, "save", 20], [2, 1, "final_merge", 0]]
    command = lambda spec: launch_command(WORKER, spec, num_processes=2, max_restarts=3)  # noqa: E731
    out, attempts, output = run_with_restarts(tmp_path, kills, command)
    assert len(attempts) == 4, attempts  # three restarts, each after one kill
    assert [a[0]["started_at_step"] for a in attempts] == [0, 10, 10, 30]
    assert [a[1]["started_at_step"] for a in attempts] == [0, 10, 10, 30]
    # The killed worker got no further than where it was killed (the survivors' steps are their own business).
    assert attempts[0][1]["last_step"] == 13 and attempts[1][0]["last_step"] == 20
    assert not os.path.exists(os.path.join(out, "checkpoint-20", "half-written-rank0"))
    check_same_run(out, resume_reference)


def test_torchrun_c10d_restarts_and_the_survivor_of_a_kill_mid_round_leaves_at_once(tmp_path, resume_reference):
    # With no grace for the round's end, the survivor of a kill mid-round is asked to stop (the launcher's SIGTERM)
    # and would wait for a stop step the dead worker never posts, then train on to the round's end: its pulse tells
    # it the worker is dead, and it leaves at once. The survivor waits after step 12 for the SIGTERM, so that it is
    # inside the round when it comes, however fast the machine. Then kills at a round's end and in a merge (step 20's).
    kills = [[0, 1, "step", 12], [1, 0, "round_end", 15], [2, 1, "merge", 20]]
    port = free_port()

    def command(spec):
        return [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--max-restarts", "3",
                "--monitor-interval", "1", "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}", WORKER,
                spec]  # fmt: skip

    out, attempts, output = run_with_restarts(tmp_path, kills, command, config={"preemption_grace_seconds": 0},
                                          hold_for_signal=[0, 0, 12])  # fmt: skip
    assert len(attempts) == 4, attempts
    # The merge of step 20 comes before checkpoint-20 is written: that kill too resumes from checkpoint-10.
    assert [a[0]["started_at_step"] for a in attempts] == [0, 10, 10, 10]
    assert "worker rank(s) 1 are gone (their pulse stopped" in output
    # The survivor stopped where the SIGTERM found it (after step 12 or 13), short of the round's end (step 15),
    # and before the launcher's 30 s (no survivor was SIGKILLed: `run_with_restarts`).
    assert 12 <= attempts[0][0]["last_step"] < 15, attempts[0]
    check_same_run(out, resume_reference)
