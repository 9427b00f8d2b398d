"""`faults` (`recipes/benchmarks/faults/`), one benchmark of three families: the command line that picks a family and
hands the rest to its own parser, and the process family's scenarios by name, an unknown one refused before any
launch; the fault run every family launches (`toolkit/worker/fault_run.py`: the config, model and data of the test
suite's worker for the same spec) and where it arms each fault (`faults.py`, the library's `fault_points`)."""

import pytest
import torch

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


def _as_the_test_suites_worker_builds(spec: dict):
    """The config, model and data `tests/scripts/adloco_worker.py` builds from `spec` (its defaults, `NORM_TEST`,
    `tiny_model`, `sequence_dataset`), written out here on purpose: the fault run must train what it trains."""
    from helpers import NORM_TEST, sequence_dataset, tiny_model

    from adloco_hf import AdLoCoConfig

    defaults = {"use_cpu": True, "report_to": [], "disable_tqdm": True, "log_level": "warning", "plot_run": False}
    config = {"output_dir": spec["output_dir"], **spec["config"]}  # `helpers.worker_spec` puts it there
    args = AdLoCoConfig(**{**defaults, **NORM_TEST, **config})
    dropout = {"attention_dropout": spec["dropout"]} if spec.get("dropout") else {}
    return args, tiny_model(**spec.get("model", {}), **dropout), sequence_dataset(spec.get("num_samples", 512))


@pytest.mark.parametrize("family", ["process", "soak"])
def test_the_fault_run_trains_what_the_test_suites_worker_trains_from_the_same_spec(tmp_path, family):
    from helpers import flat_params

    from recipes.benchmarks.faults.process.scenarios import CONFIG
    from recipes.benchmarks.faults.soak.config import run_config, spec
    from recipes.benchmarks.toolkit.worker import fault_run

    out, probe = str(tmp_path / "out"), str(tmp_path / "probe")
    if family == "soak":
        fault_spec = spec(out, probe, run_config(max_steps=200, save_steps=50))
    else:
        fault_spec = {"output_dir": out, "world_size": 2, "probe_dir": probe, "config": CONFIG, "dropout": 0.1}
    args, model, data = _as_the_test_suites_worker_builds(fault_spec)
    assert fault_run.fault_config(fault_spec).to_dict() == args.to_dict()
    built = fault_run.fault_model(fault_spec)
    assert built.config.to_dict() == model.config.to_dict() and built.config.attention_dropout == 0.1
    assert torch.equal(flat_params(built), flat_params(model))
    assert fault_run.fault_data(fault_spec)[:] == data[:]
    assert len(data) == fault_spec.get("num_samples", 512)


def test_a_fault_run_refuses_a_key_it_would_ignore():
    from recipes.benchmarks.toolkit.worker import fault_run

    with pytest.raises(ValueError, match=r"has no keys \['probes'\]"):  # before any process group or model
        fault_run.run_faults({"output_dir": "o", "world_size": 2, "probe_dir": "p", "config": {}, "probes": False})


def test_every_fault_point_names_a_function_of_the_library():
    import importlib

    from adloco_hf import fault_points

    for point, (module, path) in fault_points.POINTS.items():
        owner = importlib.import_module(module)
        for attribute in path.split("."):
            owner = getattr(owner, attribute)
        assert callable(owner), point
    with pytest.raises(ValueError, match="no fault point 'nowhere'"):
        fault_points.wrap("nowhere", lambda f: f)


def test_each_fault_is_armed_where_the_test_suites_worker_armed_it(monkeypatch):
    """The points each fault wraps, in order, the callbacks it adds after those already there (Fail, then the wait for
    a stop request, then the SIGTERM, as the test suite's worker added them), and the trainer's NaN and slow step."""
    from types import SimpleNamespace

    from recipes.benchmarks.toolkit.worker import faults

    wrapped, timings, callbacks = [], [], []
    monkeypatch.setattr(faults.fault_points, "wrap", lambda point, wrapper: wrapped.append(point))
    monkeypatch.setattr(faults.fault_points, "set_preemption_timings", lambda **kw: timings.append(kw))
    trainer = SimpleNamespace(add_callback=callbacks.append)
    spec = {
        "kill_in_save": 20, "hang_in_save": [1, 20], "kill_in_merged_save": True, "slow": {1: 0.5}, "nan": [1, 0, "onwards"],
        "fail": ["all", 12, 9], "preemption_poll": 0, "preemption_agree_seconds": 240, "wait_for_stop_request": [1, 12],
        "sigterm": [0, 12, "launcher"],
    }  # fmt: skip
    assert set(spec) == set(faults.FAULT_KEYS) - {"disk_full"}
    faults.arm_faults(trainer, model=None, spec=spec, rank=1)
    assert wrapped == ["save_rank_state", "save_rank_state", "save_model_folder"]
    assert timings == [{"poll_seconds": 0}, {"agree_seconds": 240}]
    assert [type(c).__name__ for c in callbacks] == ["_Fail", "_WaitForStopRequest", "_Preempt"]
    assert (trainer.slow, trainer.nan_at, trainer.nan_onwards) == ({"1": 0.5}, (1, 0), True)
