"""The virtual clock (`toolkit/clock/virtual_clock.py`), the device profiles it prices with (`toolkit/clock/device_profiles.py`)
and `convergence --clock virtual`'s comparison (`convergence/virtual.py`): prices on hand-computed cases; a real
one-worker run timed by it takes the same decisions and virtual seconds twice, and its goodput rule fits the
profile's own α and β."""

import json
import math
import os
import subprocess
import sys

import pytest
from helpers import rounds_of, sequence_dataset, tiny_model, tiny_run_config

from adloco_hf import AdLoCoTrainer
from recipes.benchmarks import convergence
from recipes.benchmarks.convergence import virtual
from recipes.benchmarks.toolkit import settings, stats
from recipes.benchmarks.toolkit.clock import device_profiles
from recipes.benchmarks.toolkit.clock.link_model import DeviceProfile, Link
from recipes.benchmarks.toolkit.clock.virtual_clock import VirtualClock, clock_from_spec
from recipes.benchmarks.toolkit.paths import REPO


H200 = os.path.join(REPO, "docs", "results", "device_profiles", "nvidia-h200-microllama.json")
H200_THROUGHPUT = os.path.join(REPO, "docs", "results", "device_profiles", "nvidia-h200-throughput-300m.json")
PROFILE = DeviceProfile(
    {1: 0.003 + 0.002, 8: 0.003 + 0.016}, optimizer_seconds=0.004, outer_seconds=0.05, statistics_seconds=0.02
)


def test_steps_are_priced_by_the_profile_and_rounds_by_the_ring_on_every_link():
    fast, slow = Link(8e9, 1e-4), Link(8e6, 1e-3)  # 1 GB/s and 1 MB/s
    clock = VirtualClock(PROFILE, [fast, slow], world=4, statistics=True)
    clock.passes((4, 4))  # two passes of 4: 2 (α + 4 β) = 2 (0.003 + 0.008)
    clock.step_rest()
    assert clock.seconds == pytest.approx([0.026, 0.026]) and clock.now() == clock.seconds[0]
    clock.outer_step(round_number=1, workers=2, payload_bytes=1_000_000)
    # local work 0.05 + statistics 0.02; the ring over 2 workers: 2 hops of latency + 0.5 MB; two control
    # collectives over the 4 workers: 2 × 3 latencies.
    expected = [0.026 + 0.07 + 2 * (link.latency_seconds + 500_000 * 8 / link.bandwidth_bits_per_second)
                + 6 * link.latency_seconds for link in (fast, slow)]  # fmt: skip
    assert clock.seconds == pytest.approx(expected)
    assert clock.compute_seconds == pytest.approx(0.026 + 0.07)
    clock.merge(round_number=1, sent_bytes=(0, 3_000_000, 1_000_000, 0))  # the busiest sender, one latency
    assert clock.seconds[1] == pytest.approx(expected[1] + 1e-3 + 3.0)
    clock.align([0.0, 100.0])  # the round end waits for the slowest worker, link by link
    assert clock.seconds[0] == pytest.approx(expected[0] + 1e-4 + 3e-3) and clock.seconds[1] == 100.0
    # A run without statistics does not pay for them; one worker sends nothing.
    quiet = VirtualClock(PROFILE, [slow], world=1, statistics=False)
    quiet.outer_step(round_number=1, workers=1, payload_bytes=10**9)
    assert quiet.seconds == pytest.approx([0.05])
    # The bytes priced as the profile's model's: 10 x the payload, 10 x the merge.
    scaled = VirtualClock(PROFILE, [slow], world=2, statistics=False, bytes_scale=10.0)
    scaled.outer_step(round_number=1, workers=2, payload_bytes=100_000)
    ring = 2 * (1e-3 + 500_000 * 8 / 8e6)  # as 1 MB over 2 workers
    assert scaled.seconds == pytest.approx([0.05 + ring + 2 * 1e-3])
    scaled.merge(round_number=1, sent_bytes=(200_000, 0))
    assert scaled.seconds == pytest.approx([0.05 + ring + 2 * 1e-3 + 1e-3 + 2.0])
    with pytest.raises(ValueError, match="bytes_scale"):
        VirtualClock(PROFILE, [slow], world=1, statistics=False, bytes_scale=0)


