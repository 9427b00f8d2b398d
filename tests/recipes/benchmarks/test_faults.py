"""`faults` (`recipes/benchmarks/faults/`), one benchmark of three families: the command line that picks a family and
hands the rest to its own parser, and the process family's scenarios by name, an unknown one refused before any
launch."""

import pytest

from recipes.benchmarks import faults as benchmark
from recipes.benchmarks.faults import process as faults


def test_the_fault_benchmark_knows_its_scenarios_and_refuses_unknown_ones(capsys):
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


def test_one_fault_benchmark_hands_each_family_its_own_options(capsys):
    assert list(benchmark.FAMILIES) == ["process", "soak", "network"]
    args = benchmark.parse_args(["soak", "--minutes", "1", "--kill_every", "20", "--kills", "2"])
    assert (args.family, args.minutes, args.kill_every, args.kills) == ("soak", 1.0, 20.0, 2)
    assert benchmark.parse_args(["process", "--scenarios", "kill_all"]).names == ["kill_all"]
    assert benchmark.parse_args(["network", "--report_only"]).report_only
    # A family's option is refused by the others' parsers, and no family is no run.
    with pytest.raises(SystemExit):
        benchmark.parse_args(["process", "--minutes", "1"])
    assert "unrecognized arguments: --minutes 1" in capsys.readouterr().err
    for wrong in ([], ["netfaults"]):
        with pytest.raises(SystemExit):
            benchmark.main(wrong)
        assert "{process,soak,network}" in capsys.readouterr().err  # the usage line names the families


def test_the_fault_benchmark_runs_the_familys_own_main_with_its_options(capsys):
    with pytest.raises(SystemExit):  # the process family's own check, reached through the dispatcher
        benchmark.main(["process", "--scenarios", "kill_all,no_such_fault"])
    assert "unknown scenario(s) ['no_such_fault']" in capsys.readouterr().err
