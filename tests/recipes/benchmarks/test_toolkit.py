"""The toolkit's pure parts (`recipes/benchmarks/toolkit/`): socket byte counts, the byte models, curves and
ratios, tables and JSON, the shared settings' merge; and that no benchmark edits sys.path or patches the library."""

import json
import math
import os
import shutil
import socket

import pytest
from helpers import REPO

from recipes.benchmarks.toolkit import results, settings, stats, traffic
from recipes.benchmarks.toolkit.clock import link_model


BENCHMARKS = os.path.join(REPO, "recipes", "benchmarks")

# Captured from `ss -tinpH` during a 4-worker gloo run (trimmed), plus three edge cases: a socket shared by two
# processes, a socket that has sent nothing (no bytes_sent field) and a socket without a `users:` field.
SS_SAMPLE = """\
ESTAB 0      0               127.0.0.1:43789          127.0.0.1:49812 users:(("python3",pid=10587,fd=16))
\t bbr wscale:10,10 rto:208 rtt:6.88/11.867 ato:40 mss:32768 pmtu:65535 rcvmss:536 advmss:65483 cwnd:23 bytes_sent:1036 bytes_acked:1036 bytes_received:1044 segs_out:35 segs_in:40 data_segs_out:21
ESTAB 0      0               127.0.0.1:43560          127.0.0.1:44613 users:(("python3",pid=10588,fd=22))
\t bbr wscale:10,10 rto:204 rtt:0.082/0.046 ato:40 mss:65483 cwnd:18 ssthresh:8 bytes_sent:2591112 bytes_acked:2591113 bytes_received:2591104 segs_out:86
ESTAB 0      0               127.0.0.1:42484          127.0.0.1:36245 users:(("python3",pid=10588,fd=8))
\t bbr wscale:10,10 rto:204 rtt:0.348/0.609 ato:40 mss:65483 cwnd:12 bytes_sent:10383062 bytes_acked:10383063 bytes_received:5194640
ESTAB 0      0               127.0.0.1:44587          127.0.0.1:55178 users:(("python",pid=10795,fd=16))
\t bbr wscale:10,10 rto:204 rtt:0.013/0.006 ato:40 mss:32768 cwnd:10 bytes_received:8 segs_out:1 segs_in:3 data_segs_in:1
ESTAB 0      0               127.0.0.1:51000          127.0.0.1:52000 users:(("python",pid=20001,fd=5),("python",pid=20002,fd=5))
\t cubic wscale:7,7 rto:204 rtt:0.01/0.005 bytes_sent:500 bytes_acked:501
ESTAB 0      0               127.0.0.1:51001          127.0.0.1:52001
\t cubic wscale:7,7 rto:204 rtt:0.01/0.005 bytes_sent:777 bytes_acked:778
"""


def test_parse_ss_bytes_sent_sums_per_process():
    totals = traffic.parse_ss_bytes_sent(SS_SAMPLE)
    assert totals[10587] == 1036
    assert totals[10588] == 2591112 + 10383062  # two sockets of one process
    assert totals[10795] == 0  # open but has sent nothing
    assert totals[20001] == totals[20002] == 500  # shared socket counts for both owners
    assert sum(totals.values()) == 1036 + 2591112 + 10383062 + 500 + 500  # the owner-less socket is ignored


def test_parse_ss_bytes_sent_ignores_blank_and_empty_output():
    assert traffic.parse_ss_bytes_sent("") == {}
    assert traffic.parse_ss_bytes_sent("\n\n") == {}


def test_socket_bytes_sent_of_this_process_counts_what_it_sends():
    if shutil.which("ss") is None:  # the documented answer without `ss`
        assert traffic.socket_bytes_sent() is None
        pytest.skip("`ss` is not installed")
    payload = b"x" * 200_000
    with socket.create_server(("127.0.0.1", 0)) as server:
        with socket.create_connection(server.getsockname()) as sender:
            receiver, _ = server.accept()
            with receiver:
                before = traffic.socket_bytes_sent()
                sender.sendall(payload)
                received = 0
                while received < len(payload):  # every byte has left the sender's socket (and been acknowledged)
                    received += len(receiver.recv(1 << 16))
                after = traffic.socket_bytes_sent()
    # This process owns both ends: what the sender sent is counted (the receiver's acknowledgements carry no data).
    assert isinstance(before, int) and isinstance(after, int)
    assert after - before >= len(payload)


