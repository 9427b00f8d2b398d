"""The wall-clock model of `recipes/benchmarks/wallclock/`: its formulas on hand-computed cases (fast, no torch)."""

import dataclasses
import json

import pytest

from adloco_hf.instances.table import Instance, MergePlan
from adloco_hf.reporting.run_log import RunLog, load_rounds
from adloco_hf.rounds.rows import RoundLine
from recipes.benchmarks.toolkit import link_model
from recipes.benchmarks.wallclock import replay as replays
from recipes.benchmarks.wallclock import runs, scenario, validate


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


def test_profile_interpolates_and_switch_mode_splits_the_step():
    profile = link_model.DeviceProfile({1: 0.2, 4: 0.5, 8: 0.9}, optimizer_seconds=0.05, step_overhead_seconds=0.01)
    assert profile.forward_backward_seconds(6) == pytest.approx(0.7)
    assert profile.forward_backward_seconds(12) == pytest.approx(1.3)  # linear beyond the last point
    # A request of 20 above γ × max = 16: three micro-batches 7, 7, 6 and one optimizer step.
    accumulating = {"batch_size": 20, "micro_batch_size": 7, "accumulation_steps": 3}
    step = 0.8 + 0.8 + 0.7 + 0.05 + 0.01
    assert replays.instance_compute_seconds(accumulating, 10, profile, statistics_step=False) == pytest.approx(
        10 * step
    )
    assert 10 * step != pytest.approx(10 * (profile.forward_backward_seconds(20) + 0.06))
    # A request of 12 within γ × max is capped at the micro-batch 8: the step runs 8 samples, not 12.
    capped = {"batch_size": 12, "micro_batch_size": 8, "accumulation_steps": 1}
    assert replays.instance_compute_seconds(capped, 10, profile, statistics_step=False) == pytest.approx(10 * 0.96)
    # The statistics step of a round runs its batch as two halves.
    with_stats = replays.instance_compute_seconds(capped, 10, profile, statistics_step=True)
    assert with_stats == pytest.approx(9 * 0.96 + (0.5 + 0.5 + 0.06))
    # A device that holds 4 sequences at once runs the 8 as two micro-batches.
    assert replays.micro_batches(8, 1, device_max_micro_batch=4) == [4, 4]
    assert replays.micro_batches(20, 3) == [7, 7, 6]


def test_merge_messages_and_their_time():
    before = (Instance(0, (0,), 4), Instance(1, (1,), 4))
    plan = MergePlan(0, 1, (0.5, 0.5), (4.0, 4.0), before, (Instance(0, (0, 1), 4),))
    messages = link_model.merge_messages(plan, numel=1000, with_momentum=True, inner_state_bytes=8000)
    assert [(kind, src, dst) for kind, src, dst, _ in messages] == [
        ("merge_input", 1, 0),
        ("global", 0, 1),
        ("inner", 0, 1),
    ]
    # 1000 B/s, 0.5 s per tensor: φ + momentum (4000 B each) twice, then the inner state's length and bytes.
    link = link_model.Link(8000, 0.5)
    expected = 2 * (0.5 + 4) + 2 * (0.5 + 4) + (0.5 + 0.008) + (0.5 + 8)
    assert link_model.sequential_messages_seconds([(s, d, t) for _, s, d, t in messages], link) == pytest.approx(
        expected
    )
    no_momentum = link_model.merge_messages(plan, numel=1000, with_momentum=False, inner_state_bytes=8000)
    assert no_momentum[0][3] == [4000.0]
    # Messages between disjoint pairs overlap; messages sharing a rank wait for each other.
    assert link_model.sequential_messages_seconds([(0, 1, [1000]), (2, 3, [1000])], link) == pytest.approx(1.5)
    assert link_model.sequential_messages_seconds([(0, 1, [1000]), (1, 2, [1000])], link) == pytest.approx(3.0)