def test_the_h200_profile_is_derived_from_the_measured_step_with_its_source():
    with open(H200_THROUGHPUT, encoding="utf-8") as f:
        measured = json.load(f)
    profile = device_profiles.profile_from_throughput(
        measured, pass_seconds=0.003, optimizer_seconds=0.002, parameters=247_489_536
    )
    kept = device_profiles.load_profile(H200)
    assert profile["micro_batch_seconds"] == pytest.approx(kept["micro_batch_seconds"])
    adloco = next(r for r in measured["rows"] if r["variant"] == "adloco" and r["compiled"])
    # The measured step (batch 32) is reproduced exactly: ω + α + 32 β.
    step = DeviceProfile.from_json(profile).step_seconds([32])
    assert step == pytest.approx(adloco["step_seconds"]["median"])
    assert kept["max_micro_batch"] == 280 and 0.04 < kept["outer_seconds"] < 0.05
    assert "interpolated" in kept and "gpu_bench throughput-300m" in kept["source"]
    with pytest.raises(ValueError, match="leaves nothing"):
        device_profiles.profile_from_throughput(measured, pass_seconds=0.05, optimizer_seconds=0.02, parameters=1)


def test_a_profile_without_its_source_is_refused(tmp_path):
    path = tmp_path / "p.json"
    path.write_text(json.dumps({"micro_batch_seconds": {"4": 0.1}}))
    with pytest.raises(ValueError, match="needs source"):
        device_profiles.load_profile(str(path))


def test_the_student_interval_of_paired_ratios():
    assert stats.t_quantile_975(7) == 2.365 and stats.t_quantile_975(100) == pytest.approx(1.984, abs=1e-3)
    ratios = [0.8, 0.9, 0.7, 0.85]
    logs = [math.log(r) for r in ratios]
    mean = sum(logs) / 4
    sd = math.sqrt(sum((x - mean) ** 2 for x in logs) / 3)
    interval = stats.paired_interval(ratios)
    assert interval["mean"] == pytest.approx(math.exp(mean))
    assert interval["high"] == pytest.approx(math.exp(mean + 3.182 * sd / 2)) and interval["n"] == 4
    assert stats.paired_interval([0.5])["low"] is None


def _points(pairs):
    return [{"eval_ppl": ppl, "seconds": s, "tokens": 0} for s, ppl in pairs]


def test_the_virtual_comparison_pairs_each_seed_with_the_best_fixed_batch():
    curves = {
        # b4 ends (at the budget, 10 s) at 100 / 110; b8 at 90 / 95: b8 is the best fixed batch.
        "diloco_b4": {1: _points([(0, 1000), (10, 100)]), 2: _points([(0, 1000), (10, 110)])},
        "diloco_b8": {1: _points([(0, 1000), (10, 90)]), 2: _points([(0, 1000), (10, 95)])},
        # the norm test reaches b8's ppl at 5 s in seed 1 and never in seed 2 (its run ends at 15 s).
        "adloco": {1: _points([(0, 1000), (5, 90), (15, 50)]), 2: _points([(0, 1000), (15, 96)])},
    }
    out = virtual.compare_virtual(curves, 10.0, ["diloco_b4", "diloco_b8"])
    assert out["best_fixed"] == "diloco_b8" and out["targets"] == {1: 90, 2: 95}
    norm = out["methods"]["adloco"]
    assert norm["time_ratio_seeds"] == {1: pytest.approx(0.5), 2: pytest.approx(1.5)}
    assert norm["time_ratio_never"] == [2]
    # at the budget: seed 1 at 10 s between 90 (5 s) and 50 (15 s), log-linear; seed 2 between 1000 and 96
    assert norm["ppl_at_budget_seeds"][1] == pytest.approx(math.sqrt(90 * 50))
    assert out["methods"]["diloco_b4"]["ppl_vs_best_fixed"]["mean"] == pytest.approx(math.sqrt(100 / 90 * 110 / 95))
    targets = virtual.virtual_targets({"100mbit": out}, {"100mbit": 100e6}, "adloco")
    (entry,) = targets.values()
    assert entry["holds"] is False and entry["never"] == [2]  # a seed that never reached fails the target
    assert "(1 never)" in virtual.format_virtual({"virtual": {"100mbit": out}, "virtual_targets": targets})


