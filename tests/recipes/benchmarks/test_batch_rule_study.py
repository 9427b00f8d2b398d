"""`convergence --clock virtual --selection_seeds` (`convergence/study.py`, issue 51): the best fixed batch picked on
selection seeds and compared on the others, a seed that never reaches the target counted apart (never a lower
bound in the mean) and in a sign test, a user's guess, the targets; and the virtual clock's pricing of the startup
profile's link probe."""

import json
import math
import os

import pytest

from recipes.benchmarks import convergence
from recipes.benchmarks.convergence import study
from recipes.benchmarks.convergence.lr_study import compare_schedules
from recipes.benchmarks.toolkit import settings, stats
from recipes.benchmarks.toolkit.clock import device_profiles
from recipes.benchmarks.toolkit.clock.link_model import DeviceProfile, Link, ring_all_reduce_seconds
from recipes.benchmarks.toolkit.clock.virtual_clock import VirtualClock
from recipes.benchmarks.toolkit.paths import REPO


def points(pairs):
    return [{"seconds": s, "eval_ppl": p, "tokens": 0} for s, p in pairs]


# Selection seeds 100, 101: b8 ends lower than b4 at the 10-s budget in both (the best of the sweep).
SELECTION = {
    "diloco_b4": {100: points([(0, 1000), (10, 100)]), 101: points([(0, 1000), (10, 120)])},
    "diloco_b8": {100: points([(0, 1000), (10, 90)]), 101: points([(0, 1000), (10, 95)])},
    # the rule on the selection seeds (`--guess`): reaches b4's 100 at 4 s and b8's 90 at 5 s in seed 100; in
    # seed 101 b4's 120 at 6 s and never b8's 95 (it ends at 12.5 s at 96).
    "rule_startup": {100: points([(0, 1000), (4, 100), (5, 90), (12.5, 60)]), 101: points([(0, 1000), (6, 120), (12.5, 96)])},
}  # fmt: skip
# Comparison seeds 1, 2, 3: b8 ends at 90, 95, 100; b4 (not the best: never run there). The rule reaches b8's ppl at
# 5 s, at 12 s, and never (seed 3).
COMPARISON = {
    "diloco_b8": {s: points([(0, 1000), (10, t)]) for s, t in ((1, 90), (2, 95), (3, 100))},
    "rule_startup": {
        1: points([(0, 1000), (5, 90), (12.5, 50)]),
        2: points([(0, 1000), (12, 95), (12.5, 94)]),
        3: points([(0, 1000), (12.5, 101)]),
    },
}


def test_the_best_fixed_batch_is_chosen_on_the_selection_seeds_only():
    assert study.best_fixed({k: v for k, v in SELECTION.items() if k != "rule_startup"}, 10.0) == "diloco_b8"
    # A batch whose run ended before the budget in some seed is not a candidate.
    short = {"diloco_b4": SELECTION["diloco_b4"], "diloco_b8": {100: points([(0, 1000), (5, 80)])}}
    assert study.best_fixed(short, 10.0) == "diloco_b4"


def test_a_seed_that_never_reaches_the_target_is_counted_apart_and_as_slower():
    out = study.compare_study({"selection": SELECTION, "comparison": COMPARISON}, 10.0, "diloco_b8", "rule_startup")
    assert out["selection"]["diloco_b8"]["ppl_at_budget"] == pytest.approx(math.sqrt(90 * 95))
    rule = out["methods"]["rule_startup"]["time_vs_best_fixed"]
    assert rule["seeds"] == {1: pytest.approx(0.5), 2: pytest.approx(1.2)} and rule["never"] == [3]
    # The mean is over the seeds that reached: never a lower bound folded in.
    assert rule["interval"]["mean"] == pytest.approx(math.sqrt(0.5 * 1.2)) and rule["interval"]["n"] == 2
    assert (rule["faster"], rule["slower"]) == (1, 2) and rule["sign_test_p"] == pytest.approx(1.0)
    assert "time_vs_best_fixed" not in out["methods"]["diloco_b8"]
    # A user's guess: against b4 (seed 100: 4 / 10; seed 101: 6 / 10) and b8 (seed 100: 5 / 10; 101: never).
    guess = out["guess"]
    assert guess["seeds"] == {
        "diloco_b4/100": pytest.approx(0.4), "diloco_b4/101": pytest.approx(0.6), "diloco_b8/100": pytest.approx(0.5)
    }  # fmt: skip
    assert guess["never"] == ["diloco_b8/101"] and (guess["faster"], guess["slower"]) == (3, 1)
    targets = study.study_targets({"10gbit": out}, ["rule_startup"])
    assert [t["holds"] for t in targets.values()] == [False, True]  # 2 never > 1 allowed; the guess 0.49 <= 0.75
    text = study.format_study({"study": {"10gbit": out}, "selection_seeds": [100, 101], "study_targets": targets})
    assert "2 of 3" in text and "1:2 (1.000)" in text and "MISSED" in text and "3 of 4 pairs" in text


