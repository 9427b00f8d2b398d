"""The benchmark worker (`toolkit/worker/`): its round log, its clocks and round marks, and its curve points (the
merged model's where an evaluation has one); no launch."""

import json
import math
from types import SimpleNamespace

import pytest

from recipes.benchmarks import links
from recipes.benchmarks.toolkit.methods import METHODS
from recipes.benchmarks.toolkit.options import parse_run_args
from recipes.benchmarks.toolkit.settings import method_spec, shared_settings
from recipes.benchmarks.toolkit.worker import arguments, callbacks, result, trainers


def test_the_round_log_keeps_the_slowest_instances_timings(tmp_path):
    def line(step, instance, comm_seconds, merge_seconds=0.0):
        return {"outer_step": step, "instance": instance, "global_step": 25 * step, "total_tokens": 1000 * step,
                "num_instances": 2, "workers": [2 * instance, 2 * instance + 1], "batch_size": 4, "samples": 200,
                "accumulation_steps": 1, "comm_bytes": 100, "comm_seconds": comm_seconds, "outer_seconds":
                comm_seconds + 0.01, "merge_seconds": merge_seconds, "merged_from": [1] if merge_seconds else []}  # fmt: skip

    lines = [line(1, 0, 0.5), line(1, 1, 0.75), line(2, 0, 0.25, merge_seconds=2.0), line(2, 1, 0.125)]
    (tmp_path / "adloco_rounds.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    rounds = result.adloco_rounds(str(tmp_path))
    assert [r["comm_seconds"] for r in rounds] == [0.75, 0.25]  # the round's slowest instance
    assert [r["outer_seconds"] for r in rounds] == pytest.approx([0.76, 0.26])
    assert [r["merge_seconds"] for r in rounds] == [0.0, 2.0] and [r["merged"] for r in rounds] == [False, True]
    assert [r["comm_bytes"] for r in rounds] == [200, 200] and rounds[1]["global_step"] == 50


def test_the_step_clock_and_the_round_marks(monkeypatch):
    now = [100.0]
    monkeypatch.setattr(callbacks.time, "perf_counter", lambda: now[0])
    trainer = SimpleNamespace(
        adloco_state=SimpleNamespace(last_round_step=0), bench_start_time=100.0, bench_eval_seconds=0.0
    )
    clock = callbacks.StepClock()
    marks = callbacks.RoundMarks(trainer, clock)
    for step in range(1, 5):  # rounds of 2 steps: each step 1.5 s, then 0.5 s outside it (the round's end ...)
        state = SimpleNamespace(global_step=step)
        clock.on_step_begin(None, state, None)
        now[0] += 1.5
        clock.on_step_end(None, state, None)
        if step % 2 == 0:
            trainer.adloco_state.last_round_step = step
        marks.on_step_end(None, state, None)
        now[0] += 0.5
        if step == 2:
            trainer.bench_eval_seconds += 3.0  # an evaluation after round 1's end
            now[0] += 3.0
    assert clock.steps == 4 and clock.seconds == pytest.approx(6.0)
    assert marks.marks == [[2, pytest.approx(3.5), 0.0, pytest.approx(3.0)], [4, pytest.approx(10.5), 3.0, 6.0]]
    # What links makes of them: one round after the first, 4 s of wall (10.5 - 3.5 - 3 s of evaluation), 3 s of it
    # in inner steps.
    steady = links.steady_rounds([marks.marks])
    assert steady["wall_seconds_per_round"] == pytest.approx(4.0)
    assert steady["compute_seconds_per_round"] == pytest.approx(3.0)


def test_the_curve_follows_the_merged_model_and_keeps_the_instances_mean(monkeypatch, tmp_path):
    class Evaluated:
        def evaluate(self, eval_dataset=None, ignore_keys=None, metric_key_prefix="eval"):
            return dict(self.metrics)

    class Bench(trainers.BenchmarkMixin, Evaluated):
        state = SimpleNamespace(global_step=10)

    monkeypatch.setattr(trainers, "socket_bytes_sent", lambda: None)
    bench = Bench()
    bench.bench_setup(tokens_so_far=lambda: 100, bytes_so_far=lambda: 5, rounds_so_far=lambda: 1)
    several = {"eval_loss": 2.0, "eval_instance_0_loss": 1.5, "eval_instance_1_loss": 2.5}
    for metrics in (several, {**several, "eval_merged_loss": 3.0}, {"eval_loss": 1.0}):
        bench.metrics = metrics
        bench.evaluate()
    points = bench.bench_points
    assert [p["curve_source"] for p in points] == ["instances_mean", "merged", "model"]
    assert [p["eval_ppl"] for p in points] == [pytest.approx(math.exp(v)) for v in (2.0, 3.0, 1.0)]
    assert [p["instances_mean_ppl"] for p in points] == [pytest.approx(math.exp(v)) for v in (2.0, 2.0, 1.0)]
    assert result.curve_kind(["merged", "model"]) == "merged"
    assert result.curve_kind(["instances_mean", "model"]) == "instances_mean"
    assert result.curve_kind(["model"]) == "model"

    # Every multi-instance method evaluates its merged model; one instance has nothing to merge.
    settings = shared_settings(parse_run_args(["--quick"]))
    for name, method in METHODS.items():
        if method["kind"] == "ddp":
            continue
        spec = method_spec(name, settings, str(tmp_path), matched_batch_size=6)
        assert spec["adloco"]["eval_merged_model"] is (spec["adloco"]["num_instances"] > 1), name
        spec["backend"] = None  # built in this process: no process group to form
        assert arguments.make_arguments(spec).eval_merged_model is spec["adloco"]["eval_merged_model"]
