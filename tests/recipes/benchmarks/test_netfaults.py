"""`faults network` (`recipes/benchmarks/faults/network/`, `toolkit/testbeds/link_faults.py`): the scenarios, the links'
commands and their undo on every exit, when each action takes effect, the figures of a run, the targets and the table
(pure: no namespace is made here; `test_netfaults_end_to_end.py` runs one scenario on the testbed)."""

import json

import pytest

from recipes.benchmarks.faults import network as netfaults
from recipes.benchmarks.faults.network.driver import event_time, worker_spec
from recipes.benchmarks.faults.network.phases import Phases
from recipes.benchmarks.faults.progress import Progress
from recipes.benchmarks.toolkit.testbeds.link_faults import (
    LinkFaults,
    cut_command,
    heal_commands,
    partition_commands,
    restore_command,
)
from recipes.benchmarks.toolkit.testbeds.testbed import LinkPlan


PLAN = LinkPlan(workers=4, prefix="adnf", subnet="10.213.89")


class FakeTestbed:  # the testbed's plan and rate, without namespaces (the commands are recorded, not run)
    plan = PLAN
    rate = (10_000_000, 65536, 50)


def test_at_least_seven_network_scenarios_each_a_fault_of_the_issue():
    table = netfaults.scenarios(30.0)
    assert len(table) >= 7
    kinds = {action.kind for s in table.values() for action in s.actions}
    assert {"cut", "restore", "partition", "heal", "slow"} <= kinds
    assert {s.launcher for s in table.values()} == {"accelerate", "torchrun"}
    # an outage longer than worker_timeout expects a restart; a brief one none
    assert table["down_in_allreduce"].expect == "no_restart"
    assert table["down_then_back"].expect == "restart"
    longer = table["down_then_back"].actions[1].when.delay
    assert longer > 30.0 and netfaults.scenarios(60.0)["down_then_back"].actions[1].when.delay > 60.0


def test_flapping_alternates_cut_and_restore_for_the_given_seconds():
    actions = netfaults.flapping(2, 15, down=3.0, up=3.0, seconds=60.0)
    assert [a.kind for a in actions] == ["cut", "restore"] * 10
    assert actions[0].when == netfaults.When("step", 15)
    assert [a.when.delay for a in actions[1:4]] == [3.0, 3.0, 3.0]
    assert all(a.workers == (2,) for a in actions)


def test_bad_scenarios_are_refused():
    with pytest.raises(ValueError, match="event must be"):
        netfaults.When("lunch")
    with pytest.raises(ValueError, match="unknown action"):
        netfaults.Action("unplug", (1,), netfaults.When("step"))
    with pytest.raises(ValueError, match="launcher must be"):
        netfaults.Scenario("x", "x", (), launcher="mpirun")


def test_a_cut_sets_the_bridge_port_down_and_a_partition_moves_ports_to_a_second_bridge():
    assert cut_command(PLAN, 3) == ["ip", "-n", "adnf-br", "link", "set", "lnk3b", "down"]
    assert restore_command(PLAN, 3)[-1] == "up"
    split = partition_commands(PLAN, [2, 3])
    assert split[0] == ["ip", "-n", "adnf-br", "link", "add", "br1", "type", "bridge"]
    assert ["ip", "-n", "adnf-br", "link", "set", "lnk2b", "master", "br1"] in split
    assert heal_commands(PLAN, [2, 3])[-1] == ["ip", "-n", "adnf-br", "link", "delete", "br1"]


def test_every_fault_is_undone_on_exit_even_when_one_undo_fails(capsys):
    ran = []

    def run(command):
        ran.append(command)
        if command == restore_command(PLAN, 1):
            raise RuntimeError("no such device")

    with pytest.raises(KeyboardInterrupt):
        with LinkFaults(FakeTestbed(), run=run) as faults:
            faults.cut(1)
            faults.cut(2)
            faults.slow(0, 100_000)
            faults.partition([2, 3])
            raise KeyboardInterrupt  # Ctrl-C in the middle of a scenario
    assert restore_command(PLAN, 2) in ran  # tried after worker 1's restore failed
    assert ran[-1] == heal_commands(PLAN, [2, 3])[-1]
    assert any("10000000bit" in part for command in ran for part in command)  # worker 0 back at the testbed's rate
    assert "could not undo on worker 1" in capsys.readouterr().out
    assert [e.action for e in faults.events] == ["cut", "cut", "slow", "partition", "restore", "unslow", "heal"]