def test_the_sign_test_is_the_exact_binomial():
    assert stats.sign_test(8, 8) == pytest.approx(2 / 256)
    assert stats.sign_test(7, 8) == pytest.approx(2 * 9 / 256)
    assert stats.sign_test(4, 8) == 1.0 and stats.sign_test(0, 0) == 1.0
    assert stats.sign_test(1, 8) == stats.sign_test(7, 8)


def test_the_study_command_line():
    base = ["--clock", "virtual", "--device_profile", "docs/results/device_profiles/nvidia-h200-microllama.json",
            "--bandwidth", "10gbit", "--budget_virtual_seconds", "2"]  # fmt: skip
    args = convergence.parse_args([*base, "--methods", "diloco_b4", "rule_startup", "--selection_seeds", "2",
                                   "--guess", "rule_startup"])  # fmt: skip
    assert (args.selection_seeds, args.selection_seed, args.guess) == (2, 100, "rule_startup")
    assert args.argv[-4:] == ["--selection_seeds", "2", "--guess", "rule_startup"]
    for bad in (
        [*base, "--methods", "rule_startup", "--selection_seeds", "2"],  # no fixed batch to pick from
        [*base, "--methods", "diloco_b4", "--guess", "rule_startup"],  # a guess needs selection seeds
        ["--methods", "diloco_b4", "--selection_seeds", "2"],  # not virtual
    ):
        with pytest.raises(SystemExit):
            convergence.parse_args(bad)


def test_the_virtual_clock_prices_the_startup_profiles_link_probe_as_the_ring_alone():
    profile = DeviceProfile({1: 0.01}, optimizer_seconds=0.0, outer_seconds=0.5, statistics_seconds=0.5)
    links = [Link(1e8, 1e-4, 0.95), Link(1e10, 1e-4, 0.95)]
    clock = VirtualClock(profile, links, world=4, statistics=True, bytes_scale=10.0)
    clock.all_reduce(workers=4, payload_bytes=1000)
    assert clock.seconds == [pytest.approx(ring_all_reduce_seconds(10_000, 4, link)) for link in links]
    assert clock.compute_seconds == 0.0  # no local work: the outer step's own costs are not in a probe


def test_every_kept_device_profile_says_which_figures_were_measured_and_which_estimated(tmp_path):
    folder = os.path.join(REPO, "docs", "results", "device_profiles")
    profiles = 0
    for name in sorted(os.listdir(folder)):
        with open(os.path.join(folder, name)) as f:
            data = json.load(f)
        if "micro_batch_seconds" not in data:
            continue  # a raw measurement a profile was made from
        profile = device_profiles.load_profile(os.path.join(folder, name))
        assert {str(b) for b in profile["measured_sizes"]} <= set(profile["micro_batch_seconds"]), name
        assert all(profile["sources"][key] for key in device_profiles.PRICED), name
        profiles += 1
    assert profiles == 3
    h200 = device_profiles.load_profile(os.path.join(folder, "nvidia-h200-microllama.json"))
    assert h200["measured_sizes"] == [32] and "estimated" in h200["sources"]["optimizer_seconds"]
    unsourced = {k: v for k, v in h200.items() if k != "sources"} | {"sources": {"micro_batch_seconds": "measured"}}
    path = tmp_path / "profile.json"
    path.write_text(json.dumps(unsourced))
    with pytest.raises(ValueError, match="optimizer_seconds"):
        device_profiles.load_profile(str(path))


def test_the_startup_profiles_cost_is_counted_against_a_hundred_of_the_runs_own_rounds(tmp_path):
    argv = ["--clock", "virtual", "--device_profile", "docs/results/device_profiles/nvidia-h200-microllama.json",
            "--bandwidth", "10gbit", "--budget_virtual_seconds", "2", "--methods", "diloco_b4", "rule_startup",
            "--selection_seeds", "1"]  # fmt: skip
    shared = settings.shared_settings(convergence.parse_args(argv))
    folder = os.path.join(settings.method_spec("rule_startup", shared, str(tmp_path), seed=42)["output_dir"], "10gbit")
    os.makedirs(folder)
    with open(os.path.join(folder, "adloco_startup_profile.json"), "w") as f:
        json.dump({"seconds": 0.5}, f)
    # 10 rounds of 25 steps (one entry a round: [global step, virtual seconds]) ended at 20.5 virtual s, 0.5 of them
    # the profile's: 2 s a round, not 2 / 25 (the rounds, not the steps, divide).
    ends = [[25 * r, 0.5 + 2.0 * r] for r in range(1, 11)]
    runs = {"comparison": {"rule_startup": {"10gbit": {42: ({"virtual_round_ends": ends}, 0)}},
                           "diloco_b4": {"10gbit": {42: ({"virtual_round_ends": ends}, 0)}}}}  # fmt: skip
    (cost,) = study.profile_costs(runs, shared, str(tmp_path))["10gbit"]
    assert cost == {"method": "rule_startup", "seed": 42, "profile_seconds": 0.5, "round_seconds": 2.0,
                    "share_of_100_rounds": 0.5 / 200}  # fmt: skip


