"""The benchmarks' own arithmetic (fast), the launcher they share with the tests, and one end-to-end run of each
benchmark (slow).

Benchmarks are not tests of the library: these only check that what they report is computed right. They are the
package `recipes.benchmarks`, run from the repository root as `python -m recipes.benchmarks.<name>`.
"""

import json
import math
import os
import shutil
import socket
import subprocess
import sys
import time

import pytest

from adloco_hf.testing import WorkersFailed, free_port, launch_command, run_workers, tiny_llama, tiny_llama_config
from recipes.benchmarks import _common, convergence, distributed_costs, overhead


REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
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


# ---- _common ----
def test_parse_ss_bytes_sent_sums_per_process():
    totals = _common.parse_ss_bytes_sent(SS_SAMPLE)
    assert totals[10587] == 1036
    assert totals[10588] == 2591112 + 10383062  # two sockets of one process
    assert totals[10795] == 0  # open but has sent nothing
    assert totals[20001] == totals[20002] == 500  # shared socket counts for both owners
    assert sum(totals.values()) == 1036 + 2591112 + 10383062 + 500 + 500  # the owner-less socket is ignored


def test_parse_ss_bytes_sent_ignores_blank_and_empty_output():
    assert _common.parse_ss_bytes_sent("") == {}
    assert _common.parse_ss_bytes_sent("\n\n") == {}


def test_socket_bytes_sent_of_this_process_counts_what_it_sends():
    if shutil.which("ss") is None:  # the documented answer without `ss`
        assert _common.socket_bytes_sent() is None
        pytest.skip("`ss` is not installed")
    payload = b"x" * 200_000
    with socket.create_server(("127.0.0.1", 0)) as server:
        with socket.create_connection(server.getsockname()) as sender:
            receiver, _ = server.accept()
            with receiver:
                before = _common.socket_bytes_sent()
                sender.sendall(payload)
                received = 0
                while received < len(payload):  # every byte has left the sender's socket (and been acknowledged)
                    received += len(receiver.recv(1 << 16))
                after = _common.socket_bytes_sent()
    # This process owns both ends: what the sender sent is counted (the receiver's acknowledgements carry no data).
    assert isinstance(before, int) and isinstance(after, int)
    assert after - before >= len(payload)


def test_ring_all_reduce_bytes_matches_the_library():
    from adloco_hf.outer.step import ring_all_reduce_bytes

    for workers in (1, 2, 4, 8):
        assert _common.ring_all_reduce_bytes(1000, workers) == ring_all_reduce_bytes(1000, workers)
    assert _common.ring_all_reduce_bytes(1000, 4) == 6000
    assert _common.ring_all_reduce_bytes(1000, 1) == 0


def test_interpolate_curve_is_exact_at_points_and_log_linear_between():
    curve = [[0, 1000.0], [100, 100.0], [200, 50.0]]
    assert _common.interpolate_curve(curve, 0) == pytest.approx(1000.0)
    assert _common.interpolate_curve(curve, 100) == pytest.approx(100.0)
    assert _common.interpolate_curve(curve, 50) == pytest.approx(math.sqrt(1000.0 * 100.0))  # geometric mean
    assert _common.interpolate_curve(curve, 150) == pytest.approx(math.exp((math.log(100) + math.log(50)) / 2))
    assert _common.interpolate_curve(curve, 201) is None
    assert _common.interpolate_curve(curve, -1) is None
    assert _common.interpolate_curve([], 5) is None


def test_interpolate_curve_sorts_and_skips_bad_points():
    curve = [[200, 50.0], [0, 1000.0], [100, float("nan")], [100, 100.0], [150, None]]
    assert _common.interpolate_curve(curve, 100) == pytest.approx(100.0)
    assert _common.interpolate_curve(curve, 200) == pytest.approx(50.0)


def test_ratio_handles_missing_and_zero():
    assert _common.ratio(3.0, 2.0) == 1.5
    assert _common.ratio(None, 2.0) is None
    assert _common.ratio(2.0, None) is None
    assert _common.ratio(2.0, 0) is None
    assert _common.ratio(2.0, float("inf")) is None


def test_median_spread():
    spread = _common.median_spread([1.0, 0.9, 1.1, 1.0, 5.0])
    assert spread["median"] == 1.0
    assert spread["min"] == 0.9 and spread["max"] == 5.0
    assert spread["n"] == 5
    assert spread["iqr_half_rel"] == pytest.approx((1.1 - 1.0) / 2)  # quartiles 1.0 and 1.1: the outlier is ignored
    assert _common.median_spread([2.0])["median"] == 2.0
    with pytest.raises(ValueError):
        _common.median_spread([])


def test_table_aligns_and_marks_missing_cells():
    text = _common.table([{"a": 1.23456, "b": "x"}, {"a": 12345.0}], ["a", "b"])
    lines = text.splitlines()
    assert len(lines) == 4
    assert len({len(line) for line in lines}) == 1
    assert "1.235" in lines[2] and "12,345" in lines[3] and lines[3].rstrip("| ").endswith("-")


def test_human_bytes():
    assert _common.human_bytes(512) == "512 B"
    assert _common.human_bytes(7_769_856) == "7.4 MiB"
    assert _common.human_bytes(None) == "-"


def test_write_json_round_trip(tmp_path):
    path = tmp_path / "sub" / "r.json"
    _common.write_json(str(path), {"x": [1, 2.5]})
    assert json.loads(path.read_text()) == {"x": [1, 2.5]}
    assert [p.name for p in path.parent.iterdir()] == ["r.json"]  # no temporary file left behind


# ---- convergence.py ----
def _method(tokens, curve, comm_bytes, measured=None, wall=10.0):
    return {
        "final_eval_ppl": curve[-1][1],
        "tokens": tokens,
        "comm_rounds": 3,
        "comm_bytes": comm_bytes,
        "measured_bytes_sent": measured if measured is not None else comm_bytes,
        "wall_seconds": wall,
        "curve": curve,
        "curve_bytes": [[comm_bytes * t / tokens, p] for t, p in curve],
        "batch_sizes": [[0, 4]],
    }


def test_compare_interpolates_at_the_smallest_final_tokens_and_checks_targets():
    methods = {
        "ddp": _method(1000, [[0, 1000.0], [500, 100.0], [1000, 50.0]], 1_000_000, wall=20.0),
        "diloco": _method(1000, [[0, 1000.0], [500, 200.0], [1000, 80.0]], 20_000),
        # Overshoots the budget: compared at 1000 tokens, between its last two points.
        "adloco": _method(1200, [[0, 1000.0], [600, 150.0], [1200, 40.0]], 12_000),
        "adloco_no_merge": {"error": "exit 1"},
    }
    summary = convergence.compare(methods)
    assert summary["equal_tokens"] == 1000
    adloco = methods["adloco"]
    expected = math.exp(math.log(150.0) + (1000 - 600) / 600 * (math.log(40.0) - math.log(150.0)))
    assert adloco["ppl_at_equal_tokens"] == pytest.approx(expected)
    assert adloco["ppl_vs_ddp"] == pytest.approx(expected / 50.0)
    assert adloco["ppl_vs_diloco"] == pytest.approx(expected / 80.0)
    assert adloco["bytes_vs_diloco"] == pytest.approx(0.6)
    assert adloco["bytes_vs_ddp"] == pytest.approx(0.012)
    assert methods["diloco"]["wall_vs_ddp"] == pytest.approx(0.5)
    targets = summary["targets"]
    assert targets["adloco bytes / diloco bytes"]["holds"] is True
    assert targets["adloco bytes / ddp bytes"]["holds"] is True
    assert targets["adloco ppl / ddp ppl at equal tokens"]["holds"] is (expected / 50.0 <= 1.05)
    report = convergence.format_report({"methods": methods, **summary})
    assert "adloco_no_merge" in report and "exit 1" in report
    assert "holds" in report


