"""The links testbed (`toolkit/testbeds/testbed.py`) and a run's machines on it (`toolkit/testbeds/machines.py`): the address plan, the
tc/ip commands, each machine's launch, and the teardown (with a fake `ip`: no namespace is created or deleted)."""

import os
import signal
import subprocess
import threading

import pytest

from recipes.benchmarks import links
from recipes.benchmarks.toolkit.testbeds import machines, testbed


def test_the_plan_names_namespaces_links_and_private_addresses():
    plan = testbed.LinkPlan(workers=4, prefix="adlkx", subnet="10.213.87")
    assert plan.namespaces == ["adlkx-br", "adlkx-w0", "adlkx-w1", "adlkx-w2", "adlkx-w3"]
    assert [plan.address(k) for k in range(4)] == ["10.213.87.10", "10.213.87.11", "10.213.87.12", "10.213.87.13"]
    assert (plan.veth(2), plan.peer(2)) == ("lnk2", "lnk2b")
    assert all(len(plan.peer(k)) <= 15 for k in range(200))  # Linux interface names
    for bad in ({"workers": 0}, {"prefix": "Bad Name"}, {"subnet": "10.213"}, {"subnet": "10.213.300"}):
        with pytest.raises(ValueError):
            testbed.LinkPlan(**bad)


def test_setup_builds_a_bridge_namespace_and_one_namespace_per_worker_with_loopback_up():
    plan = testbed.LinkPlan(workers=2, prefix="adlkx")
    commands = [" ".join(c) for c in testbed.setup_commands(plan)]
    assert commands[0] == "ip netns add adlkx-br"
    assert "ip -n adlkx-br link add br0 type bridge" in commands
    for k in (0, 1):
        ns = f"adlkx-w{k}"
        assert f"ip netns add {ns}" in commands
        assert f"ip -n {ns} link set lo up" in commands
        assert f"ip link add lnk{k} netns {ns} type veth peer name lnk{k}b netns adlkx-br" in commands
        assert f"ip -n {ns} addr add 10.213.87.{10 + k}/24 dev lnk{k}" in commands
        assert f"ip -n adlkx-br link set lnk{k}b master br0" in commands
    # Nothing is created in the root namespace but the veth pairs' creation itself (both ends go straight in).
    assert not [c for c in commands if c.startswith("ip link set") or c.startswith("ip addr")]


def test_rates_bursts_and_tbf_on_both_ends_of_every_link():
    assert testbed.parse_rate("100mbit") == 100_000_000
    assert testbed.parse_rate("1gbit") == 10**9
    assert testbed.parse_rate("500kbit") == 500_000
    assert testbed.parse_rate("12.5mbps") == 100_000_000  # tc's bps: bytes per second
    assert testbed.parse_rate("2048") == 2048
    for bad in ("fast", "-1mbit", "0mbit"):
        with pytest.raises(ValueError):
            testbed.parse_rate(bad)
    assert testbed.default_burst(10_000_000) == 64 * 1024
    assert testbed.default_burst(10**9) == 500_000  # 4 ms at 1 Gbit/s
    plan = testbed.LinkPlan(workers=3, prefix="adlkx")
    commands = testbed.tbf_commands(plan, 100_000_000, 65536, 50)
    assert len(commands) == 6
    ends = {(c[3], c[8]) for c in commands}
    assert ends == {(f"adlkx-w{k}", f"lnk{k}") for k in range(3)} | {("adlkx-br", f"lnk{k}b") for k in range(3)}
    assert (
        commands[0]
        == (
            "ip netns exec adlkx-w0 tc qdisc replace dev lnk0 root tbf rate 100000000bit burst 65536 latency 50ms"
        ).split()
    )


def test_each_machine_is_its_own_accelerate_launch_in_its_namespace():
    from accelerate.commands.launch import launch_command_parser

    plan = testbed.LinkPlan(workers=4, prefix="adlkx")
    command = machines.machine_command(plan, 2, "spec.json", 29555)
    assert command[:4] == ["ip", "netns", "exec", "adlkx-w2"]
    parsed = launch_command_parser().parse_args(command[7:])
    assert parsed.multi_gpu and parsed.num_processes == 4 and parsed.num_machines == 4
    assert parsed.machine_rank == 2 and parsed.main_process_ip == "10.213.87.10"
    assert parsed.main_process_port == 29555 and parsed.module
    assert parsed.training_script == "recipes.benchmarks.toolkit.worker"
    assert parsed.training_script_args == ["spec.json"]
    # Two machines of two processes each (processes_per_worker=2): 4 processes, 2 per machine.
    two = machines.machine_command(testbed.LinkPlan(workers=2, prefix="adlkx"), 1, "spec.json", 29555, 2)
    parsed = launch_command_parser().parse_args(two[7:])
    assert (parsed.num_processes, parsed.num_machines, parsed.machine_rank) == (4, 2, 1)


