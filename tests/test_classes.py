"""The package's classes are parts that own their state: small (at most 15 attributes), no mixins sharing `self`, no
module reading another module's private members, and switch mode planned in one place.

Read from the code (`ast`), like `test_layout.py`: a class's attributes are the names it assigns on `self` in any
method and its dataclass fields.
"""

import ast
import pathlib

import pytest


PACKAGE = pathlib.Path(__file__).resolve().parent.parent / "adloco_hf"
MAX_ATTRIBUTES = 15
# Records whose fields are a file format's or a command line's keys, flat by contract:
RECORDS = {
    # the config's field groups: `HfArgumentParser` and YAML need `AdLoCoConfig`'s fields flat (STYLE.md)
    "config/fields.py:BatchFields",
    # one line of `adloco_rounds.jsonl`: its fields are the file's keys (DESIGN §4)
    "rounds/rows.py:RoundLine",
}
# `AdLoCoConfig`'s fields come in groups (`config/fields.py`: rounds, instances, batch, workers), dataclasses of
# fields only, which it inherits beside `TrainingArguments`: `HfArgumentParser` needs the fields flat on one class.
FIELD_GROUPS = {"config/arguments.py:AdLoCoConfig"}
# The one module that may call a library's private members, each behind a shim naming why (and the release checked).
SHIMS = "common/upstream.py"


def package_files() -> list[pathlib.Path]:
    return sorted(PACKAGE.rglob("*.py"))


def name_of(path: pathlib.Path) -> str:
    return str(path.relative_to(PACKAGE))


def classes() -> list[tuple[str, ast.ClassDef]]:
    found = []
    for path in package_files():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                found.append((f"{name_of(path)}:{node.name}", node))
    return found


def attributes(cls: ast.ClassDef) -> set[str]:
    """The names the class assigns on `self`, and its annotated class-level fields (a dataclass's)."""
    names = {
        node.target.id for node in cls.body if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
    }
    for node in ast.walk(cls):
        targets = []
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, (ast.AnnAssign, ast.AugAssign)):
            targets = [node.target]
        for target in targets:
            for part in ast.walk(target):
                if isinstance(part, ast.Attribute) and isinstance(part.value, ast.Name) and part.value.id == "self":
                    names.add(part.attr)
    return names


def test_every_class_has_at_most_15_attributes():
    large = {
        name: sorted(attributes(cls))
        for name, cls in classes()
        if len(attributes(cls)) > MAX_ATTRIBUTES and name not in RECORDS
    }
    assert not large, "split these classes into parts that own their state:\n" + "\n".join(
        f"{name}: {len(attrs)} attributes {attrs}" for name, attrs in large.items()
    )


def test_no_class_is_a_mixin():
    """A class takes its behaviour from parts it is handed or makes, not from mixins that share its `self`: at most
    one base class of the package's own."""
    own = {cls.name for _, cls in classes()}
    mixed = {}
    for name, cls in classes():
        bases = [ast.unparse(base) for base in cls.bases]
        ours = [base for base in bases if base.split(".")[-1] in own]
        if name in FIELD_GROUPS:
            continue
        if "Mixin" in name or any("Mixin" in base for base in bases) or len(ours) > 1:
            mixed[name] = bases
    assert not mixed, f"mixins: {mixed}"


def private_names_defined(tree: ast.Module) -> set[str]:
    """The `_private` names a module defines: functions, classes, attributes set on any object, class fields."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            names.add(node.attr)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
    return {name for name in names if name.startswith("_")}


def private_reads(path: pathlib.Path, label: str) -> list[str]:
    """`x._name` where `x` is not `self`, `cls` or `super()` and `_name` is not defined in this module."""
    tree = ast.parse(path.read_text())
    own = private_names_defined(tree)
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute) or not node.attr.startswith("_") or node.attr.startswith("__"):
            continue
        value = node.value
        if isinstance(value, ast.Name) and value.id in ("self", "cls"):
            continue
        if isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id == "super":
            continue
        if node.attr in own:
            continue
        found.append(f"{label}:{node.lineno}: {ast.unparse(node)}")
    return found


def test_no_module_reads_another_modules_private_members():
    """A module reads the private members it defines; a library's go through the shims of one module, each naming
    why it is needed (`common/upstream.py`)."""
    reads = [read for path in package_files() if name_of(path) != SHIMS for read in private_reads(path, name_of(path))]
    assert not reads, "private members read from another module:\n" + "\n".join(reads)


def test_no_module_imports_another_modules_private_names():
    """`from .x import _name` reaches into `x` as much as `x._name` does (a module's own `_aliases` aside)."""
    found = []
    for path in package_files():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module != "__future__":
                found += [
                    f"{name_of(path)}:{node.lineno}: {alias.name}"
                    for alias in node.names
                    if alias.name.startswith("_") and not alias.name.startswith("__") and alias.name != "_aliases"
                ]
    assert not found, "private names imported from another module:\n" + "\n".join(found)


def test_the_private_reads_check_finds_a_read_across_modules(tmp_path):
    reader = tmp_path / "reader.py"
    reader.write_text(
        "def f(trainer):\n    return trainer._train_loader, super()._g\n\n\n"
        "class A:\n    _own = 1\n\n    def g(self, other):\n        return other._own, self._x\n"
    )
    assert private_reads(reader, "reader.py") == ["reader.py:2: trainer._train_loader"]


@pytest.mark.parametrize("function", ["plan_batch"])
def test_switch_mode_is_planned_in_one_place(function):
    """Every batch of the package is planned through `SwitchMode.plan` (`batch/switch_mode.py`), which the round's
    plan (`rounds/plan.py`) and the goodput rule call: `plan_batch` has one caller."""
    callers = []
    for path in package_files():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call):
                called = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", None)
                if called == function:
                    callers.append(f"{name_of(path)}:{node.lineno}")
    assert len(callers) == 1 and callers[0].startswith("batch/switch_mode.py"), callers