def test_compare_without_references_leaves_ratios_empty():
    methods = {"adloco": _method(1000, [[0, 100.0], [1000, 10.0]], 10)}
    summary = convergence.compare(methods)
    assert methods["adloco"]["ppl_vs_ddp"] is None
    assert summary["targets"] == {}
    assert convergence.compare({"x": {"error": "exit 124"}}) == {}


def test_method_specs_share_everything_but_their_own_settings(tmp_path):
    args = convergence.parse_args(["--quick", "--learning_rate", "0.002", "--set", "adloco.eta=0.5"])
    settings = convergence.shared_settings(args)
    specs = {
        name: convergence.method_spec(name, settings, str(tmp_path), matched_batch_size=6)
        for name in convergence.METHODS
        if name != "diloco_matched"
    }
    own = {name for name, m in convergence.METHODS.items() if "batch_size" in m or "budget_factor" in m}
    for name, spec in specs.items():
        assert spec["seed"] == specs["ddp"]["seed"]
        if name in own:  # issue 25's: a batch of their own, or a longer budget (test_the_goodput_methods...)
            continue
        assert spec["train"] == specs["ddp"]["train"]
        assert spec["train"]["learning_rate"] == 0.002
        assert spec["budget_tokens"] == specs["ddp"]["budget_tokens"]
    assert specs["diloco"]["adloco"]["num_instances"] == 1
    assert specs["diloco"]["adloco"]["batch_size_test"] == "none"
    assert specs["adloco"]["adloco"]["num_instances"] == 4
    assert specs["adloco"]["adloco"]["eta"] == 0.5
    assert specs["adloco_no_adaptive"]["adloco"]["batch_size_test"] == "none"
    assert specs["adloco_no_merge"]["adloco"]["merge_every"] == 0
    assert specs["adloco_no_switch"]["adloco"]["switch_threshold"] >= 1e6
    assert specs["adloco_paper_outer"]["adloco"]["outer_lr"] == 0.5
    assert specs["adloco_paper_outer"]["adloco"]["outer_momentum"] == 0.0
    # Each ablation differs from `adloco` in exactly the setting it names.
    for name, changed in [
        ("adloco_no_adaptive", {"batch_size_test"}),
        ("adloco_no_merge", {"merge_every"}),
        ("adloco_no_switch", {"switch_threshold"}),
        ("adloco_paper_outer", {"outer_momentum", "outer_nesterov"}),  # the shared outer lr is already 0.5
        ("adloco_sqrt_lr", {"lr_batch_scaling"}),
    ]:
        diff = {k for k in specs["adloco"]["adloco"] if specs[name]["adloco"][k] != specs["adloco"]["adloco"][k]}
        assert diff == changed, name
    assert specs["adloco_sqrt_lr"]["adloco"]["lr_batch_scaling"] == "sqrt"
    assert specs["adloco"]["adloco"]["lr_batch_scaling"] == "none"  # the paper's AdLoCo
    with pytest.raises(SystemExit):
        convergence.shared_settings(convergence.parse_args(["--set", "adloco.no_such_key=1"]))


def test_a_seconds_budget_reaches_every_methods_spec_and_must_be_positive(tmp_path):
    settings = convergence.shared_settings(convergence.parse_args(["--quick"]))
    assert convergence.method_spec("diloco_b4", settings, str(tmp_path))["budget_seconds"] is None
    args = convergence.parse_args(["--quick", "--budget_seconds", "120", "--budget_tokens", "2048000"])
    settings = convergence.shared_settings(args)
    for name in ("ddp", "diloco_b4", "diloco_b16", "adloco_norm", "adloco_goodput"):
        spec = convergence.method_spec(name, settings, str(tmp_path))
        assert spec["budget_seconds"] == 120.0  # the same seconds for every method; tokens stay a ceiling
        assert spec["budget_tokens"] >= 2048000
    for bad in ("0", "-5"):
        with pytest.raises(SystemExit):
            convergence.parse_args(["--budget_seconds", bad])


def test_the_goodput_methods_and_the_fixed_batches_they_are_compared_with(tmp_path):
    settings = convergence.shared_settings(convergence.parse_args(["--quick", "--learning_rate", "0.002"]))
    specs = {
        name: convergence.method_spec(name, settings, str(tmp_path))
        for name in (
            "diloco", "diloco_b4", "diloco_b8", "diloco_b16", "adloco", "adloco_goodput", "adloco_norm", "diloco_goodput"
        )
    }  # fmt: skip
    for batch in (4, 8, 16):  # DiLoCo at a fixed batch, at the square-root rule's learning rate for it
        spec = specs[f"diloco_b{batch}"]
        assert spec["train"]["batch_size"] == batch
        assert spec["train"]["learning_rate"] == pytest.approx(0.002 * math.sqrt(batch / 4))
        assert spec["adloco"] == {**specs["diloco"]["adloco"], "max_batch_size": 16}
        assert spec["budget_tokens"] == settings["budget_tokens"]
    goodput = specs["adloco_goodput"]
    changed = {k for k in goodput["adloco"] if goodput["adloco"][k] != specs["adloco"]["adloco"][k]}
    assert changed == {"batch_size_target", "lr_batch_scaling", "merge_payload", "max_batch_size"}
    assert goodput["adloco"]["batch_size_target"] == "goodput" and goodput["adloco"]["merge_payload"] == "compact"
    assert goodput["train"] == specs["diloco"]["train"]  # from the initial batch 4, the shared learning rate
    assert goodput["budget_tokens"] == int(1.5 * settings["budget_tokens"])
    # adloco_norm: adloco_goodput with the norm test's request instead of the rule, nothing else changed.
    norm = specs["adloco_norm"]
    assert {k for k in goodput["adloco"] if goodput["adloco"][k] != norm["adloco"][k]} == {"batch_size_target"}
    assert norm["adloco"]["batch_size_target"] == "test" and norm["adloco"]["batch_size_test"] == "norm"
    assert norm["train"] == goodput["train"] and norm["budget_tokens"] == goodput["budget_tokens"]
    single = specs["diloco_goodput"]["adloco"]
    assert single["num_instances"] == 1 and single["batch_size_test"] == "norm"
    goodput["backend"] = None  # built in this process: no process group to form
    from recipes.benchmarks import _convergence_worker as worker

    args = worker.make_arguments(goodput)
    assert args.batch_size_target == "goodput" and args.batch_size_cap == 64 and args.merge_payload == "compact"


