"""`links` (`recipes/benchmarks/links/`): curves and targets, the counters' window and peak rates, the records, the
checks and the report (fast); and one tiny launch over two rate-limited namespaces (root only)."""

import math
import os
import subprocess

import pytest

from recipes.benchmarks import links
from recipes.benchmarks.toolkit.testbeds import testbed


def test_two_workers_of_two_processes_settings_and_records():
    args, conv = links.parse_args(["--quick", "--workers", "2", "--processes_per_worker", "2", "--methods", "diloco"])
    assert args.processes_per_worker == 2
    result = {"world_size": 4, "parameters": 1000, "comm_bytes": 8000, "wall_seconds": 1.0, "tokens": 10,
              "final_eval_ppl": 5.0, "evals": []}  # fmt: skip
    counters = [{"tx": 0, "rx": 0}, {"tx": 0, "rx": 0}]
    run = links.run_record(
        result, method="diloco", bandwidth="100mbit", rate_bits=10**8, burst=65536, latency_ms=50, folder="/nonexistent",
        initial_ppl=None, before=counters, after=[{"tx": 9000, "rx": 9000}, {"tx": 4000, "rx": 4000}],
        training=None, exit_codes=[0, 0], launch_seconds=1.0, processes_per_worker=2,
    )  # fmt: skip
    assert (run["world_size"], run["workers"], run["processes_per_worker"]) == (4, 2, 2)
    assert run["broadcast_bytes_model"] == 1 * 4 * 1000  # one copy of the weights crosses between the 2 machines
    assert run["model_bytes"] == 8000  # AdLoCo's comm_bytes already count only what goes between workers
    ddp = links.run_record(
        result, method="ddp", bandwidth="100mbit", rate_bits=10**8, burst=65536, latency_ms=50, folder="/nonexistent",
        initial_ppl=None, before=counters, after=counters, training=None, exit_codes=[0, 0], launch_seconds=1.0,
        processes_per_worker=2,
    )  # fmt: skip
    assert ddp["model_bytes"] == 4000  # DDP's ring over 4 processes crosses the 2 machines' links on 2 of 4 hops


def test_first_crossing_interpolates_log_perplexity_in_seconds_and_tokens():
    curve = [[0.0, 0, 1000.0], [10.0, 100, 100.0], [20.0, 200, 10.0]]
    hit = links.first_crossing(curve, math.sqrt(1000 * 100))  # halfway in log between the first two points
    assert hit["seconds"] == pytest.approx(5.0) and hit["tokens"] == pytest.approx(50.0)
    assert links.first_crossing(curve, 100.0) == {"seconds": 10.0, "tokens": 100.0}
    assert links.first_crossing(curve, 5000.0) == {"seconds": 0.0, "tokens": 0.0}
    assert links.first_crossing(curve, 9.0) is None
    # The first crossing counts, even if the curve goes up again later.
    assert links.first_crossing([[0, 0, 50.0], [1, 10, 20.0], [2, 20, 60.0], [3, 30, 20.0]], 20.0)["seconds"] == 1


def test_targets_are_reached_by_every_run():
    a = [[0, 0, 4000.0], [5, 100, 800.0], [10, 200, 300.0], [15, 300, 200.0]]
    b = [[0, 0, 4000.0], [50, 100, 900.0], [100, 200, 400.0], [150, 300, 250.0]]
    bandwidths = {"100mbit": {"ddp": {"curve": a}, "diloco": {"curve": b}, "adloco": {"error": "exit 1"}}}
    targets = links.add_targets(bandwidths)
    assert len(targets) == 3 and targets == sorted(targets, reverse=True) and targets[-1] >= 250.0
    for run in (bandwidths["100mbit"]["ddp"], bandwidths["100mbit"]["diloco"]):
        assert all(run["to_target"][f"{t:g}"] is not None for t in targets)
    assert links.add_targets({}) == []


