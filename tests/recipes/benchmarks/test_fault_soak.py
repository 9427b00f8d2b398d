"""`faults soak` (`recipes/benchmarks/faults/soak/`): its reading of the workers' progress files (in `make test`),
and one soak end to end at a tiny size (`make test-slow`: 4 real workers under `accelerate launch --max_restarts`, 2 SIGKILLs from
outside, and the uninterrupted run; 60-180 s on 2 cores, four launches of which three are restarts)."""

import json
import os

import pytest

from recipes.benchmarks.faults import soak as fault_soak


def write_progress(probe, rank: int, lines: list) -> None:
    with open(os.path.join(probe, f"progress-rank{rank}.jsonl"), "a", encoding="utf-8") as f:
        for line in lines:
            f.write(line if isinstance(line, str) else json.dumps(line) + "\n")


def test_progress_is_read_as_it_grows_and_each_kill_is_measured(tmp_path):
    write_progress(tmp_path, 0, [{"attempt": 0, "started_at_step": 0, "pid": 1, "time": 100.0}])
    write_progress(tmp_path, 0, [{"attempt": 0, "step": s, "time": 100.0 + s} for s in (1, 2, 3)])
    write_progress(tmp_path, 1, [{"attempt": 0, "started_at_step": 0, "pid": 2, "time": 100.0}])
    write_progress(tmp_path, 1, [{"attempt": 0, "step": s, "time": 100.5 + s} for s in (1, 2, 3, 4)])
    write_progress(tmp_path, 1, ['{"attempt": 1, "started_at'])  # a line still being written: left for later
    progress = fault_soak.Progress(str(tmp_path), 4)
    progress.read()
    assert progress.attempt() == 0 and progress.reached(0) == 4 and progress.first_step_time(0) == 101.0
    write_progress(tmp_path, 1, ['_step": 2, "pid": 4, "time": 120.0}\n'])  # ...and finished
    write_progress(tmp_path, 0, [{"attempt": 1, "started_at_step": 2, "pid": 3, "time": 120.0}])
    write_progress(tmp_path, 0, [{"attempt": 1, "step": 3, "time": 125.0}])
    write_progress(tmp_path, 1, [{"attempt": 1, "step": 3, "time": 124.0}])
    progress.read()
    assert progress.starts == {0: {0: 0, 1: 0}, 1: {0: 2, 1: 2}}
    assert progress.attempt() == 1 and progress.first_step_time(1) == 124.0
    [row] = fault_soak.measure_kills([{"kill": 1, "time": 105.0, "rank": 1, "pid": 2, "attempt": 0}], progress)
    assert row["reached_step"] == 4 and row["resumed_from"] == 2 and row["steps_redone"] == 2
    assert row["seconds_to_first_step"] == 19.0
    # The run's progress: the furthest worker of each attempt, back to the step resumed from after the restart.
    assert [s for _, s in progress.timeline()] == [1, 2, 3, 4, 3]


def test_the_soak_refuses_bad_sizes():
    config = fault_soak.run_config(fault_soak.steps_for(15, 50), 50)
    assert config["max_steps"] % 50 == 0 and config["merge_every"] * config["inner_steps"] * 2 <= config["max_steps"]
    for bad in (["--save_steps", "15"], ["--max_steps", "70", "--save_steps", "20"], ["--kills", "-1"]):
        with pytest.raises(SystemExit):
            fault_soak.parse_args(bad)


@pytest.mark.slow  # about 3 minutes on 2 cores; `make test` keeps tests/worker/test_restarts.py (kills, restarts,
# the uninterrupted model) and the soak's own measurements above (progress, kills, timeline)
def test_the_soak_kills_two_workers_and_the_run_ends_with_the_uninterrupted_model(tmp_path):
    # Each kill comes 0.2-0.6 s (plus the driver's 0.25 s look) after its attempt's first step: a few steps on this
    # machine, well inside the 60 on one several times faster, so that both kills land before the run can finish.
    save_steps = 20
    out = tmp_path / "soak"
    argv = [
        "--max_steps",
        "60",
        "--save_steps",
        str(save_steps),
        "--kill_every",
        "0.4",
        "--kills",
        "2",
        "--restart_timeout",
        "120",
    ]
    fault_soak.main([*argv, "--output_dir", str(out)])
    result = json.loads((out / "fault_soak.json").read_text())
    summary = result["summary"]
    assert result["world_size"] == 4 and result["config"]["save_steps"] == save_steps
    assert summary["kills"] == 2 and summary["finished_by_itself"]
    assert summary["restarts"] == summary["kills"]  # each kill cost one restart, none failed
    assert summary["merged_max_difference"] <= 1e-6 and summary["rounds_equal"]
    for kill in result["kills"]:
        # Work lost per kill: at most one checkpoint interval. Before the first checkpoint the next attempt starts
        # from 0, and the killed one cannot have passed step `save_steps` (its round's end waits for the dead one).
        assert kill["resumed_from"] % save_steps == 0
        assert 0 <= kill["steps_redone"] <= save_steps, kill
        assert kill["seconds_to_first_step"] > 0
    assert (out / "fault_soak.png").stat().st_size > 0


def test_the_results_timeline_keeps_a_point_a_second_every_restart_and_the_end():
    points = [(100.0 + 0.1 * i, i) for i in range(1, 40)] + [(104.5, 20), (104.6, 21), (104.7, 22)]
    thinned = fault_soak.thin_timeline(points, started=100.0)
    assert thinned[0] == [0.1, 1] and thinned[-1] == [4.7, 22]
    assert [4.5, 20] in thinned  # the fall back after a restart
    forward = [(a, b) for a, b in zip(thinned[:-2], thinned[1:-1], strict=True) if b[1] > a[1]]  # not the last
    assert forward and all(b[0] - a[0] >= 0.999 for a, b in forward)
    assert len(thinned) < len(points) / 5
