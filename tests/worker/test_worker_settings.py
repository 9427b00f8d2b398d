"""Each AdLoCo setting is read from the config once, into a typed value (`WorkerSettings`, `OuterSettings`,
`EvaluationSettings`, `RoundRules`) that the code passes on: built once per run, and never read from the args again
in the worker, the outer step, the evaluation or the trainer."""

import ast
import dataclasses
import pathlib

import torch
from helpers import sequence_dataset, tiny_model, tiny_run_config

from adloco_hf import AdLoCoConfig, AdLoCoTrainer
from adloco_hf.config.fields import GROUPS
from adloco_hf.evaluation.view import EvaluationSettings
from adloco_hf.instances.merges import MergeSettings
from adloco_hf.outer.settings import OuterSettings
from adloco_hf.rounds.rules import RoundRules, RoundSettings
from adloco_hf.worker.settings import ProfileSettings, StartSettings, StepSettings, WorkerSettings


PACKAGE = pathlib.Path(__file__).resolve().parents[2] / "adloco_hf"
# The parts that read their settings through typed values; their `from_args` builders are the only readers.
SCANNED = ("worker", "outer", "rounds", "evaluation", "trainer")
ADLOCO_FIELDS = frozenset(f.name for group in GROUPS for f in dataclasses.fields(group))
CONFIG_NAMES = ("args", "config")  # what the code calls an AdLoCoConfig: `args`, `self.args`, `trainer.args`, ...


def _is_config(node: ast.expr) -> bool:
    name = node.attr if isinstance(node, ast.Attribute) else getattr(node, "id", None)
    return name in CONFIG_NAMES


def settings_reads(path: pathlib.Path) -> tuple[list[str], list[str]]:
    """(reads of AdLoCo fields from a config outside `from_args`, reads inside it), as `file:line: code`."""
    tree = ast.parse(path.read_text())
    inside: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and node.name == "from_args":
            inside |= {id(child) for child in ast.walk(node)}
    outside, builders = [], []
    for node in ast.walk(tree):
        read = None
        if isinstance(node, ast.Attribute) and node.attr in ADLOCO_FIELDS and _is_config(node.value):
            read = node
        elif (
            isinstance(node, ast.Call)
            and getattr(node.func, "id", None) in ("getattr", "hasattr")
            and len(node.args) >= 2
            and isinstance(node.args[1], ast.Constant)
            and node.args[1].value in ADLOCO_FIELDS
        ):
            read = node
        if read is not None:
            where = f"{path.relative_to(PACKAGE.parent)}:{read.lineno}: {ast.unparse(read)}"
            (builders if id(read) in inside else outside).append(where)
    return outside, builders


def test_the_worker_outer_step_evaluation_and_trainer_read_no_adloco_setting_from_the_args():
    outside, builders = [], []
    for folder in SCANNED:
        for path in sorted((PACKAGE / folder).rglob("*.py")):
            found, built = settings_reads(path)
            outside += found
            builders += built
    assert not outside, (
        "AdLoCo settings read from the args outside a `from_args` builder; read them from the part's settings "
        "(WorkerSettings, OuterSettings, EvaluationSettings) instead:\n" + "\n".join(outside)
    )
    # The scan sees the builders' reads: every field they hold comes from the config there.
    read = {line.rsplit(".", 1)[-1] for line in builders}
    assert {"inner_steps", "outer_lr", "batch_size_test", "eval_merged_model", "worker_timeout"} <= read


def builders_called(path: pathlib.Path) -> set[tuple[str, str, str]]:
    """(file, enclosing function, class) of every `Class.from_args(...)` call in the file."""
    found = set()
    for function in ast.walk(ast.parse(path.read_text())):
        if not isinstance(function, ast.FunctionDef):
            continue
        for node in ast.walk(function):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "from_args":
                owner = ast.unparse(node.func.value)
                found.add((str(path.relative_to(PACKAGE)), function.name, owner))
    return found