class FakeIp:
    """Stands in for `testbed._run`: records every command; `ip netns list` fails; `ip netns delete NS` answers
    from `deletes` (`{namespace: (returncode, stderr)}`, default success)."""

    def __init__(self, deletes=None):
        self.commands: list[list[str]] = []
        self.deletes = deletes or {}

    def __call__(self, command, check=True):
        command = list(command)
        self.commands.append(command)
        if command[:3] == ["ip", "netns", "list"]:
            raise subprocess.CalledProcessError(1, command, stderr="ip: cannot list")
        if command[:3] == ["ip", "netns", "delete"]:
            code, err = self.deletes.get(command[3], (0, ""))
            return subprocess.CompletedProcess(command, code, "", err)
        return subprocess.CompletedProcess(command, 0, "", "")  # ip netns pids: no process; setup commands

    def deleted(self) -> list[str]:
        return [c[3] for c in self.commands if c[:3] == ["ip", "netns", "delete"]]


def test_teardown_deletes_every_namespace_even_when_listing_fails(monkeypatch, capsys):
    plan = testbed.LinkPlan(workers=3, prefix="adlkx")
    absent = (1, 'Cannot remove namespace file "/run/netns/adlkx-w0": No such file or directory')
    fake = FakeIp({"adlkx-w0": absent, "adlkx-w2": (1, "RTNETLINK answers: Operation not permitted")})
    monkeypatch.setattr(testbed, "_run", fake)
    assert testbed.existing_namespaces() is None  # the listing failed: unknown, not "none"
    done = testbed.teardown(plan)
    assert fake.deleted() == plan.namespaces  # every namespace of the plan, listed or not
    assert done.removed == ["adlkx-br", "adlkx-w1"]
    assert list(done.failed) == ["adlkx-w2"] and "not permitted" in done.failed["adlkx-w2"]
    err = capsys.readouterr().err
    assert "adlkx-w2" in err and "adlkx-w0" not in err  # "does not exist" is not a failure
    line = links.cleanup_line(plan, done)
    assert "cannot tell" in line and "adlkx-w2 (RTNETLINK answers: Operation not permitted)" in line


def test_teardown_survives_a_missing_ip(monkeypatch, capsys):
    def missing(command, check=True):
        raise FileNotFoundError(2, "No such file or directory", "ip")

    monkeypatch.setattr(testbed, "_run", missing)
    done = testbed.teardown(testbed.LinkPlan(workers=1, prefix="adlkx"))
    assert done.removed == [] and sorted(done.failed) == ["adlkx-br", "adlkx-w0"]
    assert "FileNotFoundError" in capsys.readouterr().err


@pytest.mark.skipif(threading.current_thread() is not threading.main_thread(), reason="signals: main thread only")
def testtestbed_ignores_signals_while_it_tears_down_and_restores_the_handlers(monkeypatch):
    plan = testbed.LinkPlan(workers=2, prefix="adlkx")
    fake = FakeIp()
    monkeypatch.setattr(testbed, "_run", fake)
    monkeypatch.setattr(testbed, "unavailable_reason", lambda: None)
    watched = (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)
    original = {sig: signal.getsignal(sig) for sig in watched}
    seen = []
    real_teardown = testbed.teardown

    def teardown(p):
        seen.append({sig: signal.getsignal(sig) for sig in watched})
        if len(seen) == 2:  # the final teardown: a second SIGTERM and SIGHUP arrive halfway and change nothing
            os.kill(os.getpid(), signal.SIGTERM)
            os.kill(os.getpid(), signal.SIGHUP)
        return real_teardown(p)

    monkeypatch.setattr(testbed, "teardown", teardown)
    with testbed.Testbed(plan) as built:
        assert signal.getsignal(signal.SIGTERM) == testbed.Testbed._on_signal
        assert signal.getsignal(signal.SIGINT) == original[signal.SIGINT]
    assert len(seen) == 2  # leftovers before the start, the testbed at the end
    assert all(handler == signal.SIG_IGN for during in seen for handler in during.values())
    assert {sig: signal.getsignal(sig) for sig in watched} == original
    assert built.teardown is not None and built.teardown.removed == plan.namespaces
    assert fake.deleted() == plan.namespaces * 2


def test_a_failed_setup_still_tears_down_with_signals_ignored(monkeypatch):
    plan = testbed.LinkPlan(workers=1, prefix="adlkx")
    fake = FakeIp()

    def failing(command, check=True):
        if command[:4] == ["ip", "-n", "adlkx-br", "link"]:
            return subprocess.CompletedProcess(command, 2, "", "RTNETLINK answers: no bridge here")
        return fake(command, check)

    monkeypatch.setattr(testbed, "_run", failing)
    monkeypatch.setattr(testbed, "unavailable_reason", lambda: None)
    original = signal.getsignal(signal.SIGTERM)
    with pytest.raises(testbed.NamespacesUnavailable, match="no bridge here"):
        with testbed.Testbed(plan):
            pass
    assert fake.deleted() == plan.namespaces * 2 and signal.getsignal(signal.SIGTERM) == original