def test_window_bytes_interpolates_the_timeline():
    timeline = [[0.0, [0, 0], [0, 0]], [1.0, [100, 200], [50, 60]], [2.0, [300, 200], [150, 60]]]
    assert links.window_bytes(timeline, 0.5, 1.5) == [{"tx": 150, "rx": 75}, {"tx": 100, "rx": 30}]
    assert links.window_bytes(timeline, 0.0, 2.0) == [{"tx": 300, "rx": 150}, {"tx": 200, "rx": 60}]
    assert links.window_bytes(timeline, -1.0, 1.0) is None
    assert links.window_bytes(timeline[:1], 0.0, 0.0) is None


def test_peak_rates_are_the_fastest_sample_inside_the_training_window():
    # Worker 0 sends 100 B in [0, 1] and 600 B in [1, 1.5]; worker 1 sends 300 B in [0.5, 1] only. The sample
    # [1.5, 3] lies partly outside the window [0, 2]: left out.
    timeline = [
        [0.0, [0, 0], [0, 0]],
        [0.5, [50, 0], [0, 0]],
        [1.0, [100, 300], [0, 0]],
        [1.5, [700, 300], [0, 0]],
        [3.0, [10_000, 300], [0, 0]],
    ]
    assert links.peak_rates(timeline, 0.0, 2.0) == [1200.0, 600.0]
    assert links.peak_rates(timeline, 0.0, 3.0) == pytest.approx([9300 / 1.5, 600.0])
    assert links.peak_rates(timeline, 0.2, 0.4) is None