def test_the_virtual_command_line_and_each_methods_spec(tmp_path, capsys):
    argv = ["--quick", "--clock", "virtual", "--device_profile", H200, "--bandwidth", "10gbit", "100mbit",
            "--budget_virtual_seconds", "2", "--methods", "diloco_b4", "adloco_goodput"]  # fmt: skip
    args = convergence.parse_args(argv)
    shared = settings.shared_settings(args)
    assert shared["clock"]["bandwidths"] == [10**10, 10**8] and shared["clock"]["budget_seconds"] == [2.0, 2.0]
    fixed = settings.method_spec("diloco_b4", shared, str(tmp_path))
    goodput = settings.method_spec("adloco_goodput", shared, str(tmp_path))
    assert fixed["adloco"]["max_batch_size"] == goodput["adloco"]["max_batch_size"] == 280  # the H200's
    assert fixed["clock"]["budget_seconds"] == [2.0, 2.0]
    assert goodput["clock"]["budget_seconds"] == [3.0, 3.0]  # past the budget: its time to target is measured
    assert goodput["adloco"]["batch_size_cap"] == 64  # the shared cap: the rule needs one
    assert settings.reads_clock(goodput) and not settings.reads_clock(fixed)
    one = settings.on_links(goodput, [1], str(tmp_path / "100mbit"))
    assert one["clock"]["bandwidths"] == [10**8] and one["clock"]["labels"] == ["100mbit"]
    clock = clock_from_spec(one["clock"], world=4, statistics=True, parameters=247_489_536 // 100)
    assert clock.links[0].bandwidth_bits_per_second == 1e8 and clock.profile.max_micro_batch == 280
    assert clock.bytes_scale == pytest.approx(100, rel=1e-6)  # a model 100 x smaller sends the H200 model's bytes
    testbed = clock_from_spec({**one["clock"], "scale_bytes": False}, world=4, statistics=True, parameters=1000)
    assert testbed.bytes_scale == 1.0  # links --clock virtual: the bytes the testbed's links carry
    for bad, message in (
        (["--methods", "ddp"], "leave it out"),
        (["--budget_seconds", "3"], "budget_virtual_seconds"),
        (["--budget_virtual_seconds", "1", "2", "3"], "one per --bandwidth"),
    ):
        with pytest.raises(SystemExit):
            convergence.parse_args([*argv, *bad])
        assert message in capsys.readouterr().err
    with pytest.raises(SystemExit, match="budget_virtual_seconds"):
        convergence.parse_args(["--clock", "virtual", "--device_profile", H200, "--bandwidth", "1gbit",
                                "--methods", "diloco_b4"])  # fmt: skip


def _virtual_run(output_dir, timing):
    profile = DeviceProfile.from_json(device_profiles.load_profile(H200))
    args = tiny_run_config(
        output_dir, max_steps=30, batch_size_target="goodput", lr_batch_scaling="sqrt", per_device_train_batch_size=2,
        max_batch_size=4, batch_size_cap=16, inner_steps=5, batch_size_test="norm", seed=7, goodput_timing=timing,
    )  # fmt: skip
    trainer = AdLoCoTrainer(model=tiny_model(), args=args, train_dataset=sequence_dataset(512))
    clock = VirtualClock(profile, [Link(1e8)], world=1, statistics=True)
    trainer.worker.clock = clock
    trainer.train()
    return clock, rounds_of(args.output_dir)


@pytest.mark.parametrize("timing", ["startup", "live"])
def test_a_run_timed_by_the_virtual_clock_repeats_its_seconds_and_the_rule_reads_the_profile(tmp_path, timing):
    """The goodput rule on one worker, twice with the same seed: the same virtual seconds to the last bit, the same
    requests and losses; the rule's step model is the device profile's α and β, measured by the startup profile
    (which times no optimizer step and, with one worker, no link) or on the rounds (with ω and the round's cost)."""
    first_clock, first = _virtual_run(tmp_path / "a", timing)
    second_clock, second = _virtual_run(tmp_path / "b", timing)
    assert first_clock.seconds == second_clock.seconds and first_clock.seconds[0] > 0
    keys = ("batch_size", "next_batch_size", "train_loss", "outer_seconds", "goodput", "step_model")
    assert [{k: line.get(k) for k in keys} for line in first] == [{k: line.get(k) for k in keys} for line in second]
    with open(H200, encoding="utf-8") as f:
        profile = json.load(f)
    beta = (profile["micro_batch_seconds"]["32"] - profile["micro_batch_seconds"]["1"]) / 31
    omega, alpha, per_sample, per_round = first[0]["step_model"]
    if timing == "startup":
        assert (omega, alpha, per_sample, per_round) == pytest.approx((0.0, 0.003, beta, 0.0), rel=1e-6)
    else:
        assert (omega, alpha, per_sample) == pytest.approx((0.002, 0.003, beta), rel=1e-6)
        assert per_round == pytest.approx(profile["outer_seconds"] + profile["statistics_seconds"], rel=1e-6)
    requests = [first[0]["batch_size"]] + [line["next_batch_size"] for line in first]
    assert any(request != 2 for request in requests)  # the rule moved the user's request (2), at the start or later


@pytest.mark.slow  # ~60 s on 2 cores: two launches of 2 workers
@pytest.mark.multiprocess
def test_a_virtual_run_repeats_its_seconds_and_perplexities(tmp_path):
    """The benchmark worker with the virtual clock, 2 real workers (gloo), the goodput rule reading the clock, run
    twice with the same seed: the same virtual seconds at every round's end, to the last bit, and the same eval
    perplexities."""

    def run(name):
        out = tmp_path / name
        command = [
            sys.executable, "-m", "recipes.benchmarks.convergence", "--quick", "--clock", "virtual",
            "--device_profile", H200, "--bandwidth", "100mbit", "--budget_virtual_seconds", "80",
            "--methods", "diloco_goodput", "--inner_steps", "5", "--eval_every_rounds", "2", "--seeds", "1",
            "--budget_tokens", "200000",
            "--set", "world_size=2", "--set", 'data.corpus="builtin:python-docs"', "--set", "data.eval_blocks=32",
            "--output_dir", str(out), "--cache_dir", os.path.join(REPO, "outputs", "cache"),
        ]  # fmt: skip
        done = subprocess.run(command, capture_output=True, text=True, timeout=600, cwd=REPO)
        assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
        result = json.loads((out / "diloco_goodput" / "seed-42" / "100mbit" / "result.json").read_text())
        assert result["world_size"] == 2
        return result

    first, second = run("a"), run("b")
    ends = first["virtual_round_ends"]
    assert len(ends) >= 3 and ends == second["virtual_round_ends"]
    # Stopped at the first round end after its budget (× 1.5), before its token ceiling (1.5 × 200,000) binds (a
    # budget of 120 s met that ceiling first once the rule's requests only grew).
    assert ends[-1][1] >= 80 * 1.5 > ends[-2][1]
    assert [p["eval_ppl"] for p in first["evals"]] == [p["eval_ppl"] for p in second["evals"]]
    assert [p["virtual_seconds"] for p in first["evals"]] == [p["virtual_seconds"] for p in second["evals"]]
    assert [r["requested_batch_sizes"] for r in first["round_log"]] == [
        r["requested_batch_sizes"] for r in second["round_log"]
    ]
