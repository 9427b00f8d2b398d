"""The methods the training benchmarks compare and their settings (`toolkit/methods.py`, `settings.py`,
`options.py`, `runs.py`): each method's spec differs from its base in exactly the settings it names, and makes a
valid `AdLoCoConfig` in the benchmark worker (`toolkit/worker/arguments.py`); budgets, matched batches, slow workers."""

import math
import os

import pytest

from recipes.benchmarks import convergence
from recipes.benchmarks.toolkit import runs
from recipes.benchmarks.toolkit.methods import DEFAULT_METHODS, METHODS
from recipes.benchmarks.toolkit.settings import (
    check_epochs,
    check_matched,
    matched_batch_size,
    matched_for,
    method_spec,
    run_order,
    shared_settings,
)
from recipes.benchmarks.toolkit.testbeds import cgroups
from recipes.benchmarks.toolkit.worker import arguments


def test_method_specs_share_everything_but_their_own_settings(tmp_path):
    args = convergence.parse_args(["--quick", "--learning_rate", "0.002", "--set", "adloco.eta=0.5"])
    settings = shared_settings(args)
    specs = {
        name: method_spec(name, settings, str(tmp_path), matched_batch_size=6)
        for name in METHODS
        if name != "diloco_matched"
    }
    own = {name for name, m in METHODS.items() if "batch_size" in m or "budget_factor" in m}
    for name, spec in specs.items():
        assert spec["seed"] == specs["ddp"]["seed"]
        if name in own:  # issue 25's: a batch of their own, or a longer budget (test_the_goodput_methods...)
            continue
        assert spec["train"] == specs["ddp"]["train"]
        assert spec["train"]["learning_rate"] == 0.002
        assert spec["budget_tokens"] == specs["ddp"]["budget_tokens"]
    # A fixed batch runs at the square-root rule's learning rate for it, unless it holds the initial batch's rate.
    assert specs["diloco_b64"]["train"]["learning_rate"] == pytest.approx(0.002 * math.sqrt(64 / 4))
    assert specs["diloco_b64_lr_held"]["train"]["learning_rate"] == 0.002
    assert specs["diloco_b64_lr_held"]["train"]["batch_size"] == specs["diloco_b64"]["train"]["batch_size"] == 64
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
        shared_settings(convergence.parse_args(["--set", "adloco.no_such_key=1"]))


def test_a_seconds_budget_reaches_every_methods_spec_and_must_be_positive(tmp_path):
    settings = shared_settings(convergence.parse_args(["--quick"]))
    assert method_spec("diloco_b4", settings, str(tmp_path))["budget_seconds"] is None
    args = convergence.parse_args(["--quick", "--budget_seconds", "120", "--budget_tokens", "2048000"])
    settings = shared_settings(args)
    for name in ("ddp", "diloco_b4", "diloco_b16", "adloco_norm", "adloco_goodput"):
        spec = method_spec(name, settings, str(tmp_path))
        assert spec["budget_seconds"] == 120.0  # the same seconds for every method; tokens stay a ceiling
        assert spec["budget_tokens"] >= 2048000
    for bad in ("0", "-5"):
        with pytest.raises(SystemExit):
            convergence.parse_args(["--budget_seconds", bad])