def fake_result(method, world=4, wall=10.0, tokens=1000, comm=1_000_000, ppl=(800.0, 300.0), parameters=1000):
    return {
        "method": method,
        "world_size": world,
        "wall_seconds": wall,
        "tokens": tokens,
        "comm_bytes": comm,
        "parameters": parameters,
        "final_eval_ppl": ppl[-1],
        "comm_rounds": 2,
        "steps": 20,
        "rounds": 2,
        "evals": [
            {"seconds": wall * (i + 1) / len(ppl), "tokens": tokens * (i + 1) // len(ppl), "eval_ppl": p}
            for i, p in enumerate(ppl)
        ],
        "train_started_at": 100.0,
        "train_ended_at": 100.0 + wall,
    }


def test_results_layout_checks_and_report(tmp_path):
    world = 4
    before = [{"tx": 10, "rx": 10}] * world
    bandwidths = {}
    # (method, wall, comm_bytes, parameters, bytes each worker sends in training, bytes each sends outside training)
    cases = (
        ("ddp", 30.0, 8_000_000, 1000, 2_000_000, 100_000),  # (8.0 M + 12 k) / 8.0 M: holds, diagnostics too
        ("diloco", 10.0, 400_000, 10_000, 130_000, 50_000),  # 520 k / (400 k + 120 k) = 1.0; 1.3 without broadcast
        ("adloco", 15.0, 400_000, 10_000, 200_000, 0),  # 800 k / 520 k: MISSED
    )
    for method, wall, comm, parameters, sent, extra in cases:
        after = [{"tx": 10 + sent + extra, "rx": 10 + sent + extra}] * world
        # Nothing is sent before training (100.0), `sent` during it, `extra` after it.
        timeline = [
            [99.0, [0] * world, [0] * world],
            [100.0, [0] * world, [0] * world],
            [100.0 + wall, [sent] * world, [sent] * world],
            [200.0, [sent + extra] * world, [sent + extra] * world],
        ]
        training = links.window_bytes(timeline, 100.0, 100.0 + wall)
        run = links.run_record(
            fake_result(method, wall=wall, comm=comm, parameters=parameters),
            method=method,
            bandwidth="100mbit",
            rate_bits=100_000_000,
            burst=65536,
            latency_ms=50,
            folder=str(tmp_path / method),
            initial_ppl=4000.0,
            before=before,
            after=after,
            training=training,
            exit_codes=[0] * world,
            launch_seconds=wall + 5,
        )
        bandwidths.setdefault("100mbit", {})[method] = run
    ddp, diloco = bandwidths["100mbit"]["ddp"], bandwidths["100mbit"]["diloco"]
    for key in ("wall_seconds", "link_bytes", "model_bytes", "tokens", "final_eval_ppl", "curve", "to_target"):
        assert key in ddp, key
    for key in ("world_size", "bandwidth_bits_per_second", "tbf", "folder", "timings"):
        assert key in ddp, key
    assert ddp["curve"][0] == [0.0, 0, 4000.0] and [len(p) for p in ddp["curve"]] == [3, 3, 3]
    assert ddp["link_bytes"] == 4 * 2_100_000 and ddp["link_bytes_per_worker"][0] == {"tx": 2_100_000, "rx": 2_100_000}
    assert ddp["link_bytes_training"] == 4 * 2_000_000
    assert ddp["link_vs_model"] == pytest.approx(4 * 2_100_000 / 8_000_000)
    # The start broadcast: (M - 1) x 4 bytes x parameters, from first principles.
    assert ddp["broadcast_bytes_model"] == 3 * 4 * 1000 and diloco["broadcast_bytes_model"] == 3 * 4 * 10_000
    assert diloco["model_bytes_with_broadcast"] == 520_000
    assert diloco["link_training_vs_model_with_broadcast"] == pytest.approx(1.0)
    assert diloco["link_training_vs_model"] == pytest.approx(1.3)
    assert ddp["model_comm_seconds"] == pytest.approx(8_000_000 / 4 * 8 / 1e8)
    assert ddp["tbf"] == {
        "rate_bits_per_second": 100_000_000,
        "burst_bytes": 65536,
        "latency_ms": 50,
        "both_ways": True,
    }
    targets = links.add_targets(bandwidths)
    assert targets and all(
        hit is not None for run in bandwidths["100mbit"].values() for hit in run["to_target"].values()
    )
    checks = links.check_links(bandwidths)
    by_method = {c["method"]: c for c in checks}
    # One criterion: training-window link bytes against the model including the start broadcast.
    assert by_method["ddp"]["holds"] is True and by_method["ddp"]["ratio"] == pytest.approx(8e6 / 8_012_000)
    assert by_method["diloco"]["holds"] is True  # although 1.3x comm_bytes alone: a diagnostic, not checked
    assert by_method["diloco"]["diagnostics"]["link_training_vs_model"] == pytest.approx(1.3)
    assert by_method["adloco"]["holds"] is False
    assert "start broadcast" in by_method["ddp"]["criterion"] and "15%" in by_method["ddp"]["criterion"]
    results = {"bandwidths": bandwidths, "targets": targets, "checks": checks}
    report = links.format_report(results)
    assert "100mbit |    ddp |" in report and "ddp/diloco wall 3.00x" in report
    assert "rendezvous" in report and "headers" in report and "diagnostics only" in report
    check_lines = [line for line in report.splitlines() if line.startswith("check ")]
    assert len(check_lines) == 3
    assert all(line.count("holds") + line.count("MISSED") == 1 for line in check_lines)
    assert "MISSED" in check_lines[2] and "diagnostics, not checked" in check_lines[1]
    assert "training-window link bytes / (model bytes + start broadcast) = 1.000" in check_lines[1]


MARKS = [
    [[25, 10.0, 0.0, 8.0], [50, 25.0, 3.0, 18.0], [75, 38.0, 3.0, 28.0], [100, 55.0, 6.0, 38.0]],
    [[25, 10.5, 0.0, 9.0], [50, 25.5, 3.0, 20.0], [75, 38.5, 3.0, 31.0], [100, 56.5, 6.1, 42.0]],
]


ROUND_LOG = [{"global_step": 25 * k, "comm_seconds": c} for k, c in ((1, 9.0), (2, 2.0), (3, 3.0), (4, 4.0))]


def test_steady_rounds_leave_out_the_first_round_and_the_evaluations():
    steady = links.steady_rounds(MARKS)
    # Rounds 2 to 4: rank 0 ((55 - 10) - 6) / 3 = 13.0 s, rank 1 ((56.5 - 10.5) - 6.1) / 3 = 13.3 s: the slowest.
    assert steady["rounds"] == 3 and (steady["after_step"], steady["to_step"]) == (25, 100)
    assert steady["wall_seconds_per_round"] == pytest.approx(13.3)
    assert steady["compute_seconds_per_round"] == pytest.approx(11.0)  # rank 1: (42 - 9) / 3
    assert links.steady_rounds(None) is None and links.steady_rounds([None, []]) is None
    assert links.steady_rounds([[[25, 1.0, 0.0, 1.0]]]) is None  # one round: no interval


def test_per_round_figures_of_an_adloco_run_and_of_ddp():
    result = {"rounds": 4, "steps": 100, "comm_bytes": 4_000_000, "wall_seconds": 60.0}
    figures = links.per_round(
        {**result, "round_marks_per_rank": MARKS, "round_log": ROUND_LOG}, link_bytes_training=5_200_000,
        broadcast=1_200_000,
    )  # fmt: skip
    assert figures["rounds"] == 4 and figures["steady_rounds"] == 3
    assert figures["link_bytes_per_round"] == pytest.approx(1_000_000)  # the start broadcast taken out
    assert figures["model_bytes_per_round"] == pytest.approx(1_000_000)
    assert figures["wall_seconds_per_round"] == pytest.approx(15.0)  # the whole window: 60 s / 4
    assert figures["steady_wall_seconds_per_round"] == pytest.approx(13.3)
    assert figures["compute_seconds_per_round"] == pytest.approx(11.0)
    assert figures["steady_vs_compute"] == pytest.approx(13.3 / 11.0)
    assert figures["blocked_seconds_per_round"] == pytest.approx(3.0)  # rounds 2-4: (2 + 3 + 4) / 3
    # An older rounds file without comm_seconds, no marks, no link counts: unknown, not 0.
    old_log = [{"global_step": r["global_step"]} for r in ROUND_LOG]
    stale = links.per_round({**result, "round_marks_per_rank": MARKS, "round_log": old_log}, None, None)
    assert stale["blocked_seconds_per_round"] is None and stale["compute_seconds_per_round"] == pytest.approx(11.0)
    bare = links.per_round(result, None, None)
    assert bare["link_bytes_per_round"] is None and bare["compute_seconds_per_round"] is None
    assert bare["steady_wall_seconds_per_round"] is None and bare["wall_seconds_per_round"] == pytest.approx(15.0)
    # DDP: one all-reduce per step, no rounds file: per step, and no compute-only time.
    ddp = links.per_round(
        {"rounds": None, "steps": 200, "comm_bytes": 2e9, "wall_seconds": 100.0}, 2_000_012_000, 12_000
    )
    assert ddp["rounds"] == 200 and ddp["link_bytes_per_round"] == pytest.approx(1e7)
    assert ddp["wall_seconds_per_round"] == pytest.approx(0.5) and ddp["compute_seconds_per_round"] is None
    assert ddp["blocked_seconds_per_round"] is None and ddp["steady_vs_compute"] is None


def test_time_to_diloco_ppl_and_variants_against_their_base():
    def run(curve, link, steady):
        return {"curve": curve, "final_eval_ppl": curve[-1][2], "wall_seconds": curve[-1][0],
                "link_bytes_per_round": link, "steady_wall_seconds_per_round": steady}  # fmt: skip

    bandwidths = {
        "10mbit": {
            "ddp": {"error": "exit 1"},
            "diloco": run([[0.0, 0, 4000.0], [20.0, 100, 400.0], [40.0, 200, 200.0]], 8e6, 4.0),
            "diloco_int4": run([[0.0, 0, 4000.0], [10.0, 100, 300.0], [20.0, 200, 150.0]], 2e6, 2.0),
            "diloco_overlap": run([[0.0, 0, 4000.0], [10.0, 100, 500.0], [20.0, 200, 250.0]], 8e6, 2.5),
            "adloco_int8": run([[0.0, 0, 4000.0], [30.0, 100, 190.0]], 4e6, 3.0),  # its base did not run
        },
        "100mbit": {"diloco_int8": run([[0.0, 0, 4000.0], [5.0, 100, 150.0]], 4e6, 1.0)},  # no diloco here
    }
    links.add_reference_figures(bandwidths)
    runs = bandwidths["10mbit"]
    assert runs["diloco"]["to_diloco_final_ppl"] == {"ppl": 200.0, "seconds": 40.0, "tokens": 200.0}
    hit = runs["diloco_int4"]["to_diloco_final_ppl"]
    t = math.log(1.5) / math.log(2.0)  # log(300 / 200) / log(300 / 150): where log-perplexity crosses 200
    assert hit["seconds"] == pytest.approx(10.0 + 10.0 * t) and hit["tokens"] == pytest.approx(100 + 100 * t)
    assert runs["diloco_overlap"]["to_diloco_final_ppl"] is None  # never reaches 200
    int4 = runs["diloco_int4"]
    assert int4["base"] == "diloco" and int4["link_bytes_per_round_vs_base"] == pytest.approx(0.25)
    assert int4["steady_seconds_per_round_vs_base"] == pytest.approx(0.5)
    assert int4["wall_seconds_vs_base"] == pytest.approx(0.5) and int4["final_ppl_vs_base"] == pytest.approx(0.75)
    assert runs["diloco_overlap"]["steady_seconds_per_round_vs_base"] == pytest.approx(0.625)
    assert "base" not in runs["adloco_int8"] and "base" not in runs["diloco"]
    assert runs["adloco_int8"]["to_diloco_final_ppl"]["seconds"] < 30.0
    assert bandwidths["100mbit"]["diloco_int8"]["to_diloco_final_ppl"] is None
    assert "base" not in bandwidths["100mbit"]["diloco_int8"]


def test_the_report_has_a_per_round_table(tmp_path):
    world, bandwidths = 4, {"10mbit": {}}
    before = [{"tx": 0, "rx": 0}] * world
    # (method, comm_bytes, bytes each worker sends in training, final ppl): 1000 parameters, broadcast 12,000 B.
    for method, comm, sent, ppl in (("diloco", 400_000, 103_000, 300.0), ("diloco_int8", 200_000, 53_000, 290.0)):
        result = fake_result(method, comm=comm, ppl=(800.0, ppl))
        result.update(rounds=4, round_marks_per_rank=MARKS, round_log=ROUND_LOG)
        timeline = [[100.0, [0] * world, [0] * world], [110.0, [sent] * world, [sent] * world]]
        bandwidths["10mbit"][method] = links.run_record(
            result, method=method, bandwidth="10mbit", rate_bits=10_000_000, burst=65536, latency_ms=50,
            folder=str(tmp_path / method), initial_ppl=4000.0, before=before, after=[{"tx": sent, "rx": sent}] * world,
            training=links.window_bytes(timeline, 100.0, 110.0), exit_codes=[0] * world, launch_seconds=15.0,
            peaks=links.peak_rates(timeline, 100.0, 110.0),
        )  # fmt: skip
    diloco, int8 = bandwidths["10mbit"]["diloco"], bandwidths["10mbit"]["diloco_int8"]
    assert diloco["link_bytes_per_round"] == pytest.approx((4 * 103_000 - 12_000) / 4) == 100_000
    assert int8["link_bytes_per_round"] == pytest.approx(50_000)
    assert diloco["wall_seconds_per_round"] == pytest.approx(2.5) and diloco["compute_seconds_per_round"] == 11.0
    links.add_reference_figures(bandwidths)
    assert int8["link_bytes_per_round_vs_base"] == pytest.approx(0.5)
    assert diloco["peak_link_bits_per_second"] == 8 * 103_000 / 10  # one sample of 10 s
    assert int8["peak_link_rate_vs_base"] == pytest.approx(53 / 103)
    report = links.format_report({"bandwidths": bandwidths, "targets": [], "checks": []})
    header = next(line for line in report.splitlines() if "link B/round" in line)
    assert "compute s/round" in header and "steady/compute" in header and "s to diloco ppl" in header
    assert "blocked vs base" in header and "peak Mbit/s" in header and "peak vs base" in header
    rows = [line for line in report.splitlines() if "| diloco_int8 |" in line]
    assert len(rows) == 2  # the main table's row and the per-round table's
    assert "0.500 (diloco)" in rows[1] and "0.967 (diloco)" in rows[1] and "49 KiB" in rows[1]
    assert "compute-only" in report


def test_the_variants_are_selectable_and_bandwidths_is_an_alias():
    names = ["diloco", "diloco_int8", "diloco_int4", "diloco_overlap", "diloco_overlap_int4"]
    args, conv = links.parse_args(["--quick", "--bandwidths", "10mbit", "--methods", *names])
    assert args.methods == names and args.bandwidth == ["10mbit"]
    assert conv.budget_tokens == links.BUDGET_TOKENS and conv.quick
    args, _ = links.parse_args(["--bandwidth", "10mbit", "100mbit", "--methods", "adloco", "adloco_overlap"])
    assert args.bandwidth == ["10mbit", "100mbit"] and args.methods == ["adloco", "adloco_overlap"]
    assert links.parse_args([])[0].methods == list(links.DEFAULT_METHODS)


def test_a_machine_without_namespaces_is_skipped_without_changing_directory(monkeypatch, capsys, tmp_path):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    monkeypatch.chdir(tmp_path)
    assert "root" in testbed.unavailable_reason()
    assert links.main(["--quick", "--prefix", "adlkx", "--output_dir", "out"]) == {
        "skipped": testbed.unavailable_reason()
    }
    assert capsys.readouterr().out.startswith("skipped: ")
    assert os.getcwd() == str(tmp_path) and not (tmp_path / "out").exists()


def test_a_matched_method_needs_its_reference():
    with pytest.raises(SystemExit):
        links.parse_args(["--methods", "ddp", "diloco_matched"])
    args, _ = links.parse_args(["--methods", "adloco", "diloco_matched", "--quick"])
    assert args.methods == ["adloco", "diloco_matched"] and args.bandwidth == ["100mbit"]


def namespaces_unavailable() -> str | None:
    reason = testbed.unavailable_reason()
    if reason:
        return reason
    probe = "adlkt-probe"
    done = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if done.returncode != 0:
        return f"`ip netns add` failed: {done.stderr.strip()}"
    subprocess.run(["ip", "netns", "delete", probe], capture_output=True)
    return None


@pytest.mark.multiprocess
def test_two_namespaces_form_one_world_over_limited_links_and_leave_nothing_behind(tmp_path):
    reason = namespaces_unavailable()
    if reason:
        pytest.skip(f"network namespaces cannot be created here: {reason}")
    prefix = "adlkt"
    argv = ["--workers", "2", "--bandwidth", "1gbit", "--methods", "diloco", "--prefix", prefix]
    argv += ["--output_dir", str(tmp_path), "--budget_tokens", "10240", "--inner_steps", "5"]
    argv += ["--eval_every_rounds", "1", "--warmup_steps", "2", "--quick"]
    # The small built-in corpus (tokenised in seconds on a fresh clone; the default one takes about a minute).
    argv += ["--set", 'data.corpus="builtin:python-docs"', "--set", "data.eval_blocks=32"]
    argv += ["--cache_dir", str(tmp_path / "cache")]
    results = links.main(argv)
    run = results["bandwidths"]["1gbit"]["diloco"]
    assert "error" not in run, run
    assert run["world_size"] == 2 and run["exit_codes"] == [0, 0]
    assert len(run["link_bytes_per_worker"]) == 2
    for worker in run["link_bytes_per_worker"]:
        assert worker["tx"] > 0 and worker["rx"] > 0
    assert run["model_bytes"] > 0 and run["link_bytes"] >= run["model_bytes"] * 0.5
    assert (tmp_path / "1gbit" / "diloco" / "adloco_rounds.jsonl").exists()
    assert (tmp_path / "results.json").exists() and (tmp_path / "table.md").exists()
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert not [line for line in listed.splitlines() if line.startswith(prefix)], listed