def _line(step, instance, workers, *, merged_from=(), tokens=1280, comm_bytes=0):
    return RoundLine(
        outer_step=step,
        global_step=10 * step,
        instance=instance,
        workers=list(workers),
        batch_size=4,
        next_batch_size=4,
        micro_batch_size=4,
        accumulation_steps=1,
        lr_factor=1.0,
        samples=40 * len(workers),
        tokens=tokens,
        train_loss=1.0,
        grad_variance=float("nan"),
        grad_sq_norm=float("nan"),
        grad_ip_variance=float("nan"),
        grad_orth_variance=float("nan"),
        stats_dof=0.0,
        pseudo_grad_norm=1.0,
        comm_bytes=comm_bytes,
        comm_seconds=0.0,
        outer_seconds=0.0,
        merged_from=list(merged_from),
    )


def test_replay_of_a_rounds_file(tmp_path):
    log = RunLog(str(tmp_path))
    log.start(resumed_outer_step=None, resumed_global_step=None)
    # Round 1: instances 0 (workers 0, 1) and 1 (workers 2, 3); 1 merges into 0. Round 2: one instance of 4.
    log.write_rounds([_line(1, 0, (0, 1), merged_from=[1]).to_json(), _line(1, 1, (2, 3)).to_json()])
    log.write_rounds([_line(2, 0, (0, 1, 2, 3), tokens=2560).to_json()])
    facts = replays.RunFacts(numel=1000, world_size=4, pseudo_grad_bytes=2, with_momentum=True, statistics=False)
    profile = link_model.DeviceProfile({4: 1.0})
    link = link_model.Link(8000, 0.1)  # 1000 B/s
    replay = replays.replay_adloco(load_rounds(tmp_path), facts, profile, link)
    start = 0.1 + 3 * 4.0  # rank 0 sends the 4000 B of initial weights to 3 ranks, one after the other
    control = 2 * 3 * 0.1
    # Round 1: 10 steps of 1 s; bf16 payload 2000 B over 2 workers; the merge: 2 → 0 (φ, momentum), 0 → 1, 2, 3
    # (φ, momentum), 0 → 2, 3 (inner state), all through rank 0, then its all-gather.
    merge = 4 * 2 * (0.1 + 4.0) + 2 * ((0.1 + 0.008) + (0.1 + 8.0)) + 3 * 0.1
    round1 = 10 + 2 * (0.1 + 1.0) + merge + control
    round2 = 10 + 6 * (0.1 + 0.5) + control
    rounds = replay["rounds"]
    assert rounds[0]["merge_seconds"] == pytest.approx(merge)
    assert rounds[0]["wall_seconds"] == pytest.approx(round1)
    assert rounds[1]["wall_seconds"] == pytest.approx(round2)
    assert replay["total"]["wall_seconds"] == pytest.approx(start + round1 + round2)
    assert replay["total"]["final_merge_seconds"] == 0.0  # one instance left: nothing to merge at the end
    assert replay["total"]["compute_seconds"] == pytest.approx(20)
    assert rounds[0]["modelled_bytes"] == pytest.approx(2 * 2000 + 2 * 2000 + 4 * 8000 + 2 * 8008)
    assert rounds[1]["modelled_bytes"] == pytest.approx(6 * 2000)
    assert replay["total"]["modelled_bytes"] == pytest.approx(3 * 4000 + rounds[0]["modelled_bytes"] + 6 * 2000)
    assert replay["total"]["tokens"] == 1280 * 2 + 2560
    # Time at tokens: linear within the round that holds them.
    assert replays.seconds_at_tokens(replay, 2560 + 1280) == pytest.approx(start + round1 + round2 / 2)
    assert replays.seconds_at_tokens(replay, 10**9) is None
    # An all-reduce merge (merge_transport="all_reduce") is a ring over the 4 members of the bytes its line logs
    # (here 6 payloads of 3000 B: a compact merge of 1000 parameters), not the point-to-point messages.
    lines = load_rounds(tmp_path)
    lines[0]["merge_bytes"] = 6 * 3000
    ring = dataclasses.replace(facts, merge_transport="all_reduce")
    merged = replays.replay_adloco(lines, ring, profile, link)["rounds"][0]
    assert merged["merge_seconds"] == pytest.approx(2 * 3 * (0.1 + 750 / 1000) + 3 * 0.1)  # and its all-gather
    assert merged["wall_seconds"] == pytest.approx(round1 - merge + merged["merge_seconds"])
    assert merged["modelled_bytes"] == pytest.approx(2 * 2000 + 2 * 2000 + 6 * 3000)