def test_the_learning_rate_comparison_pairs_each_schedule_with_the_reference_and_the_best_fixed_batch():
    def curve(*points):
        return [{"seconds": s, "eval_ppl": p} for s, p in points]

    curves = {
        "diloco_b16": {1: curve((0, 100), (10, 50))},  # the best fixed batch: 50 at the budget (10 s), reached at 10 s
        "sqrt": {1: curve((0, 100), (10, 80), (20, 50))},  # the reference: 80 at the budget, 50 at 20 s
        "held": {1: curve((0, 100), (5, 50), (10, 40))},  # 40 at the budget, 50 at 5 s
        "slow": {1: curve((0, 100), (10, 90), (12, 85))},  # never reaches 50
    }
    out = compare_schedules(curves, "sqrt", "diloco_b16", 10.0)
    assert set(out) == {"sqrt", "held", "slow"}
    assert out["sqrt"]["time_vs_best_fixed"]["seeds"][1] == pytest.approx(2.0, rel=1e-6)
    assert "ppl_vs_reference" not in out["sqrt"]
    assert out["held"]["time_vs_best_fixed"]["seeds"][1] == pytest.approx(0.5, rel=1e-6)
    assert out["held"]["ppl_vs_reference"]["geometric_mean"] == pytest.approx(0.5)
    assert out["slow"]["time_vs_best_fixed"]["never"] == [1] and out["slow"]["time_vs_best_fixed"]["seeds"] == {}
    assert out["slow"]["ppl_vs_reference"]["seeds"][1] == pytest.approx(90 / 80)


def test_the_rules_requests_are_kept_per_round_and_summarised_over_the_seeds():
    from recipes.benchmarks.convergence.virtual_runs import request_summary, run_summary

    def result(requests):  # one instance, then two after a split (the mean over the instances)
        log = [{"requested_batch_sizes": {"0": r}} for r in requests[:-1]]
        log.append({"requested_batch_sizes": {"0": requests[-1], "1": requests[-1] + 2}})
        return {"round_log": log, "tokens": 1, "rounds": len(log)}

    first = run_summary(result([8, 12, 16, 16, 20, 24, 24, 30]), 0)
    assert first["requests"] == [8, 12, 16, 16, 20, 24, 24, 31]
    second = run_summary(result([10, 10, 14]), 0)
    fixed = run_summary({"tokens": 1}, 0)  # a run without a round log asked for nothing
    assert fixed["requests"] == []
    summary = request_summary({42: first, 43: second, 44: fixed})
    assert summary["seeds"] == 2 and summary["first_rounds"] == 6
    assert summary["first"] == [8, 10] and summary["last"] == [15, 31]
    assert summary["mean_first"] == [pytest.approx(35 / 3), pytest.approx(16.0)]  # (10 + 10 + 15) / 3, 96 / 6
    assert request_summary({42: fixed}) is None
    assert summary["noise_scale"] is None  # no rounds file read yet
    first["noise_scale_median"], second["noise_scale_median"] = 30.0, 50.0
    assert request_summary({42: first, 43: second})["noise_scale"] == [30.0, 40.0, 50.0]


def test_a_rules_noise_scale_is_read_from_its_rounds_file(tmp_path):
    from recipes.benchmarks.convergence.virtual_runs import add_noise_scales

    profile = os.path.join(REPO, "docs", "results", "device_profiles", "nvidia-h200-microllama.json")
    args = convergence.parse_args(["--clock", "virtual", "--device_profile", profile, "--bandwidth", "1gbit",
                                   "--budget_virtual_seconds", "2", "--methods", "rule_startup_lr_held"])  # fmt: skip
    shared = settings.shared_settings(args)
    spec = settings.method_spec("rule_startup_lr_held", shared, str(tmp_path), seed=42)
    folder = os.path.join(spec["output_dir"], "1gbit") if settings.reads_clock(spec) else spec["output_dir"]
    os.makedirs(folder)
    with open(os.path.join(folder, "adloco_rounds.jsonl"), "w", encoding="utf-8") as f:
        for value in (None, 0.0, 30.0, 36.0, 50.0):  # a round without statistics logs none; 0 the rule never reads
            f.write(json.dumps({"outer_step": 1, "noise_scale": value}) + "\n")
    summaries = {"rule_startup_lr_held": {"1gbit": {42: {}, 43: {}}}}
    add_noise_scales(summaries, shared, str(tmp_path))
    assert summaries["rule_startup_lr_held"]["1gbit"][42]["noise_scale_median"] == 36.0
    assert summaries["rule_startup_lr_held"]["1gbit"][43]["noise_scale_median"] is None  # no rounds file