def test_the_settings_are_built_in_one_place_each():
    """Where each settings object is built: a rebuild anywhere else (every round, every evaluation) fails here."""
    calls = set()
    for folder in SCANNED:
        for path in sorted((PACKAGE / folder).rglob("*.py")):
            calls |= builders_called(path)
    assert calls == {
        ("worker/core.py", "from_args", "WorkerSettings"),  # Worker.from_args(args), once per run
        ("worker/settings.py", "from_args", "StartSettings"),  # ... holding how training starts
        ("worker/settings.py", "from_args", "RoundSettings"),  # ... and the round's settings (their one reader)
        ("worker/settings.py", "from_args", "StepSettings"),  # ... the inner steps' settings
        ("worker/settings.py", "from_args", "ProfileSettings"),  # ... the startup profile's
        ("worker/settings.py", "from_args", "OuterSettings"),  # ... and the outer step's
        ("rounds/rules.py", "get", "RoundRules"),  # again only when the micro-batch limit or shard changes
        ("trainer/trainer.py", "__init__", "EvaluationSettings"),  # AdLoCoTrainer(...), once per run
        ("trainer/trainer.py", "__init__", "Worker"),  # ... and its worker
        ("trainer/loaders.py", "train_loader", "LoaderSettings"),  # the training loader, built once per run
    }


def test_the_settings_hold_the_configs_values(tmp_path):
    """Every field comes from its own config field (values chosen so that no two of them are equal)."""
    args = AdLoCoConfig(
        output_dir=str(tmp_path),
        max_steps=40,
        inner_steps=4,
        per_device_train_batch_size=6,
        max_batch_size=7,
        seed=11,
        use_cpu=True,
        report_to=[],
        save_strategy="no",
        instance_init="independent",
        worker_timeout=123.0,
        peer_timeout=17.0,
        preemption_grace_seconds=9.5,
        memory_fraction=0.55,
        save_merges=False,
        merge_transport="point_to_point",
        merge_payload="compact",
        batch_size_test="augmented_inner_product",
        batch_size_target="goodput",
        goodput_timing="startup_live",
        batch_size_cap=60,
        noise_preconditioner="adam",
        lr_batch_scaling="sqrt_adam",
        switch_threshold=3.25,
        outer_lr=0.45,
        outer_momentum=0.35,
        outer_nesterov=False,
        outer_state_device="cpu",
        pseudo_grad_dtype="float16",
        pseudo_grad_compression="int4",
        compression_block_size=64,
        outer_overlap=True,
        outer_overlap_local_weight=0.25,
        eval_merged_model=True,
    )
    args.num_instances = 3  # as a launch of 3 workers holds it (one process trains one instance: config/launch.py)
    settings = WorkerSettings.from_args(args)
    assert settings == WorkerSettings(
        processes_per_worker=1,
        worker_parallelism="ddp",
        worker_timeout=123.0,
        peer_timeout=17.0,
        preemption_grace_seconds=9.5,
        output_dir=str(tmp_path),
        seed=11,
        device=torch.device("cpu"),
        start=StartSettings(
            num_instances=3,
            instance_init="independent",
            memory_fraction=0.55,
            rounds=RoundSettings(
                initial_batch_size=6,
                batch_size_floor=None,
                batch_size_cap=60,
                inner_steps=4,
                inner_steps_rule="fixed",
                max_inner_steps=None,
                outer_noise_theta=args.outer_noise_theta,
                switch_threshold=3.25,
                max_batch_size=7,
            ),
        ),
        profile=ProfileSettings(
            enabled=True,
            statistics=False,  # Adam's metric: no second moments before the first step
            precision="fp32",
            compiled=False,
            backend="default",  # ddp_backend unset: the one accelerate picks
        ),
        steps=StepSettings(
            batch_size_test="augmented_inner_product",
            noise_preconditioner="adam",
            lr_batch_scaling="sqrt_adam",
            time_steps=True,
        ),
        outer=OuterSettings(
            lr=0.45,
            momentum=0.35,
            nesterov=False,
            state_device="cpu",
            pseudo_grad_dtype="float16",
            compression="int4",
            compression_block_size=64,
            overlap=True,
            overlap_local_weight=0.25,
            num_fragments=None,
            fragment_sync_delay=0,
            fragment_update_alpha=0.0,
        ),
        merges=MergeSettings(
            transport="point_to_point", payload="compact", block_size=64, save=False, with_momentum=True
        ),
    )
    assert not settings.sharded and settings.outer.with_momentum
    assert settings.outer.fragments is None and settings.outer.background  # overlap: groups of its own
    assert EvaluationSettings.from_args(args).eval_merged_model is True
    auto = AdLoCoConfig(output_dir=str(tmp_path), max_steps=8, inner_steps=4, max_batch_size="auto", use_cpu=True)
    assert WorkerSettings.from_args(auto).start.rounds.max_batch_size is None  # probed when training starts