def test_final_merge_when_instances_are_left(tmp_path):
    log = RunLog(str(tmp_path))
    log.start(resumed_outer_step=None, resumed_global_step=None)
    log.write_rounds([_line(1, 0, (0,)).to_json(), _line(1, 1, (1,)).to_json()])
    facts = replays.RunFacts(numel=1000, world_size=2, statistics=False)
    link = link_model.Link(8000, 0.1)
    replay = replays.replay_adloco(load_rounds(tmp_path), facts, link_model.DeviceProfile({4: 1.0}), link)
    # Rank 1 sends φ (4000 B) to rank 0, which broadcasts the merged φ back; then a small all-gather.
    assert replay["total"]["final_merge_seconds"] == pytest.approx((0.1 + 4) + (0.1 + 4) + 0.1)
    assert replay["rounds"][0]["all_reduce_seconds"] == 0.0  # one worker per instance: no all-reduce
    assert replay["total"]["modelled_bytes"] == pytest.approx(4000 + 4000 + 4000)  # start, φ to rank 0, broadcast


def test_ddp_step_time():
    profile = link_model.DeviceProfile({4: 0.4}, optimizer_seconds=0.1)
    link = link_model.Link(8e9, 1e-3)  # 1 GB/s
    step = replays.ddp_step_seconds(4, 4, 10**6, profile, link)
    # 4 MB of fp32 gradients in DDP's buckets (1 MiB, then the rest): 6 steps of latency per bucket, bytes once.
    comm = 2 * 6 * 1e-3 + 6 * (4e6 / 4) / 1e9
    assert step["comm_seconds"] == pytest.approx(comm)
    assert step["wall_seconds"] == pytest.approx(0.5 + comm)
    overlapped = replays.ddp_step_seconds(4, 4, 10**6, profile, link, overlap=1.0)
    assert overlapped["wall_seconds"] == pytest.approx(0.5)  # hidden behind the 0.4 s forward/backward


def test_tokens_to_target():
    curve = [[0, 1000.0], [100, 100.0], [200, 50.0]]
    assert replays.tokens_to_target(curve, 100.0) == pytest.approx(100)
    # log-linear: halfway in log between 1000 and 100 is √(1000 × 100).
    assert replays.tokens_to_target(curve, (1000 * 100) ** 0.5) == pytest.approx(50)
    assert replays.tokens_to_target(curve, 10.0) is None


def _ddp_folder(path, world=2):
    path.mkdir()
    spec = {"kind": "ddp", "world_size": world, "block_size": 8, "train": {"batch_size": 2, "inner_steps": 5}}
    (path / "spec.json").write_text(json.dumps(spec))
    (path / "result.json").write_text(json.dumps({"steps": 10, "parameters": 1000, "tokens": 10 * world * 16}))
    return str(path)