def test_ring_all_reduce_bytes_matches_the_library():
    from adloco_hf.outer.step import ring_all_reduce_bytes  # where the library keeps it, not its inspection surface

    for workers in (1, 2, 4, 8):
        assert traffic.ring_all_reduce_bytes(1000, workers) == ring_all_reduce_bytes(1000, workers)
    assert traffic.ring_all_reduce_bytes(1000, 4) == 6000
    assert traffic.ring_all_reduce_bytes(1000, 1) == 0


def test_interpolate_curve_is_exact_at_points_and_log_linear_between():
    curve = [[0, 1000.0], [100, 100.0], [200, 50.0]]
    assert stats.interpolate_curve(curve, 0) == pytest.approx(1000.0)
    assert stats.interpolate_curve(curve, 100) == pytest.approx(100.0)
    assert stats.interpolate_curve(curve, 50) == pytest.approx(math.sqrt(1000.0 * 100.0))  # geometric mean
    assert stats.interpolate_curve(curve, 150) == pytest.approx(math.exp((math.log(100) + math.log(50)) / 2))
    assert stats.interpolate_curve(curve, 201) is None
    assert stats.interpolate_curve(curve, -1) is None
    assert stats.interpolate_curve([], 5) is None


def test_interpolate_curve_sorts_and_skips_bad_points():
    curve = [[200, 50.0], [0, 1000.0], [100, float("nan")], [100, 100.0], [150, None]]
    assert stats.interpolate_curve(curve, 100) == pytest.approx(100.0)
    assert stats.interpolate_curve(curve, 200) == pytest.approx(50.0)


def test_ratio_handles_missing_and_zero():
    assert stats.ratio(3.0, 2.0) == 1.5
    assert stats.ratio(None, 2.0) is None
    assert stats.ratio(2.0, None) is None
    assert stats.ratio(2.0, 0) is None
    assert stats.ratio(2.0, float("inf")) is None


def test_median_spread():
    spread = stats.median_spread([1.0, 0.9, 1.1, 1.0, 5.0])
    assert spread["median"] == 1.0
    assert spread["min"] == 0.9 and spread["max"] == 5.0
    assert spread["n"] == 5
    assert spread["iqr_half_rel"] == pytest.approx((1.1 - 1.0) / 2)  # quartiles 1.0 and 1.1: the outlier is ignored
    assert stats.median_spread([2.0])["median"] == 2.0
    with pytest.raises(ValueError):
        stats.median_spread([])


def test_table_aligns_and_marks_missing_cells():
    text = results.table([{"a": 1.23456, "b": "x"}, {"a": 12345.0}], ["a", "b"])
    lines = text.splitlines()
    assert len(lines) == 4
    assert len({len(line) for line in lines}) == 1
    assert "1.235" in lines[2] and "12,345" in lines[3] and lines[3].rstrip("| ").endswith("-")


def test_human_bytes():
    assert results.human_bytes(512) == "512 B"
    assert results.human_bytes(7_769_856) == "7.4 MiB"
    assert results.human_bytes(None) == "-"


def test_write_json_round_trip(tmp_path):
    path = tmp_path / "sub" / "r.json"
    results.write_json(str(path), {"x": [1, 2.5]})
    assert json.loads(path.read_text()) == {"x": [1, 2.5]}
    assert [p.name for p in path.parent.iterdir()] == ["r.json"]  # no temporary file left behind


def test_benchmarks_do_not_edit_sys_path_or_patch_the_library():
    for folder, _, names in sorted(os.walk(BENCHMARKS)):
        for name in (n for n in sorted(names) if n.endswith(".py")):
            source = open(os.path.join(folder, name), encoding="utf-8").read()
            assert "sys.path" not in source, name
            for private in ("._merge", "_save_checkpoint =", "WorkerMonitor.check", ".totals[", "last_synced_step"):
                assert private not in source, (name, private)


def test_read_json_and_the_report_beside_it(tmp_path, capsys):
    assert results.read_json(str(tmp_path / "missing.json")) is None
    results.write_json(str(tmp_path / "r.json"), {"a": 1})
    assert results.read_json(str(tmp_path / "r.json")) == {"a": 1}
    path = results.write_report(str(tmp_path), "| a |\n|---|")
    assert open(path, encoding="utf-8").read() == "| a |\n|---|\n"
    assert capsys.readouterr().out == "| a |\n|---|\n"