def test_streaming_diloco_settings_are_read_into_the_outer_settings(tmp_path):
    args = AdLoCoConfig(
        output_dir=str(tmp_path),
        max_steps=24,
        inner_steps=12,
        save_strategy="no",
        use_cpu=True,
        num_fragments=3,
        fragment_sync_delay=4,
        fragment_update_alpha=0.25,
    )
    outer = OuterSettings.from_args(args)
    assert (outer.num_fragments, outer.fragment_sync_delay, outer.fragment_update_alpha) == (3, 4, 0.25)
    assert outer.fragments == (3, 4, 0.25) and outer.background and not outer.overlap
    plain = OuterSettings.from_args(AdLoCoConfig(output_dir=str(tmp_path), max_steps=400, use_cpu=True))
    assert plain.fragments is None and not plain.background


def test_each_settings_object_is_built_once_per_run(tmp_path, monkeypatch):
    """A run with evaluations and rounds builds each settings object once (RoundRules too: its inputs, the largest
    micro-batch and the data shard, do not change here), and the worker keeps the same ones throughout."""
    built: dict[str, list] = {}

    def counted(cls):
        original = cls.__dict__["from_args"].__func__

        def from_args(klass, *args, **kwargs):
            value = original(klass, *args, **kwargs)
            built.setdefault(cls.__name__, []).append(value)
            return value

        monkeypatch.setattr(cls, "from_args", classmethod(from_args))

    for cls in (
        WorkerSettings,
        StartSettings,
        RoundSettings,
        StepSettings,
        OuterSettings,
        EvaluationSettings,
        RoundRules,
    ):
        counted(cls)
    args = tiny_run_config(tmp_path, inner_steps=3, eval_strategy="steps", eval_steps=6, outer_lr=0.6)
    data = sequence_dataset(128)
    trainer = AdLoCoTrainer(model=tiny_model(), args=args, train_dataset=data, eval_dataset=data.select(range(8)))
    worker = trainer.worker
    settings = worker.settings
    trainer.train()
    trainer.evaluate()
    assert {name: len(values) for name, values in built.items()} == {
        "WorkerSettings": 1,
        "StartSettings": 1,
        "RoundSettings": 1,
        "StepSettings": 1,
        "OuterSettings": 1,
        "EvaluationSettings": 1,
        "RoundRules": 1,
    }
    assert built["WorkerSettings"] == [settings] and trainer.worker.settings is settings
    assert (
        built["OuterSettings"][0] is settings.outer and built["EvaluationSettings"][0] is trainer.evaluation_settings
    )
    assert worker.rules is built["RoundRules"][0]
    assert worker.state.rounds == 4  # the rounds ran, each reading the same settings
    assert worker.global_model.optimizer.param_groups[0]["lr"] == settings.outer.lr == 0.6
