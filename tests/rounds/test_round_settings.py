"""A round's settings (the initial request, its floor and cap, H and its rule, switch mode) have one reader:
`rounds/rules.py:RoundSettings.from_args`. The start, the round's rules and the training loader read them there."""

import ast
import dataclasses
import pathlib

from adloco_hf import AdLoCoConfig
from adloco_hf.rounds.rules import RoundRules, RoundSettings
from adloco_hf.worker.settings import WorkerSettings


PACKAGE = pathlib.Path(__file__).resolve().parents[2] / "adloco_hf"
ROUND_FIELDS = {
    "per_device_train_batch_size",
    "batch_size_floor",
    "batch_size_cap",
    "inner_steps",
    "inner_steps_rule",
    "max_inner_steps",
    "outer_noise_theta",
    "switch_threshold",
}
READER = "rounds/rules.py:RoundSettings.from_args"
# The config defines, types and checks its own fields before any run starts; it is where they are written, not read.
CONFIG = "config/"


def is_config(node: ast.expr) -> bool:
    """`args`, `config`, or anything's `.args` (the Trainer's arguments): what holds an `AdLoCoConfig`."""
    return (isinstance(node, ast.Name) and node.id in ("args", "config")) or (
        isinstance(node, ast.Attribute) and node.attr == "args"
    )


def config_reads(package: pathlib.Path) -> list[str]:
    """`module:function field` for every read of a round field from a config, outside `config/`."""
    found = []
    for path in sorted(package.rglob("*.py")):
        module = str(path.relative_to(package))
        if module.startswith(CONFIG):
            continue
        tree = ast.parse(path.read_text())
        scopes = [(n.name, n) for n in tree.body if isinstance(n, ast.FunctionDef)]
        for cls in [n for n in tree.body if isinstance(n, ast.ClassDef)]:
            scopes += [(f"{cls.name}.{f.name}", f) for f in cls.body if isinstance(f, ast.FunctionDef)]
        for name, scope in scopes:
            for node in ast.walk(scope):
                if isinstance(node, ast.Attribute) and node.attr in ROUND_FIELDS and is_config(node.value):
                    found.append(f"{module}:{name} {node.attr}")
    return found


def test_the_round_settings_have_one_reader():
    reads = config_reads(PACKAGE)
    assert {read.split(" ")[0] for read in reads} == {READER}, reads
    assert {read.split(" ")[1] for read in reads} == ROUND_FIELDS  # it reads every one of them


def test_the_check_finds_another_reader(tmp_path):
    (tmp_path / "trainer").mkdir()
    (tmp_path / "trainer" / "loader.py").write_text(
        "def make(trainer, args):\n    return trainer.args.per_device_train_batch_size, args.inner_steps\n"
    )
    assert config_reads(tmp_path) == [
        "trainer/loader.py:make per_device_train_batch_size",
        "trainer/loader.py:make inner_steps",
    ]


def test_the_start_and_the_rules_read_the_same_round_settings(tmp_path):
    args = AdLoCoConfig(
        output_dir=str(tmp_path),
        max_steps=64,
        inner_steps=4,
        per_device_train_batch_size=3,
        batch_size_floor=5,
        batch_size_cap=40,
        max_batch_size=7,
        switch_threshold=1.5,
        inner_steps_rule="outer_noise",
        max_inner_steps=16,
        outer_noise_theta=0.3,
        use_cpu=True,
        report_to=[],
        save_strategy="no",
    )
    rounds = RoundSettings.from_args(args)
    assert rounds == RoundSettings(
        initial_batch_size=3,
        batch_size_floor=5,
        batch_size_cap=40,
        inner_steps=4,
        inner_steps_rule="outer_noise",
        max_inner_steps=16,
        outer_noise_theta=0.3,
        switch_threshold=1.5,
        max_batch_size=7,
    )
    start = WorkerSettings.from_args(args).start
    assert start.rounds == rounds
    assert (
        start.rounds.initial_batch_size,
        start.rounds.inner_steps,
        start.rounds.batch_size_cap,
        start.rounds.max_batch_size,
    ) == (3, 4, 40, 7)
    # The rules take their floor, cap, reference, H's rule and switch mode from the settings handed in, not the config.
    other = dataclasses.replace(rounds, initial_batch_size=2, batch_size_floor=None, switch_threshold=3.0)
    rules = RoundRules.from_args(args, max_batch_size=7, shard_size=None, settings=other)
    assert rules.reference_batch_size == 2 and rules.controller.floor == 2 and rules.switch.switch_threshold == 3.0
    assert rules.controller.cap == 40 and rules.max_inner_steps == 16 and rules.inner_steps_rule == "outer_noise"
    own = RoundRules.from_args(args, max_batch_size=7, shard_size=None, settings=rounds)
    assert own.reference_batch_size == 3 and own.controller.floor == 5 and own.switch.switch_threshold == 1.5