def test_validation_errors_from_a_links_results_file(tmp_path):
    folder = _ddp_folder(tmp_path / "ddp")
    links = {
        "bandwidths": {
            "10mbit": {
                "ddp": {
                    "method": "ddp",
                    "bandwidth_bits_per_second": 1e7,
                    "wall_seconds": 2.5,
                    "folder": folder,
                    "to_target": {"500": {"tokens": 160, "seconds": 1.0}},  # 160 tokens: 5 steps of 2 × 2 × 8
                }
            },
            "100mbit": {
                "ddp": {"method": "ddp", "bandwidth_bits_per_second": 1e8, "wall_seconds": 3.0, "folder": folder}
            },
        }
    }
    profile = link_model.DeviceProfile({2: 0.2})
    rows = validate.validate(links, profile, latency=1e-3)
    by_bw = {r["bandwidth_bits_per_second"]: r for r in rows}
    # 10 Mbit/s: 4000 B gradients, ring of 2: 2 × (1 ms + 2000 B / 1.25 MB/s) per step; 4000 B broadcast at start.
    predicted_10 = (1e-3 + 4000 / 1.25e6) + 10 * (0.2 + 2 * (1e-3 + 2000 / 1.25e6))
    assert by_bw[1e7]["predicted_seconds"] == pytest.approx(predicted_10)
    assert by_bw[1e7]["relative_error"] == pytest.approx((predicted_10 - 2.5) / 2.5)
    assert {r["role"] for r in rows} == {"prediction"}
    at_target = (1e-3 + 4000 / 1.25e6) + 5 * (0.2 + 2 * (1e-3 + 2000 / 1.25e6))
    assert by_bw[1e7]["to_target"][0]["predicted_seconds"] == pytest.approx(at_target)
    assert by_bw[1e7]["to_target_mean_abs_error"] == pytest.approx(abs(at_target - 1.0))
    # Calibrated on the highest bandwidth: its compute is scaled to match it exactly, the other is predicted.
    calibrated = {
        r["bandwidth_bits_per_second"]: r for r in validate.validate(links, profile, latency=1e-3, calibrate="highest")
    }
    comm_100 = (1e-3 + 4000 / 1.25e7) + 10 * 2 * (1e-3 + 2000 / 1.25e7)
    factor = (3.0 - comm_100) / 2.0
    assert calibrated[1e8]["role"] == "calibration"
    assert calibrated[1e8]["relative_error"] == pytest.approx(0.0, abs=1e-12)
    expected = (1e-3 + 4000 / 1.25e6) + 10 * (0.2 * factor + 2 * (1e-3 + 2000 / 1.25e6))
    assert calibrated[1e7]["predicted_seconds"] == pytest.approx(expected)
    assert calibrated[1e7]["relative_error"] == pytest.approx((expected - 2.5) / 2.5)
    assert "calibration" in validate.format_validation(list(calibrated.values()))


def test_run_resolves_convergence_seed_folders(tmp_path, monkeypatch, capsys):
    from recipes.benchmarks.wallclock.__main__ import main

    method = tmp_path / "ddp"
    method.mkdir()
    _ddp_folder(method / "seed-10")
    _ddp_folder(method / "seed-3", world=4)
    assert runs.resolve_run_folder(str(method)) == str(method / "seed-3")  # by seed, numerically
    assert runs.resolve_run_folder(str(method), 10) == str(method / "seed-10")
    assert runs.resolve_run_folder(str(method), 7) is None
    assert runs.resolve_run_folder(str(method / "seed-10")) == str(method / "seed-10")  # a run folder given directly
    monkeypatch.chdir(tmp_path)  # main() changes to the repository root; restored after the test
    common = ["--run", str(method), "--step_seconds", "2=0.2", "--output_dir", str(tmp_path / "out")]
    replay = main(common)
    assert "(seed 3)" in capsys.readouterr().out
    assert replay["seed"] == "3" and replay["facts"]["world_size"] == 4
    replay = main([*common, "--seed", "10"])
    assert "(seed 10)" in capsys.readouterr().out
    assert replay["run"] == str(method / "seed-10") and replay["facts"]["world_size"] == 2
    assert json.loads((tmp_path / "out" / "replay.json").read_text())["seed"] == "10"
    with pytest.raises(SystemExit, match="seed-7"):
        main([*common, "--seed", "7"])


def test_calibration_refuses_a_run_faster_than_its_predicted_communication(tmp_path):
    folder = _ddp_folder(tmp_path / "ddp")
    # 10 kbit/s: the 4000 B broadcast and 10 all-reduces of 2 × 2000 B alone take about 35 s, measured 3 s.
    entry = {"method": "ddp", "bandwidth_bits_per_second": 1e4, "wall_seconds": 3.0, "folder": folder}
    with pytest.raises(ValueError, match="predicted communication .* is not below the measured wall time"):
        validate.validate({"ddp": entry}, link_model.DeviceProfile({2: 0.2}), latency=1e-3, calibrate="highest")
    assert (
        validate.validate({"ddp": entry}, link_model.DeviceProfile({2: 0.2}), latency=1e-3)[0]["role"] == "prediction"
    )