def _write(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_an_action_takes_effect_after_its_event_in_the_current_attempt(tmp_path):
    _write(tmp_path / "progress-rank0.jsonl", [
        {"attempt": 0, "started_at_step": 0}, {"attempt": 0, "step": 19, "time": 100.0},
        {"attempt": 0, "step": 20, "time": 101.0},
    ])  # fmt: skip
    _write(tmp_path / "phases-rank1.jsonl", [
        {"attempt": 0, "phase": "outer", "edge": "begin", "step": 10, "time": 50.0},
        {"attempt": 0, "phase": "outer", "edge": "begin", "step": 20, "time": 100.5},
    ])  # fmt: skip
    progress, phases = Progress(str(tmp_path), 4), Phases(str(tmp_path), 4)
    progress.read()
    phases.read()
    outer = netfaults.Action("cut", (3,), netfaults.When("outer", 20, 1.0))
    assert event_time(outer, progress, phases, None) == 100.5
    assert event_time(netfaults.Action("cut", (3,), netfaults.When("merge", 30)), progress, phases, None) is None
    assert event_time(netfaults.Action("cut", (3,), netfaults.When("step", 20)), progress, phases, None) == 101.0
    assert event_time(netfaults.Action("restore", (3,), netfaults.When("previous", delay=5)), progress, phases, 7) == 7


def test_torchrun_scenarios_accept_a_world_of_one_machine_fewer():
    table = netfaults.scenarios(30.0)
    spec = worker_spec("out", "probe", table["down_for_good"], {"max_steps": 80, "batch_size_cap": 4}, 4)
    assert spec["world_size"] == [3, 4] and spec["resume"] == "auto" and spec["phases"]
    assert worker_spec("o", "p", table["partition"], {"max_steps": 80, "batch_size_cap": 4}, 4)["world_size"] == [4]


def test_a_restart_is_measured_from_the_fault_to_the_named_worker_and_the_next_attempt():
    events = [{"time": 100.0, "action": "cut"}, {"time": 160.0, "action": "restore"}]
    lines = [(99.0, 0, "old WorkerTimeoutError"), (131.0, 2, "[rank0]: adloco_hf...WorkerTimeoutError: AdLoCo ...")]
    starts = {0: {0: 0, 1: 0}, 1: {0: 40, 1: 40}}
    steps = {0: {0: [(44, 98.0), (45, 99.0)], 1: [(45, 99.5)]}, 1: {0: [(41, 170.0)], 1: [(41, 171.0)]}}
    row = netfaults.summary(events=events, lines=lines, starts=starts, steps=steps, inner_steps=10, codes=[0, 0],
                            stopped_at_deadline=False)  # fmt: skip
    assert (row["fault_at"], row["restored_at"], row["restarts"]) == (100.0, 160.0, 1)
    assert (row["detected_seconds"], row["named_by_machine"]) == (31.0, 2)
    assert row["first_step_seconds"] == 70.0 and row["work_lost_steps"] == 5
    assert row["message"].startswith("adloco_hf")


def test_work_lost_skips_an_attempt_that_failed_before_training():
    # attempt 1 failed before its first step (the partition still on); attempt 2 resumed from checkpoint-40
    starts = {0: {0: 0}, 1: {}, 2: {0: 40, 1: 40}}
    steps = {0: {0: [(47, 1.0)], 1: [(48, 1.0)]}, 2: {0: [(41, 9.0)]}}
    assert netfaults.work_lost(starts, steps) == 8


def test_without_a_restart_the_first_step_after_is_the_next_round_end():
    steps = {0: {0: [(18, 90.0), (19, 95.0), (20, 104.0), (21, 105.0)], 1: [(20, 103.0)]}}
    assert netfaults.first_step_after({0: {0: 0}}, steps, 100.0, 10) == 103.0
    assert netfaults.work_lost({0: {0: 0}}, steps) == 0


def _result(name, **overrides):
    row = {"scenario": name, "expect": "no_restart", "ended_by_itself": True, "work_lost_steps": 0, "restarts": 0,
           "merged_max_difference": 0.0, "detected_seconds": None}  # fmt: skip
    return {**row, **overrides}


def test_the_targets_name_what_missed():
    results = [
        _result("brief"),
        _result("brief_restarted", restarts=1),
        _result("dead", expect="restart", restarts=1, detected_seconds=75.0, work_lost_steps=30, resumed_from=40,
                message="adloco_hf.common.distributed.WorkerTimeoutError: AdLoCo, round 5 (step 50): worker rank(s) 2"),
        _result("elastic", expect="elastic", restarts=1, detected_seconds=40.0, merged_max_difference=0.01,
                difference_explained="re-split"),
    ]  # fmt: skip
    checks = {(c["scenario"], c["target"]): c["holds"] for c in netfaults.check_targets(results, 20)}
    assert checks[("brief", "no restart")] and not checks[("brief_restarted", "no restart")]
    assert not checks[("dead", "named within 60 s")]
    assert not checks[("dead", "work lost <= one checkpoint interval")]
    assert checks[("elastic", "named within 60 s")] and ("elastic", "merged model within 1e-6") not in checks
    results.append(_result("store", expect="restart", exit_codes=[1, 1, 1, 1], merged_max_difference=None))
    text = netfaults.format_report(results, netfaults.check_targets(results, 20), {"workers": 4})
    assert "the launches failed (exit codes [1, 1, 1, 1]), no merged model" in text
    assert "target dead: named within 60 s: MISSED" in text
    assert "nothing: the run rode it out" in text and "adloco_hf.common" not in text
    assert (
        " WorkerTimeoutError: AdLoCo, round 5 (step 50): worker rank(s) 2 -> 1 restart(s), resumed from checkpoint-40"
        in text
    )


def test_unknown_scenarios_are_refused_and_no_root_skips(monkeypatch, capsys, tmp_path):
    with pytest.raises(SystemExit):
        netfaults.parse_args(["--scenarios", "partition,no_such_fault"])
    assert "unknown scenario(s) ['no_such_fault']" in capsys.readouterr().err
    monkeypatch.setattr(
        "recipes.benchmarks.faults.network.cli.unavailable_reason", lambda: "network namespaces need root"
    )
    assert netfaults.main(["--scenarios", "partition", "--output_dir", str(tmp_path)]) is None
    assert "skipped: network namespaces need root" in capsys.readouterr().out


def test_the_docs_section_is_written_between_its_markers_from_the_report_alone(tmp_path):
    results = [_result("brief"), _result("dead", expect="restart", restarts=1, detected_seconds=75.0)]
    settings = {"workers": 4, "bandwidth": "10mbit", "worker_timeout": 30.0, "ddp_timeout": 30, "save_steps": 20}
    report = {"settings": settings, "scenarios": results, "checks": netfaults.check_targets(results, 20)}
    page = tmp_path / "faults.md"
    page.write_text(f"# Faults\n\n{netfaults.DOC_BEGIN}\nold table\n{netfaults.DOC_END}\n\nafter\n")
    netfaults.write_doc(str(page), report)
    text = page.read_text()
    assert "old table" not in text and text.endswith(f"{netfaults.DOC_END}\n\nafter\n")
    assert netfaults.doc_section(report) in text
    assert "worker_timeout 30 s, ddp_timeout 30 s" in text and "Missed: dead: named within 60 s." in text
    page.write_text("# Faults without markers\n")
    with pytest.raises(ValueError, match="has no network faults section"):
        netfaults.write_doc(str(page), report)


def test_machine_0_hosts_the_torchrun_rendezvous_and_every_machine_runs_in_its_namespace():
    from recipes.benchmarks.faults.network.launch import machine_command

    first = machine_command(PLAN, 0, "torchrun", "{}", 29500, "run")
    other = machine_command(PLAN, 2, "torchrun", "{}", 29500, "run")
    assert first[:4] == ["ip", "netns", "exec", "adnf-w0"] and other[3] == "adnf-w2"
    assert "is_host=true" in first[first.index("--rdzv-conf") + 1]
    assert "is_host=false" in other[other.index("--rdzv-conf") + 1]
    # each machine's own address, not its host name (the loopback in a namespace), for the workers' MASTER_ADDR
    assert first[first.index("--local-addr") + 1] == "10.213.89.10"
    assert other[other.index("--local-addr") + 1] == "10.213.89.12"
    assert (
        other[other.index("--nnodes") + 1] == "3:4"
        and other[other.index("--rdzv-endpoint") + 1] == "10.213.89.10:29500"
    )
    static = machine_command(PLAN, 1, "accelerate", "{}", 29500, "run")
    assert static[static.index("--max_restarts") + 1] == "3" and static[static.index("--machine_rank") + 1] == "1"


def test_the_defaults_scenarios_run_the_librarys_default_timeouts_and_share_the_reference_run():
    from recipes.benchmarks.faults.network.cli import run_timeouts

    table = netfaults.scenarios(30.0)
    defaults = [s for name, s in table.items() if name.endswith("_defaults")]
    assert {s.name for s in defaults} >= {"down_then_back_defaults", "flapping_defaults", "store_host_down_defaults"}
    for scenario in defaults:
        assert run_timeouts({"worker_timeout": 30.0, "ddp_timeout": 30, **scenario.config}) == {
            "worker_timeout": 1800.0,
            "ddp_timeout": 1800,
            "peer_timeout": 45.0,  # what AdLoCoConfig resolves
        }
        plain = table[scenario.name.removesuffix("_defaults")]
        assert scenario.reference_key == plain.reference_key  # the timeouts do not change what a run computes
        assert [a.kind for a in scenario.actions] == [a.kind for a in plain.actions]
    assert run_timeouts({"worker_timeout": 30.0, "ddp_timeout": 30})["peer_timeout"] == 0.0  # the watch off


def test_the_peer_watch_line_names_a_lost_worker():
    lines = [(100.0, 1, "training"), (146.0, 0, "AdLoCo: rank 0: worker rank(s) 2 gave no pulse for 45 s ...")]
    assert netfaults.detection(lines, 100.0) == (146.0, 0, lines[1][2])
