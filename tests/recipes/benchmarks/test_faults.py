"""`faults` (`recipes/benchmarks/faults/`): its scenarios by name, and an unknown one refused before any launch."""

import pytest

from recipes.benchmarks import faults


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