STREAMED = {"num_fragments": 5, "fragment_sync_delay": "max", "fragment_update_alpha": 0.5}
# The compression and overlap variants: (base method, the settings they change).
VARIANTS = {
    "diloco_int8": ("diloco", {"pseudo_grad_compression": "int8"}),
    "diloco_int4": ("diloco", {"pseudo_grad_compression": "int4"}),
    "diloco_overlap": ("diloco", {"outer_overlap": True}),
    "diloco_overlap_int4": ("diloco", {"outer_overlap": True, "pseudo_grad_compression": "int4"}),
    "adloco_int8": ("adloco", {"pseudo_grad_compression": "int8"}),
    "adloco_int4": ("adloco", {"pseudo_grad_compression": "int4"}),
    "adloco_overlap": ("adloco", {"outer_overlap": True}),
    "diloco_overlap_eager": ("diloco", {"outer_overlap": True, "outer_overlap_local_weight": None}),
    # The controller's ablations, against the paper's rules (issue 14).
    "adloco_keep": ("adloco_paper", {"nonpositive_signal": "keep"}),
    "adloco_smooth": ("adloco_paper", {"batch_size_smoothing": 0.5, "nonpositive_signal": "keep"}),
    "adloco_preserve": ("adloco_paper", {"merge_batch_rule": "preserve_total"}),
    "adloco_noise_scale": (
        "adloco_paper",
        {"batch_size_smoothing": 0.5, "nonpositive_signal": "keep", "batch_size_target": "noise_scale"},
    ),
    "adloco_controller": (
        "adloco_paper",
        {"batch_size_smoothing": 0.5, "nonpositive_signal": "keep", "merge_batch_rule": "preserve_total"},
    ),
    "adloco_sqrt_adam": ("adloco_paper", {"lr_batch_scaling": "sqrt_adam"}),
    "adloco_adam_noise": ("adloco", {"noise_preconditioner": "adam"}),
    "adloco_grow_h": (
        "adloco",
        {"inner_steps_rule": "outer_noise", "max_inner_steps_factor": 4, "outer_noise_theta": 0.8},
    ),
    "diloco_grow_h": ("diloco", {"inner_steps_rule": "outer_noise", "max_inner_steps_factor": 4}),
    # One slow worker (a cgroup, outside the AdLoCo settings), with equal batches or a split by speed.
    "diloco_slow1": ("diloco", {}),
    "diloco_balanced": ("diloco", {"worker_batch_split": "speed"}),
    "adloco_slow1": ("adloco", {}),
    "adloco_balanced": ("adloco", {"worker_batch_split": "speed"}),
    # Streaming DiLoCo (issue 29): 5 fragments, the longest delay that keeps one average in flight, α = 0.5.
    "diloco_streaming": ("diloco", STREAMED),
    "diloco_streaming_int4": ("diloco", {**STREAMED, "pseudo_grad_compression": "int4"}),
    "adloco_streaming": ("adloco", STREAMED),
    "adloco_streaming_int4": ("adloco", {**STREAMED, "pseudo_grad_compression": "int4"}),
}


def test_compression_and_overlap_variants_change_only_their_settings_and_make_a_valid_config(tmp_path):
    from adloco_hf import AdLoCoConfig
    from recipes.benchmarks import _convergence_worker as worker

    nine = ("ddp", "diloco", "adloco", "diloco_matched", "adloco_no_adaptive", "adloco_no_merge", "adloco_no_switch",
            "adloco_paper_outer", "adloco_sqrt_lr")  # fmt: skip
    assert convergence.DEFAULT_METHODS == nine
    assert convergence.parse_args([]).methods == list(nine)  # the variants run only when named
    goodput = {"diloco_b4", "diloco_b8", "diloco_b16", "adloco_goodput", "adloco_norm", "diloco_goodput"}  # issue 25's
    assert set(convergence.METHODS) == set(nine) | set(VARIANTS) | {"adloco_paper"} | goodput
    args = convergence.parse_args(["--quick", "--methods", *VARIANTS])
    assert args.methods == list(VARIANTS) and convergence.run_order(args.methods) == list(VARIANTS)
    settings = convergence.shared_settings(args)
    for name, (base, changed) in VARIANTS.items():
        assert name not in nine and convergence.METHODS[name]["variant_of"] == base
        spec = convergence.method_spec(name, settings, str(tmp_path))
        reference = convergence.method_spec(base, settings, str(tmp_path))
        # A variant may name a setting the base leaves at AdLoCoConfig's default (noise_preconditioner).
        assert set(reference["adloco"]) <= set(spec["adloco"]) and spec["train"] == reference["train"]
        diff = {k: v for k, v in spec["adloco"].items() if reference["adloco"].get(k) != v}
        assert diff == changed, name
        spec["backend"] = None  # built in this process: no process group to form
        config = worker.make_arguments(spec)
        assert isinstance(config, AdLoCoConfig)
        assert config.num_instances_asked == (1 if base == "diloco" else 4)  # this one process trains 1 of them
        assert config.pseudo_grad_compression == changed.get("pseudo_grad_compression", "none")
        assert config.outer_overlap is changed.get("outer_overlap", False)
        assert config.compression_block_size == 256
        if "num_fragments" in changed:  # "max": the delay follows inner_steps (25 // 5 in --quick)
            assert (config.num_fragments, config.fragment_sync_delay, config.fragment_update_alpha) == (5, 5, 0.5)
        else:
            assert config.num_fragments is None and config.fragment_sync_delay == 0
        if "max_inner_steps_factor" in changed:  # the cap follows inner_steps; evaluations stay at round ends
            assert config.max_inner_steps == 4 * config.inner_steps
            assert config.eval_steps % config.max_inner_steps == 0
    # The shared block size reaches every method, and AdLoCoConfig refuses a bad one.
    settings = convergence.shared_settings(
        convergence.parse_args(["--quick", "--set", "adloco.compression_block_size=3"])
    )
    spec = convergence.method_spec("diloco_int4", settings, str(tmp_path))
    assert spec["adloco"]["compression_block_size"] == 3
    spec["backend"] = None
    with pytest.raises(ValueError, match="compression_block_size"):
        worker.make_arguments(spec)


def test_a_variant_is_compared_with_its_base_method_too():
    methods = {
        "diloco": _method(1000, [[0, 1000.0], [1000, 80.0]], 20_000, wall=10.0),
        "adloco": _method(1000, [[0, 1000.0], [1000, 100.0]], 12_000, wall=10.0),
        "adloco_int8": _method(1000, [[0, 1000.0], [1000, 101.0]], 6_000, wall=8.0),
        "diloco_int4": _method(1000, [[0, 1000.0], [1000, 88.0]], 5_000, wall=12.0),
    }
    summary = convergence.compare(methods)
    int8, int4 = methods["adloco_int8"], methods["diloco_int4"]
    assert int8["ppl_vs_adloco"] == pytest.approx(1.01) and int8["ppl_vs_diloco"] == pytest.approx(101 / 80)
    assert int8["bytes_vs_adloco"] == pytest.approx(0.5) and int8["wall_vs_adloco"] == pytest.approx(0.8)
    assert int4["ppl_vs_diloco"] == pytest.approx(1.1) and int4["bytes_vs_diloco"] == pytest.approx(0.25)
    assert "ppl_vs_adloco" not in int4 and "ppl_vs_adloco" not in methods["adloco"]
    report = convergence.format_report({"methods": methods, **summary})
    assert (
        "adloco_int8 vs adloco: ppl at equal tokens 1.010 (1 seed), bytes (model) 0.500x, bytes (measured) 0.500x, "
        "wall 0.800x"
    ) in report
    assert "diloco_int4 vs diloco: ppl at equal tokens 1.100 (1 seed), bytes (model) 0.250x" in report
    assert "adloco vs" not in report and "diloco vs" not in report
    rows = [line for line in report.splitlines() if line.startswith("| adloco_int8 ")]
    assert len(rows) == 1 and rows[0].count("(1 seed)") == 1  # its ppl/diloco cell (no ddp ran: ppl/ddp is -)