def test_measured_ratios_skip_failed_methods():
    curve = [[0, 1000.0], [100, 100.0], [200, 50.0]]
    convergence = {
        "methods": {
            "ddp": {"curve": curve},
            "diloco": {"curve": [[0, 1000.0], [200, 100.0], [400, 60.0]]},
            "adloco": {"error": "exit 1", "seed_results": {}},
        }
    }
    info = scenario.measured_ratios(convergence)
    assert info["target_ppl"] == 60.0  # the worst of the best perplexities
    assert set(info["ratios"]) == {"ddp", "diloco"} and info["skipped"] == {"adloco": "exit 1"}
    assert info["ratios"]["diloco"] == pytest.approx(400 / replays.tokens_to_target(curve, 60.0))
    convergence["methods"]["ddp"] = {"error": "exit 1"}
    with pytest.raises(ValueError, match="no ddp run"):
        scenario.measured_ratios(convergence)


def test_the_goodput_replay_chooses_with_the_librarys_rule_on_the_scenarios_costs():
    from adloco_hf.batch.goodput import GoodputModel, choose_request
    from adloco_hf.batch.switch_mode import SwitchMode
    from recipes.benchmarks.wallclock.goodput import GoodputAssumptions, goodput_lines, step_time_model

    # A pass costs 0.02 s plus 0.03 s a sequence.
    profile = link_model.DeviceProfile(
        {1: 0.02 + 0.03, 16: 0.02 + 0.03 * 16}, optimizer_seconds=0.01, outer_seconds=0.5
    )
    slow, fast = link_model.Link(1e8), link_model.Link(1e11)
    times = step_time_model(profile, slow, numel=10**8, workers=8, grad_bytes=2)
    # α and β from the profile's two points; C is the outer step's work, the ring all-reduce and two control rounds.
    assert times.per_pass == pytest.approx(0.02) and times.per_sample == pytest.approx(0.03)
    assert times.per_step == 0.01
    ring = link_model.ring_all_reduce_seconds(2 * 10**8, 8, slow, link_model.OUTER_BUCKET_NUMEL * 2)
    assert times.per_round == pytest.approx(0.5 + ring + link_model.control_seconds(8, slow, 2))
    assumptions = GoodputAssumptions(noise_start_tokens=64 * 2048, noise_end_tokens=64 * 2048, cap=64)
    common = dict(workers=8, batch=8, micro_batch=16, inner_steps=50, sequence_length=2048, target_tokens=2e8)
    lines, summary = goodput_lines(times, assumptions, **common)
    # Every round's choice is the rule's, from the request the round ran.
    for line in lines:
        model = GoodputModel(times, line["noise_scale"], 50, 8, 1, SwitchMode(16, 2.0), 8)
        choice = choose_request(model, current=line["batch_size"], low=8, high=64, hysteresis=0.05)
        assert line["next_batch_size"] == choice.request
    assert summary["max_batch"] > 8 and summary["weighted_tokens"] >= 2e8
    # More tokens than at the initial batch (each is worth less at a larger batch), in fewer rounds.
    assert summary["tokens"] > 2e8 and summary["rounds"] < 2e8 / (8 * 8 * 50 * 2048)
    # On a fast link the round costs nothing to amortise: the batch stays at the initial one.
    _, fast_summary = goodput_lines(step_time_model(profile, fast, numel=10**8, workers=8, grad_bytes=2),
                                    assumptions, **common)  # fmt: skip
    per_round = 8 * 8 * 50 * 2048
    assert fast_summary["max_batch"] == 8 and fast_summary["tokens"] == -(-2e8 // per_round) * per_round