def test_targets_are_reached_by_every_run_and_rounded_up():
    # The hardest at the worst run's best perplexity, the others 1.1 and 1.3 times it, two significant digits up.
    assert stats.choose_targets([50.0, 75.0]) == [98.0, 83.0, 75.0]
    assert stats.nice_ceiling(187.3) == 190 and stats.nice_ceiling(9.71) == pytest.approx(9.8)
    assert stats.choose_targets([float("nan")]) == []


def test_deep_merge_copies_and_merges_nested_settings():
    base = {"train": {"batch_size": 4, "inner_steps": 25}, "seed": 42}
    merged = settings.deep_merge(base, {"train": {"inner_steps": 10}, "budget_tokens": 7})
    assert merged == {"train": {"batch_size": 4, "inner_steps": 10}, "seed": 42, "budget_tokens": 7}
    assert base == {"train": {"batch_size": 4, "inner_steps": 25}, "seed": 42}  # not changed in place
    # The GPU profiles are the CUDA settings with each budget: quick merges every round.
    quick, full = settings.PROFILES[("cuda", "quick")], settings.PROFILES[("cuda", "full")]
    assert quick["train"] == full["train"] == settings.CUDA["train"]
    assert quick["adloco"] == {"max_batch_size": 16, "batch_size_cap": 64, "merge_every": 1}
    assert full["adloco"] == {"max_batch_size": 16, "batch_size_cap": 64}


def test_ring_all_reduce_time_by_hand():
    # 1 MB over 4 workers at 1 MB/s, 10 ms latency: 2 (4 − 1) = 6 steps of 10 ms + 250 kB / (1 MB/s).
    link = link_model.Link(bandwidth_bits_per_second=8e6, latency_seconds=0.01)
    assert link_model.ring_all_reduce_seconds(1e6, 4, link) == pytest.approx(6 * (0.01 + 0.25))
    # Two buckets: the latency is paid per bucket, the bytes once.
    assert link_model.ring_all_reduce_seconds(1e6, 4, link, bucket_bytes=5e5) == pytest.approx(12 * 0.01 + 6 * 0.25)
    assert link_model.ring_all_reduce_seconds(1e6, 1, link) == 0.0
    # The payload share of the wire rate slows the bytes, not the latency.
    slow = link_model.Link(8e6, 0.01, efficiency=0.5)
    assert link_model.ring_all_reduce_seconds(1e6, 4, slow) == pytest.approx(6 * (0.01 + 0.5))
    assert link_model.control_seconds(4, link) == pytest.approx(2 * 3 * 0.01)


def test_device_profile_interpolates_between_and_beyond_its_points():
    profile = link_model.DeviceProfile({1: 0.2, 4: 0.5, 8: 0.9}, optimizer_seconds=0.05, step_overhead_seconds=0.01)
    assert profile.forward_backward_seconds(6) == pytest.approx(0.7)
    assert profile.forward_backward_seconds(12) == pytest.approx(1.3)  # linear beyond the last point


def test_reuse_takes_a_copied_run_but_not_a_changed_one(tmp_path, monkeypatch):
    """`--reuse` returns an earlier result whose spec differs only in where the run and the data cache lie (a run
    folder copied beside another study's, a cache spelt another way), and launches again when a setting differs."""
    from recipes.benchmarks.toolkit import runs

    launched = []

    def launch(spec, log_path):
        launched.append(spec["seed"])
        written = {"final_eval_ppl": 50.0, "tokens": 100, "comm_bytes": 10, "measured_bytes_sent": 11}
        results.write_json(os.path.join(spec["output_dir"], "result.json"), written)
        return 0, 1.0

    monkeypatch.setattr(runs, "launch", launch)
    earlier = tmp_path / "study-a" / "seed-1"
    spec = {"seed": 1, "world_size": 4, "train": {"learning_rate": 3e-3}, "output_dir": str(earlier)}
    spec["cache_dir"] = "outputs/cache"
    first = runs.run_method("m", spec, reuse=True)
    assert first["final_eval_ppl"] == 50.0 and launched == [1]
    copied = tmp_path / "study-b" / "seed-1"
    shutil.copytree(earlier, copied)
    moved = {**spec, "output_dir": str(copied), "cache_dir": "/elsewhere/cache"}
    assert runs.run_method("m", moved, reuse=True)["tokens"] == 100 and launched == [1]
    changed = {**moved, "train": {"learning_rate": 1e-3}}
    runs.run_method("m", changed, reuse=True)
    assert launched == [1, 1]
    assert runs.same_run(spec, moved) and not runs.same_run(spec, changed)