def test_the_goodput_methods_and_the_fixed_batches_they_are_compared_with(tmp_path):
    settings = shared_settings(convergence.parse_args(["--quick", "--learning_rate", "0.002"]))
    specs = {
        name: method_spec(name, settings, str(tmp_path))
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
    args = arguments.make_arguments(goodput)
    assert args.batch_size_target == "goodput" and args.batch_size_cap == 64 and args.merge_payload == "compact"


STREAMED = {"num_fragments": 5, "fragment_sync_delay": "max", "fragment_update_alpha": 0.5}


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

    nine = ("ddp", "diloco", "adloco", "diloco_matched", "adloco_no_adaptive", "adloco_no_merge", "adloco_no_switch",
            "adloco_paper_outer", "adloco_sqrt_lr")  # fmt: skip
    assert DEFAULT_METHODS == nine
    assert convergence.parse_args([]).methods == list(nine)  # the variants run only when named
    goodput = {"diloco_b4", "diloco_b8", "diloco_b16", "adloco_goodput", "adloco_norm", "diloco_goodput"}  # issue 25's
    study = {"diloco_b32", "diloco_b64"}  # issues 39 and 51's studies (convergence --clock virtual)
    study |= {"rule_startup", "rule_live", "rule_startup_lr_held", "rule_startup_sqrt_adam", "rule_live_lr_held"}
    study |= {"rule_startup_lr_held_falls", "rule_startup_lr_held_adam"}  # issue 51's screening
    study |= {f"diloco_b{size}_lr_held" for size in (8, 16, 32, 64)}  # the sweep over batch × {held, √}
    assert set(METHODS) == set(nine) | set(VARIANTS) | {"adloco_paper"} | goodput | study
    args = convergence.parse_args(["--quick", "--methods", *VARIANTS])
    assert args.methods == list(VARIANTS) and run_order(args.methods) == list(VARIANTS)
    settings = shared_settings(args)
    for name, (base, changed) in VARIANTS.items():
        assert name not in nine and METHODS[name]["variant_of"] == base
        spec = method_spec(name, settings, str(tmp_path))
        reference = method_spec(base, settings, str(tmp_path))
        # A variant may name a setting the base leaves at AdLoCoConfig's default (noise_preconditioner).
        assert set(reference["adloco"]) <= set(spec["adloco"]) and spec["train"] == reference["train"]
        diff = {k: v for k, v in spec["adloco"].items() if reference["adloco"].get(k) != v}
        assert diff == changed, name
        spec["backend"] = None  # built in this process: no process group to form
        config = arguments.make_arguments(spec)
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
    settings = shared_settings(convergence.parse_args(["--quick", "--set", "adloco.compression_block_size=3"]))
    spec = method_spec("diloco_int4", settings, str(tmp_path))
    assert spec["adloco"]["compression_block_size"] == 3
    spec["backend"] = None
    with pytest.raises(ValueError, match="compression_block_size"):
        arguments.make_arguments(spec)


def test_step_bounds_cover_the_budget(tmp_path):
    settings = shared_settings(convergence.parse_args(["--quick", "--batch_size", "12", "--max_batch_size", "8"]))
    settings["cache_dir"] = str(tmp_path)
    ddp = method_spec("ddp", settings, str(tmp_path))
    per_step = ddp["world_size"] * 12 * ddp["block_size"]
    ddp_steps = arguments.max_steps_for(ddp)
    assert ddp_steps * per_step >= ddp["budget_tokens"] > (ddp_steps - 1) * per_step
    assert arguments.common_arguments(ddp)["lr_scheduler_type"] == "constant_with_warmup"
    # An initial request above max_batch_size runs at max_batch_size (switch mode's middle band): the bound on
    # AdLoCo's steps must still reach the budget with that smaller batch, in whole rounds.
    diloco = method_spec("diloco", settings, str(tmp_path))
    assert diloco["adloco"]["max_batch_size"] == 8
    diloco_steps = arguments.max_steps_for(diloco)
    smallest = diloco["world_size"] * diloco["adloco"]["max_batch_size"] * diloco["block_size"]
    assert diloco_steps * smallest >= diloco["budget_tokens"]
    assert diloco_steps % diloco["train"]["inner_steps"] == 0
    # AdLoCo's merges keep one instance's total batch (preserve_total): after the last one the whole launch may
    # train one worker's batch per step, and the bound must still reach the budget.
    adloco = method_spec("adloco", settings, str(tmp_path))
    one_worker = adloco["adloco"]["max_batch_size"] * adloco["block_size"]
    assert arguments.max_steps_for(adloco) * one_worker >= adloco["budget_tokens"]
    paper = method_spec("adloco_paper", settings, str(tmp_path))
    assert arguments.max_steps_for(paper) == diloco_steps  # the paper's rule never lowers a request


def test_the_slow_worker_methods_are_skipped_with_the_reason_where_no_cgroup_can_be_made(monkeypatch):
    def unavailable(*args, **kwargs):
        raise cgroups.CgroupUnavailable("a cgroup with a CPU quota needs root")

    monkeypatch.setattr(cgroups, "cpu_controller", unavailable)
    names, reason = runs.runnable(["diloco", "diloco_slow1", "diloco_balanced"])
    assert names == ["diloco"] and "needs root" in reason
    assert runs.runnable(["diloco", "adloco"]) == (["diloco", "adloco"], None)


def test_a_budget_over_one_epoch_is_refused_unless_repeats_are_allowed():
    settings = shared_settings(convergence.parse_args(["--quick", "--budget_tokens", "2000"]))
    with pytest.raises(SystemExit, match="allow_repeats"):
        check_epochs(settings, 1000, allow_repeats=False)
    check_epochs(settings, 1000, allow_repeats=True)
    check_epochs(settings, 2000, allow_repeats=False)


def test_the_matched_batch_comes_from_the_reference_run_of_the_same_seed(tmp_path):
    assert check_matched(["ddp", "diloco_matched"]) and check_matched(["adloco"]) is None
    with pytest.raises(ValueError, match="failed"):
        matched_for("diloco_matched", {"adloco": {"error": "exit 1"}}, {})
    assert matched_for("ddp", {}, {}) is None
    settings = shared_settings(convergence.parse_args(["--quick"]))
    per_round = settings["world_size"] * settings["train"]["inner_steps"] * settings["block_size"]
    batch = matched_batch_size({"tokens": 60 * 6.4 * per_round, "rounds": 60}, settings)
    assert batch == 6
    spec = method_spec("diloco_matched", settings, str(tmp_path), seed=43, matched_batch_size=batch)
    assert spec["train"]["batch_size"] == 6 and spec["adloco"]["num_instances"] == 1 and spec["seed"] == 43
    assert spec["output_dir"].endswith(os.path.join("diloco_matched", "seed-43"))
    with pytest.raises(ValueError, match="adloco"):
        method_spec("diloco_matched", settings, str(tmp_path))
    with pytest.raises(SystemExit):
        convergence.parse_args(["--methods", "ddp", "diloco_matched"])
    assert run_order(["diloco_matched", "ddp", "adloco"]) == ["ddp", "adloco", "diloco_matched"]