def test_the_round_log_keeps_the_slowest_instances_timings(tmp_path):
    from recipes.benchmarks import _convergence_worker as worker

    def line(step, instance, comm_seconds, merge_seconds=0.0):
        return {"outer_step": step, "instance": instance, "global_step": 25 * step, "total_tokens": 1000 * step,
                "num_instances": 2, "workers": [2 * instance, 2 * instance + 1], "batch_size": 4, "samples": 200,
                "accumulation_steps": 1, "comm_bytes": 100, "comm_seconds": comm_seconds, "outer_seconds":
                comm_seconds + 0.01, "merge_seconds": merge_seconds, "merged_from": [1] if merge_seconds else []}  # fmt: skip

    lines = [line(1, 0, 0.5), line(1, 1, 0.75), line(2, 0, 0.25, merge_seconds=2.0), line(2, 1, 0.125)]
    (tmp_path / "adloco_rounds.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    rounds = worker.adloco_rounds(str(tmp_path))
    assert [r["comm_seconds"] for r in rounds] == [0.75, 0.25]  # the round's slowest instance
    assert [r["outer_seconds"] for r in rounds] == pytest.approx([0.76, 0.26])
    assert [r["merge_seconds"] for r in rounds] == [0.0, 2.0] and [r["merged"] for r in rounds] == [False, True]
    assert [r["comm_bytes"] for r in rounds] == [200, 200] and rounds[1]["global_step"] == 50


def test_the_step_clock_and_the_round_marks(monkeypatch):
    from types import SimpleNamespace

    from recipes.benchmarks import _convergence_worker as worker

    now = [100.0]
    monkeypatch.setattr(worker.time, "perf_counter", lambda: now[0])
    trainer = SimpleNamespace(
        adloco_state=SimpleNamespace(last_round_step=0), bench_start_time=100.0, bench_eval_seconds=0.0
    )
    clock = worker.StepClock()
    marks = worker.RoundMarks(trainer, clock)
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
    # What links.py makes of them: one round after the first, 4 s of wall (10.5 - 3.5 - 3 s of evaluation), 3 s of it
    # in inner steps.
    from recipes.benchmarks import links

    steady = links.steady_rounds([marks.marks])
    assert steady["wall_seconds_per_round"] == pytest.approx(4.0)
    assert steady["compute_seconds_per_round"] == pytest.approx(3.0)


def test_the_curve_follows_the_merged_model_and_keeps_the_instances_mean(monkeypatch, tmp_path):
    from types import SimpleNamespace

    from recipes.benchmarks import _convergence_worker as worker

    class Evaluated:
        def evaluate(self, eval_dataset=None, ignore_keys=None, metric_key_prefix="eval"):
            return dict(self.metrics)

    class Bench(worker.BenchmarkMixin, Evaluated):
        state = SimpleNamespace(global_step=10)

    monkeypatch.setattr(worker, "socket_bytes_sent", lambda: None)
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
    assert worker.curve_kind(["merged", "model"]) == "merged"
    assert worker.curve_kind(["instances_mean", "model"]) == "instances_mean"
    assert worker.curve_kind(["model"]) == "model"

    # Every multi-instance method evaluates its merged model; one instance has nothing to merge.
    settings = convergence.shared_settings(convergence.parse_args(["--quick"]))
    for name, method in convergence.METHODS.items():
        if method["kind"] == "ddp":
            continue
        spec = convergence.method_spec(name, settings, str(tmp_path), matched_batch_size=6)
        assert spec["adloco"]["eval_merged_model"] is (spec["adloco"]["num_instances"] > 1), name
        spec["backend"] = None  # built in this process: no process group to form
        assert worker.make_arguments(spec).eval_merged_model is spec["adloco"]["eval_merged_model"]

    # The report says what a curve is; the instances' mean is averaged over seeds like the curve.
    merged = convergence.aggregate(
        {
            1: _seed_run([[500, 100.0]], curve_kind="merged", curve_instances_mean=[[0, 1000.0], [500, 50.0]]),
            2: _seed_run([[500, 400.0]], curve_kind="merged", curve_instances_mean=[[0, 1000.0], [500, 200.0]]),
        }
    )
    assert merged["curve_kind"] == "merged"
    assert convergence.interpolate_curve(merged["curve_instances_mean"], 500) == pytest.approx(100.0)
    older = _seed_run([[500, 100.0]])  # written before curve_kind: several instances meant their mean
    older["evals"][0]["instance_losses"] = {"0": 4.0, "1": 5.0}
    assert convergence.aggregate({1: older})["curve_kind"] == "instances_mean"
    assert convergence.aggregate({1: _seed_run([[500, 100.0]])})["curve_kind"] == "model"
    report = convergence.format_report(
        {"methods": {"adloco": merged, "ddp": convergence.aggregate({1: _seed_run([[500, 90.0]])})}}
    )
    assert "adloco: its curve is the merged model's" in report and "ddp:" not in report


def test_step_bounds_cover_the_budget(tmp_path):
    from recipes.benchmarks import _convergence_worker as worker

    settings = convergence.shared_settings(
        convergence.parse_args(["--quick", "--batch_size", "12", "--max_batch_size", "8"])
    )
    settings["cache_dir"] = str(tmp_path)
    ddp = convergence.method_spec("ddp", settings, str(tmp_path))
    per_step = ddp["world_size"] * 12 * ddp["block_size"]
    ddp_steps = worker.max_steps_for(ddp)
    assert ddp_steps * per_step >= ddp["budget_tokens"] > (ddp_steps - 1) * per_step
    assert worker.common_arguments(ddp)["lr_scheduler_type"] == "constant_with_warmup"
    # An initial request above max_batch_size runs at max_batch_size (switch mode's middle band): the bound on
    # AdLoCo's steps must still reach the budget with that smaller batch, in whole rounds.
    diloco = convergence.method_spec("diloco", settings, str(tmp_path))
    assert diloco["adloco"]["max_batch_size"] == 8
    diloco_steps = worker.max_steps_for(diloco)
    smallest = diloco["world_size"] * diloco["adloco"]["max_batch_size"] * diloco["block_size"]
    assert diloco_steps * smallest >= diloco["budget_tokens"]
    assert diloco_steps % diloco["train"]["inner_steps"] == 0
    # AdLoCo's merges keep one instance's total batch (preserve_total): after the last one the whole launch may
    # train one worker's batch per step, and the bound must still reach the budget.
    adloco = convergence.method_spec("adloco", settings, str(tmp_path))
    one_worker = adloco["adloco"]["max_batch_size"] * adloco["block_size"]
    assert worker.max_steps_for(adloco) * one_worker >= adloco["budget_tokens"]
    paper = convergence.method_spec("adloco_paper", settings, str(tmp_path))
    assert worker.max_steps_for(paper) == diloco_steps  # the paper's rule never lowers a request


def test_plot_writes_a_png(tmp_path):
    pytest.importorskip("matplotlib")
    settings = convergence.shared_settings(convergence.parse_args(["--quick"]))
    methods = {
        "ddp": _method(1000, [[0, 1000.0], [1000, 50.0]], 1_000_000),
        "adloco": _method(1000, [[0, 1000.0], [1000, 60.0]], 10_000),
        "broken": {"error": "exit 1"},
    }
    path = convergence.plot({"methods": methods, "settings": settings}, str(tmp_path / "c.png"))
    assert os.path.getsize(path) > 1000


def _seed_run(curve, **extra):
    """A per-seed result as the worker writes it: curve [[tokens, ppl]] and one eval point per curve point."""
    evals = [
        {
            "tokens": t,
            "eval_ppl": p,
            "seconds": t / 100,
            "inner_steps": t // 10,
            "rounds": t // 100,
            "comm_bytes": 2 * t,
        }
        for t, p in curve
    ]
    run = _method(curve[-1][0], [[0, 1000.0], *curve], 2 * curve[-1][0])
    run.update(evals=evals, steps=curve[-1][0] // 10, epochs=0.5, max_worker_epochs=0.6, rounds=curve[-1][0] // 100)
    run.update(extra)
    return run


def test_seeds_are_averaged_and_ratios_paired_by_seed():
    ddp = convergence.aggregate(
        {1: _seed_run([[500, 100.0], [1000, 50.0]]), 2: _seed_run([[500, 120.0], [1000, 60.0]])}
    )
    diloco = convergence.aggregate(
        {1: _seed_run([[500, 110.0], [1000, 55.0]]), 2: _seed_run([[500, 130.0], [1000, 66.0]])}
    )
    # Perplexities average geometrically, as the curves do: the mean final perplexity is the curve's last point.
    assert ddp["final_eval_ppl"] == pytest.approx(math.sqrt(50.0 * 60.0)) and ddp["final_eval_ppl_seeds"] == [
        50.0,
        60.0,
    ]
    assert ddp["final_eval_ppl_sd"] == pytest.approx(math.sqrt(50.0))
    # The mean curve averages log-perplexity: the geometric mean of the seeds.
    assert convergence.interpolate_curve(ddp["curve"], 1000) == pytest.approx(math.sqrt(50.0 * 60.0))
    # Bytes repeat (rounds that send nothing): that curve is averaged evaluation by evaluation.
    by_index = convergence.mean_curve_by_index([[[0, 100.0], [0, 50.0], [10, 20.0]], [[0, 400.0], [2, 50.0]]])
    assert by_index == [[0, pytest.approx(200.0)], [1, pytest.approx(50.0)]]
    methods = {"ddp": ddp, "diloco": diloco}
    convergence.compare(methods)
    # Paired by seed: 1.1 and 1.1 -> a clear loss with no spread between seeds, although the unpaired spread of
    # the perplexities (5 and 7) is larger than the difference of the means (5.5).
    assert diloco["ppl_vs_ddp_seeds"] == [pytest.approx(1.1), pytest.approx(1.1)]
    assert diloco["ppl_vs_ddp_verdict"] == "worse"
    assert convergence.verdict([1.02, 0.97, 1.03]) == "tie"
    assert convergence.verdict([0.9, 0.92, 0.91]) == "better"
    assert convergence.verdict([0.9]) == "1 seed"
    # A seed missing on one side: fewer pairs than seeds, and the cell says so.
    diloco["ppl_vs_ddp_seeds"] = [1.1]
    assert "[n=1/2]" in convergence._ratio_cell(diloco, "ddp")
    report = convergence.format_report({"methods": methods, **convergence.compare(methods)})
    assert "worse" in report and "±" in report


def test_a_split_by_speed_is_compared_with_equal_batches_per_round_and_with_no_slow_worker():
    names = ("diloco_slow1", "diloco_balanced", "adloco_slow1", "adloco_balanced")
    for name in names:
        assert convergence.METHODS[name]["slow_workers"] == {"workers": [3], "cores": 0.25}
    assert convergence.METHODS["diloco_balanced"]["equal_batches"] == "diloco_slow1"
    assert convergence.METHODS["adloco_balanced"]["equal_batches"] == "adloco_slow1"
    # Seed by seed: the same tokens and rounds, the balanced rounds 0.5 and 0.6 × as long as equal batches'.
    diloco = convergence.aggregate({1: _seed_run([[1000, 50.0]]), 2: _seed_run([[1000, 60.0]])})
    slow = convergence.aggregate(
        {1: _seed_run([[1000, 50.0]], wall_seconds=40.0), 2: _seed_run([[1000, 60.0]], wall_seconds=50.0)}
    )
    balanced = convergence.aggregate(
        {1: _seed_run([[1000, 50.5]], wall_seconds=20.0), 2: _seed_run([[1000, 61.2]], wall_seconds=30.0)}
    )
    assert balanced["wall_per_round"] == pytest.approx(2.5)  # (20 + 30) / 2 s over 10 rounds
    methods = {"diloco": diloco, "diloco_slow1": slow, "diloco_balanced": balanced}
    summary = convergence.compare(methods)
    assert balanced["wall_per_round_vs_diloco_slow1_seeds"] == [pytest.approx(0.5), pytest.approx(0.6)]
    assert balanced["wall_per_round_vs_diloco_slow1"] == pytest.approx(0.55)
    assert balanced["ppl_vs_diloco_seeds"] == [pytest.approx(1.01), pytest.approx(1.02)]
    targets = summary["targets"]
    assert targets["diloco_balanced wall per round / diloco_slow1"]["holds"] is True
    within = targets["diloco_balanced ppl / diloco ppl at equal tokens (within 2 %)"]
    assert within["holds"] is True and (within["low"], within["bound"]) == (0.98, 1.02)
    report = convergence.format_report({"methods": methods, **summary})
    assert "diloco_balanced vs diloco_slow1 (equal batches, the same slow worker): wall per round 0.550" in report
    assert "target 0.98 <= diloco_balanced ppl / diloco ppl at equal tokens (within 2 %) <= 1.02" in report
    # The compact record keeps the figures, the ratios and each seed's per-worker batches, round by round.
    slow["seed_results"][1]["round_log"] = [
        {"worker_batch_sizes": {"0": [4, 4, 4, 4]}, "worker_sample_seconds": {"0": [0.01, 0.01, 0.01, 0.03]}},
        {"worker_batch_sizes": {"0": [5, 5, 5, 1]}, "worker_sample_seconds": {"0": [0.01, 0.01, 0.01, 0.04]}},
    ]
    kept = convergence.summary({"methods": methods, "seeds": [1, 2], "settings": {}, **summary})
    assert kept["methods"]["diloco_balanced"]["wall_per_round_vs_diloco_slow1"] == pytest.approx(0.55)
    assert kept["methods"]["diloco_slow1"]["per_seed"][1]["worker_batch_sizes"] == {"0": [[4, 4, 4, 4], [5, 5, 5, 1]]}
    assert kept["targets"] == summary["targets"] and "seed_results" not in kept["methods"]["diloco"]
    # 5 % worse is outside the 2 %.
    balanced["seed_results"][2]["curve"][-1][1] = 66.0
    assert (
        convergence.compare(methods)["targets"]["diloco_balanced ppl / diloco ppl at equal tokens (within 2 %)"][
            "holds"
        ]
        is False
    )


def test_the_slow_worker_methods_are_skipped_with_the_reason_where_no_cgroup_can_be_made(monkeypatch):
    def unavailable(*args, **kwargs):
        raise convergence.slow_workers.CgroupUnavailable("a cgroup with a CPU quota needs root")

    monkeypatch.setattr(convergence.slow_workers, "cpu_controller", unavailable)
    names, reason = convergence.runnable(["diloco", "diloco_slow1", "diloco_balanced"])
    assert names == ["diloco"] and "needs root" in reason
    assert convergence.runnable(["diloco", "adloco"]) == (["diloco", "adloco"], None)


def test_a_seed_that_failed_is_left_out_and_named():
    method = convergence.aggregate({1: _seed_run([[1000, 50.0]]), 2: {"error": "exit 1"}})
    assert method["seeds"] == [1] and method["failed_seeds"] == [2]
    assert method["final_eval_ppl"] == pytest.approx(50.0)
    assert convergence.aggregate({1: {"error": "exit 124"}})["error"] == "exit 124"


def test_to_target_interpolates_the_first_crossing_in_log_perplexity():
    points = [
        {"eval_ppl": 1000.0, "tokens": 0, "inner_steps": 0, "rounds": 0, "comm_bytes": 0, "seconds": 0.0},
        {"eval_ppl": 200.0, "tokens": 100, "inner_steps": 10, "rounds": 1, "comm_bytes": 40, "seconds": 5.0},
        {"eval_ppl": 50.0, "tokens": 300, "inner_steps": 30, "rounds": 3, "comm_bytes": 120, "seconds": 9.0},
        {"eval_ppl": 80.0, "tokens": 400, "inner_steps": 40, "rounds": 4, "comm_bytes": 160, "seconds": 11.0},
    ]
    # 100 lies halfway between 200 and 50 in log-perplexity.
    reached = convergence.reach(points, 100.0)
    assert reached == {
        "tokens": pytest.approx(200), "inner_steps": pytest.approx(20), "rounds": pytest.approx(2),
        "bytes": pytest.approx(80), "seconds": pytest.approx(7.0),
    }  # fmt: skip
    assert convergence.reach(points, 1000.0)["tokens"] == 0
    assert convergence.reach(points, 40.0) is None
    # Targets: reached by every run, the hardest at the worst run's best perplexity, rounded up.
    assert _common.choose_targets([50.0, 75.0]) == [98.0, 83.0, 75.0]
    assert _common.nice_ceiling(187.3) == 190 and _common.nice_ceiling(9.71) == pytest.approx(9.8)
    assert _common.choose_targets([float("nan")]) == []
    # A non-finite evaluation is no crossing.
    assert convergence.reach([dict(points[0], eval_ppl=float("nan")), *points[1:]], 100.0)["tokens"] == pytest.approx(
        200
    )


def test_to_target_over_seeds_and_the_matched_batch(tmp_path):
    methods = {
        "ddp": convergence.aggregate({1: _seed_run([[500, 100.0], [1000, 50.0]])}),
        "adloco": convergence.aggregate({1: _seed_run([[500, 80.0], [1000, 60.0]])}),
    }
    targets = convergence.to_target(methods, {1: 1000.0})
    assert targets[-1] == 60.0  # adloco's best is the worst best
    assert all(methods[m]["to_target"][f"{t:g}"]["tokens"] is not None for m in methods for t in targets)
    assert methods["adloco"]["to_target"]["60"]["tokens"] == pytest.approx(1000)
    # A seed that never reaches a target leaves that target's mean undefined (not the mean of the others).
    two = {"x": convergence.aggregate({1: _seed_run([[1000, 50.0]]), 2: _seed_run([[1000, 70.0]])})}
    convergence.to_target(two, {1: 1000.0, 2: 1000.0})
    entry = two["x"]["to_target"]["70"]
    assert entry["tokens_seeds"][0] is not None and entry["tokens"] is not None
    for point in two["x"]["seed_results"][2]["evals"]:
        point["seconds"] = None  # this seed did not time its evaluations
    convergence.to_target(two, {1: 1000.0, 2: 1000.0})
    entry = two["x"]["to_target"]["70"]
    assert entry["seconds"] is None and entry["seconds_seeds"][0] is not None and entry["tokens"] is not None
    assert convergence.check_matched(["ddp", "diloco_matched"]) and convergence.check_matched(["adloco"]) is None
    with pytest.raises(ValueError, match="failed"):
        convergence.matched_for("diloco_matched", {"adloco": {"error": "exit 1"}}, {})
    assert convergence.matched_for("ddp", {}, {}) is None
    settings = convergence.shared_settings(convergence.parse_args(["--quick"]))
    per_round = settings["world_size"] * settings["train"]["inner_steps"] * settings["block_size"]
    batch = convergence.matched_batch_size({"tokens": 60 * 6.4 * per_round, "rounds": 60}, settings)
    assert batch == 6
    spec = convergence.method_spec("diloco_matched", settings, str(tmp_path), seed=43, matched_batch_size=batch)
    assert spec["train"]["batch_size"] == 6 and spec["adloco"]["num_instances"] == 1 and spec["seed"] == 43
    assert spec["output_dir"].endswith(os.path.join("diloco_matched", "seed-43"))
    with pytest.raises(ValueError, match="adloco"):
        convergence.method_spec("diloco_matched", settings, str(tmp_path))
    with pytest.raises(SystemExit):
        convergence.parse_args(["--methods", "ddp", "diloco_matched"])
    assert convergence.run_order(["diloco_matched", "ddp", "adloco"]) == ["ddp", "adloco", "diloco_matched"]


def test_a_budget_over_one_epoch_is_refused_unless_repeats_are_allowed():
    settings = convergence.shared_settings(convergence.parse_args(["--quick", "--budget_tokens", "2000"]))
    with pytest.raises(SystemExit, match="allow_repeats"):
        convergence.check_epochs(settings, 1000, allow_repeats=False)
    convergence.check_epochs(settings, 1000, allow_repeats=True)
    convergence.check_epochs(settings, 2000, allow_repeats=False)


# ---- overhead.py ----
def _run(variant, repeat, tps, step, round_end, end_of_round):
    return {
        "variant": variant,
        "repeat": repeat,
        "tokens_per_second": tps,
        "tokens_per_cpu_second": tps,
        "ordinary_steps": [step] * 24,
        "round_end_steps": [round_end],
        "end_of_round": [end_of_round],
    }


def test_overhead_summary_pairs_repeats_and_scales_to_round_time():
    runs = []
    for repeat, scale in enumerate([1.0, 2.0, 1.0]):  # repeat 1 ran on a twice slower machine: the ratio holds
        runs += [
            _run("trainer", repeat, 1000.0 / scale, 0.1 * scale, 0.1 * scale, 0.0),
            # The round-end step is 2 ms slower with or without statistics (e.g. its position): not the statistics'.
            _run("adloco", repeat, 980.0 / scale, 0.1 * scale, 0.102 * scale, 0.01 * scale),
            _run("adloco_stats", repeat, 970.0 / scale, 0.1 * scale, 0.152 * scale, 0.01 * scale),
        ]
    runs.append(_run("trainer", 3, 5000.0, 0.1, 0.1, 0.0))  # an incomplete repeat is left out
    summary = overhead.summarize(runs, {"inner_steps": 25})
    assert summary["repeats"] == 3
    assert summary["throughput_ratio"] == pytest.approx(0.98)
    assert summary["throughput_ratio_spread"]["max"] == pytest.approx(0.98)
    assert summary["throughput_ratio_with_stats"] == pytest.approx(0.97)
    # Pooled medians: 2 of 3 repeats ran at scale 1.
    assert summary["stats_step_extra_seconds"] == pytest.approx(0.05)
    assert summary["stats_step_extra_within_run_seconds"] == pytest.approx(0.052)
    assert summary["outer_step_seconds"] == pytest.approx(0.01)
    assert summary["throughput_ratio_from_step_medians"] == pytest.approx(25 * 0.1 / (24 * 0.1 + 0.102 + 0.01))
    assert set(summary["stats_overhead"]) == {"25", "50", "200"}
    assert summary["stats_overhead"]["50"] == pytest.approx(0.05 / (50 * 0.1 + 0.01))
    assert summary["stats_overhead"]["200"] == pytest.approx(0.05 / (200 * 0.1 + 0.01))
    assert summary["outer_overhead"]["200"] == pytest.approx(0.01 / (200 * 0.1 + 0.01))
    assert "throughput_ratio" in overhead.format_report(summary)
    with pytest.raises(ValueError):
        overhead.summarize([_run("trainer", 0, 1.0, 0.1, 0.1, 0.0)], {"inner_steps": 25})


# ---- distributed_costs.py ----
def _line(step, instance, comm_bytes, merged_from=(), merge_bytes=None, merge_seconds=0.0):
    line = {
        "outer_step": step,
        "instance": instance,
        "comm_bytes": comm_bytes,
        "merged_from": list(merged_from),
        "merge_seconds": merge_seconds,
    }
    if merge_bytes is not None:
        line["merge_bytes"] = merge_bytes
    return line


def test_merge_events_take_the_library_timings_and_the_round_end_sockets_less_the_outer_all_reduces():
    rounds = [
        # Round 1: single-worker instances (no all-reduce), instance 1 merged into 0 (1000 bytes).
        _line(1, 0, 1000, merged_from=[1], merge_bytes=1000, merge_seconds=0.25),
        _line(1, 2, 0),
        _line(1, 3, 0),
        # Round 2: no merge.
        _line(2, 0, 300),
        _line(2, 2, 0),
        # Round 3: instance 0 (2 workers, 300 bytes of all-reduce) absorbs instance 2 (2000 bytes).
        _line(3, 0, 2300, merged_from=[2], merge_bytes=2000, merge_seconds=0.5),
        _line(3, 3, 0),
    ]
    reports = [
        {"outer_rounds": [1, 2, 3], "outer_bytes": [600, 160, 1500]},
        {"outer_rounds": [1, 2, 3], "outer_bytes": [410, 150, 1110]},
    ]
    events = distributed_costs.merge_events(reports, rounds)
    assert [e["round"] for e in events] == [1, 3]
    assert events[0] == {
        "round": 1,
        "seconds": 0.25,
        "modelled_bytes": 1000,
        "socket_bytes": 1010,
        "round_end_socket_bytes": 1010,
        "round_outer_modelled_bytes": 0,
    }
    assert events[1]["seconds"] == 0.5 and events[1]["modelled_bytes"] == 2000
    assert events[1]["round_end_socket_bytes"] == 2610
    assert events[1]["socket_bytes"] == 2610 - 300
    # Without `ss`, the socket counts are unknown rather than wrong.
    reports[1]["outer_bytes"][0] = None
    assert distributed_costs.merge_events(reports, rounds)[0]["socket_bytes"] is None


def test_benchmarks_do_not_edit_sys_path_or_patch_the_library():
    for name in sorted(os.listdir(BENCHMARKS)):
        if name.endswith(".py"):
            source = open(os.path.join(BENCHMARKS, name), encoding="utf-8").read()
            assert "sys.path" not in source, name
            for private in ("._merge", "_save_checkpoint =", "WorkerMonitor.check", ".totals[", "last_synced_step"):
                assert private not in source, (name, private)


# ---- adloco_hf.testing: the launcher the benchmarks share with the tests ----
def test_launch_command_runs_a_script_or_a_module_on_n_cpu_workers():
    command = launch_command("worker.py", "spec.json", "--flag", num_processes=3, main_process_port=12345)
    assert command[:3] == [sys.executable, "-m", "accelerate.commands.launch"]
    assert command[command.index("--num_processes") + 1] == "3"
    assert command[command.index("--main_process_port") + 1] == "12345"
    assert "--multi_gpu" in command and "--cpu" not in command  # DESIGN §6: --cpu alone runs one process
    assert command[-3:] == ["worker.py", "spec.json", "--flag"]
    assert "--module" not in command
    module = launch_command("recipes.benchmarks.distributed_costs", "--worker", "{}", num_processes=2, module=True)
    assert module[-4:] == ["--module", "recipes.benchmarks.distributed_costs", "--worker", "{}"]
    assert 0 < int(module[module.index("--main_process_port") + 1]) < 65536
    assert 0 < free_port() < 65536
    with pytest.raises(ValueError):
        launch_command("worker.py", num_processes=0)


def test_launch_command_is_what_accelerate_parses():
    from accelerate.commands.launch import launch_command_parser

    command = launch_command("recipes.benchmarks._convergence_worker", "spec.json", num_processes=4, module=True)
    parsed = launch_command_parser().parse_args(command[3:])
    assert parsed.multi_gpu and parsed.num_processes == 4 and parsed.module
    assert parsed.training_script == "recipes.benchmarks._convergence_worker"
    assert parsed.training_script_args == ["spec.json"]


def test_run_workers_returns_the_output_with_the_given_environment(tmp_path):
    code = "import os, sys; print(os.environ['OMP_NUM_THREADS'], os.environ['X']); print('err', file=sys.stderr)"
    result = run_workers([sys.executable, "-c", code], timeout=60, env={"X": "y"}, threads=3, cwd=tmp_path)
    assert result.ok and result.returncode == 0 and not result.timed_out
    assert result.stdout.split() == ["3", "y"] and result.stderr.strip() == "err"
    # A module found through `pythonpath`, the output in a log file.
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "hello.py").write_text(
        "import sys\nprint('hello', sys.argv[1], flush=True)\nprint('e', file=sys.stderr)\n"
    )
    log = tmp_path / "launch.log"
    result = run_workers([sys.executable, "-m", "pkg.hello", "x"], timeout=60, pythonpath=[tmp_path], log_path=log)
    assert result.stdout.split() == ["hello", "x", "e"] and result.stderr == ""
    assert log.read_text() == result.stdout


def test_run_workers_raises_with_the_output_or_returns_the_failure():
    code = "import sys; print('the cause'); sys.exit(3)"
    with pytest.raises(WorkersFailed) as failure:
        run_workers([sys.executable, "-c", code], timeout=60)
    assert isinstance(failure.value, AssertionError)  # a test that launches workers fails, with their output
    assert "exit 3" in str(failure.value) and "the cause" in str(failure.value)
    assert failure.value.result.returncode == 3
    result = run_workers([sys.executable, "-c", code], timeout=60, check=False)
    assert result.returncode == 3 and not result.ok


def test_run_workers_kills_every_process_of_the_launch_at_the_timeout(tmp_path):
    # A parent that starts a child and both sleep: the child must not outlive the timeout.
    pid_file = tmp_path / "child.pid"
    code = (
        "import subprocess, sys, time\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'])\n"
        f"open({str(pid_file)!r}, 'w').write(str(child.pid))\n"
        "print('started', flush=True)\n"
        "time.sleep(600)\n"
    )
    # The timeout leaves the parent time to start its child on a machine doing other work; the kill itself takes at
    # most kill_grace after it.
    result = run_workers([sys.executable, "-c", code], timeout=15, check=False, kill_grace=2)
    assert result.timed_out and result.returncode == 124 and not result.ok
    assert "started" in result.stdout
    assert result.seconds < 300  # SIGTERM, then SIGKILL after kill_grace: never waits for the 600-s sleeps
    child = int(pid_file.read_text())
    for _ in range(50):
        try:
            os.kill(child, 0)
        except ProcessLookupError:
            break
        time.sleep(0.1)
    else:
        pytest.fail(f"the launch's child process {child} survived the timeout")
    with pytest.raises(WorkersFailed, match="did not finish"):
        run_workers([sys.executable, "-c", "import time; time.sleep(600)"], timeout=1, kill_grace=1)


@pytest.mark.multiprocess
def test_a_module_target_runs_on_n_cpu_workers_in_one_gloo_group(tmp_path):
    # How the benchmarks launch their workers: `--module`, from the repository root, no path edits in the workers.
    command = launch_command("tests.scripts.probe_world_size", "2", str(tmp_path), num_processes=2, module=True)
    run_workers(command, timeout=120, cwd=REPO, pythonpath=[REPO])
    for rank in (0, 1):
        assert (tmp_path / f"rank-{rank}").read_text().split() == ["2", "gloo"]


def test_tiny_llama_is_small_and_seeded():
    config = tiny_llama_config()
    assert (config.vocab_size, config.hidden_size, config.num_hidden_layers) == (64, 32, 2)
    assert config.intermediate_size == 64
    wide = tiny_llama_config(vocab_size=4096, hidden_size=64, intermediate_size=256, max_position_embeddings=256)
    assert (wide.intermediate_size, wide.max_position_embeddings) == (256, 256)
    a, b, c = tiny_llama(seed=0), tiny_llama(seed=0), tiny_llama(seed=1)
    weights = [next(m.parameters()).detach() for m in (a, b, c)]
    assert (weights[0] == weights[1]).all() and not (weights[0] == weights[2]).all()


# ---- end to end ----
@pytest.mark.slow
def test_overhead_script_end_to_end(tmp_path):
    out = tmp_path / "overhead"
    command = [
        sys.executable,
        "-m",
        "recipes.benchmarks.overhead",
        "--quick",
        "--inner_steps",
        "5",
        "--rounds",
        "3",
        "--warmup",
        "2",
        "--repeats",
        "2",
        "--output_dir",
        str(out),
        "--cache_dir",
        os.path.join(REPO, "outputs", "cache"),
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    result = subprocess.run(command, capture_output=True, text=True, timeout=600, env=env, cwd=REPO)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    results = json.loads((out / "results.json").read_text())
    assert 0.2 < results["throughput_ratio"] < 5
    assert 0.2 < results["throughput_ratio_with_stats"] < 5
    assert results["throughput_ratio_spread"]["n"] == 2
    assert set(results["stats_overhead"]) >= {"50", "200"}
    for value in results["stats_overhead"].values():
        assert 0 <= value < 1
    assert results["stats_overhead"]["200"] <= results["stats_overhead"]["50"]
    assert results["outer_step_seconds"] >= 0
    assert {run["variant"] for run in results["runs"]} == set(overhead.VARIANTS)
    assert all(run["tokens_per_second"] > 0 for run in results["runs"])


@pytest.mark.multiprocess
def test_convergence_script_end_to_end(tmp_path):
    out = tmp_path / "convergence"
    command = [
        sys.executable,
        "-m",
        "recipes.benchmarks.convergence",
        "--quick",
        "--seeds",
        "1",
        "--methods",
        "ddp",
        "adloco",
        "--budget_tokens",
        "40960",
        "--inner_steps",
        "5",
        "--eval_every_rounds",
        "2",
        "--merge_every",
        "1",
        # The small built-in corpus (tokenised in seconds on a fresh clone).
        "--set",
        'data.corpus="builtin:python-docs"',
        "--set",
        "data.eval_blocks=32",
        "--output_dir",
        str(out),
        "--cache_dir",
        os.path.join(REPO, "outputs", "cache"),
    ]
    result = subprocess.run(command, capture_output=True, text=True, timeout=900, cwd=REPO)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    results = json.loads((out / "results.json").read_text())
    assert set(results["methods"]) == {"ddp", "adloco"}
    assert results["seeds"] == [42]
    results["initial_eval_ppl"] = results["initial_eval_ppl"]["42"]
    for name, method in results["methods"].items():
        assert "error" not in method, (name, method)
        for key in ("final_eval_ppl", "tokens", "comm_rounds", "comm_bytes", "wall_seconds", "curve"):
            assert key in method, (name, key)
        assert method["tokens"] >= 40960
        assert 1 < method["final_eval_ppl"] < results["initial_eval_ppl"]
        assert method["curve"][0] == [0, results["initial_eval_ppl"]]
        assert all(len(point) == 2 for point in method["curve"])
        assert method["epochs"] <= 1 and method["to_target"], (name, method)
    ddp, adloco = results["methods"]["ddp"], results["methods"]["adloco"]
    assert ddp["comm_rounds"] == ddp["steps"] == 40960 // (4 * 4 * 128)
    adloco = adloco["seed_results"]["42"]
    assert adloco["comm_bytes"] < ddp["comm_bytes"]
    # The 4 instances merged down to one; the last curve point is the merged model.
    assert adloco["instances"][-1][1] == 1
    assert adloco["evals"][-1]["prefix"] == "eval_merged"
    if ddp["measured_bytes_sent"] is not None:
        # Gloo's own algorithm and the store's messages differ from the ring model, by less than a factor of 2.
        assert 0.5 < ddp["measured_bytes_sent"] / ddp["comm_bytes"] < 2
    assert (out / "convergence.png").exists()


@pytest.mark.slow
@pytest.mark.multiprocess
def test_distributed_costs_script_end_to_end(tmp_path):
    out = tmp_path / "costs"
    command = [
        sys.executable,
        "-m",
        "recipes.benchmarks.distributed_costs",
        "--workers",
        "2",
        "--inner_steps",
        "4",
        "--rounds",
        "2",
        "--batch",
        "2",
        "--worker_timeout",
        "5",
        "--output_dir",
        str(out),
    ]
    result = subprocess.run(command, capture_output=True, text=True, timeout=900, cwd=REPO)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    results = json.loads((out / "distributed_costs.json").read_text())
    assert results["float32"]["payload_bytes"] == 2 * results["bfloat16"]["payload_bytes"]
    for dtype in ("bfloat16", "float32"):
        costs = results[dtype]
        assert costs["ring_model_bytes"] == 2 * (2 - 1) * costs["payload_bytes"]
        assert costs["outer_step_after_barrier_seconds"] > 0 and costs["outer_step_seconds"] > 0
        if costs["measured_bytes_per_round"] is not None:
            assert 0.5 < costs["measured_bytes_per_round"] / costs["ring_model_bytes"] < 2
    # 2 instances merge once, after round 1; the library timed it and counted its bytes.
    (merge,) = results["merges"]
    assert merge["round"] == 1 and merge["seconds"] > 0 and merge["modelled_bytes"] > 0
    assert results["checkpoint_save_seconds"] > 0
    for kind in ("exits", "hangs"):
        lost = results[f"lost_worker_{kind}"]
        assert lost["noticed_after_seconds"] is not None and lost["barrier_wait_seconds"] >= 0
        assert "1" in lost["message"]  # names the lost rank


def test_the_fault_benchmark_knows_its_scenarios_and_refuses_unknown_ones(capsys):
    from recipes.benchmarks import faults

    assert {
        "kill_all",
        "sigterm_round_end",
        "sigterm_cut",
        "sigterm_launcher",
        "truncated_checkpoint",
        "disk_full",
    } <= set(faults.SCENARIOS)
    with pytest.raises(SystemExit):
        faults.main(["--scenarios", "kill_all,no_such_fault"])
    assert "unknown scenario(s) ['no_such_fault']" in capsys.readouterr().err


# ---- gpu_check.py ----
def test_gpu_check_table_from_the_steps_outcomes(tmp_path):
    from recipes.benchmarks import gpu_check

    assert gpu_check.pytest_counts("== 3 passed, 1 failed, 2 skipped, 1 error in 9.1s ==") == {
        "passed": 3, "failed": 1, "skipped": 2, "error": 1,
    }  # fmt: skip
    commands = gpu_check.step_commands(str(tmp_path))
    assert list(commands) == list(gpu_check.STEPS)
    assert "backend=nccl" in commands["1 worker, nccl, fp16, auto"]
    for folder, tokens_per_second in (("gloo4", 3000.0), ("gloo1", 1000.0), ("nccl1", 1500.0)):
        run = {"tokens_per_second": tokens_per_second, "final_eval_ppl": 90.0, "peak_memory_bytes": 2**30}
        run["max_batch_size"] = 48
        (tmp_path / folder).mkdir()
        results = {"methods": {"diloco": {"seed_results": {"7": run}}}}
        (tmp_path / folder / "results.json").write_text(json.dumps(results))
    outcomes = {
        "cuda tests": {"code": 1, "output": "1 passed, 1 failed in 3s"},
        "4 workers, gloo, fp16": {"code": 0, "output": ""},
        "1 worker, gloo, fp16": {"code": 0, "output": ""},
        "1 worker, nccl, fp16, auto": {"code": 0, "output": ""},
        "overhead": {"code": 1, "output": ""},
        "4 workers, gloo, fp16, comm": {"code": 1, "output": ""},
    }
    # The communication step: one method finished, the other did not.
    (tmp_path / "comm").mkdir()
    finished = {"tokens_per_second": 2500.0, "final_eval_ppl": 95.0}
    results = {"methods": {"adloco": {"seed_results": {"7": finished}}, "diloco_overlap_int4": {"seed_results": {}}}}
    (tmp_path / "comm" / "results.json").write_text(json.dumps(results))
    assert commands["4 workers, gloo, fp16, comm"][-4:-2] == list(gpu_check.COMM_METHODS)
    rows = {row["step"]: row for row in gpu_check.summarise(outcomes, str(tmp_path))}
    assert rows["comm: adloco"]["result"] == "2,500 tokens/s, ppl 95.0"
    assert rows["comm: diloco_overlap_int4"] == {
        "step": "comm: diloco_overlap_int4", "ok": "FAILED", "result": "no result (exit 1)",
    }  # fmt: skip
    assert rows["cuda tests"]["ok"] == "FAILED"
    assert rows["4 workers, gloo, fp16"]["ok"] == "ok" and "3,000 tokens/s" in rows["4 workers, gloo, fp16"]["result"]
    assert "auto -> 48" in rows["1 worker, nccl, fp16, auto"]["result"]
    assert rows["4 workers / 1 worker"]["result"] == "tokens/s x 3.00"
    assert rows["overhead"]["ok"] == "FAILED"


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="checks the message given without a GPU")
def test_gpu_check_says_so_and_runs_nothing_without_cuda(tmp_path, capsys):
    from recipes.benchmarks import gpu_check

    assert gpu_check.main(["--output_dir", str(tmp_path / "g")]) == 2
    assert "no CUDA device" in capsys.readouterr().out and not (tmp_path / "g").exists()
