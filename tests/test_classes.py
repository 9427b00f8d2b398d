"""The package's classes are parts that own their state: small (at most 15 attributes), no mixins sharing `self` (by
name, by bases, or a base without `__init__` reading members its subclasses set), no module reading another module's
private members or writing another object's private attributes, and switch mode planned in one place.

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


def is_private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def defined_in_class(cls: ast.ClassDef) -> set[str]:
    """What a class gives itself: its methods, nested classes, class-level values and what it assigns on `self`."""
    names = set()
    for node in cls.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names |= {part.id for target in node.targets for part in ast.walk(target) if isinstance(part, ast.Name)}
        elif isinstance(node, ast.AnnAssign) and node.value is not None and isinstance(node.target, ast.Name):
            names.add(node.target.id)  # an annotation alone declares a name, it does not set it
    for node in ast.walk(cls):
        if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store) and is_self(node.value):
            names.add(node.attr)
    return names


def is_self(value: ast.expr) -> bool:
    return isinstance(value, ast.Name) and value.id in ("self", "cls")


def has_init(cls: ast.ClassDef) -> bool:
    """An `__init__` of its own, or a generated one (a dataclass's)."""
    decorators = {ast.unparse(d.func if isinstance(d, ast.Call) else d).split(".")[-1] for d in cls.decorator_list}
    return "dataclass" in decorators or any(
        isinstance(node, ast.FunctionDef) and node.name == "__init__" for node in cls.body
    )


def mixin_reads(found: list[tuple[str, ast.ClassDef]]) -> dict[str, list[str]]:
    """Base classes of the package's own classes that have no `__init__` and read on `self` what neither they nor
    their own package bases set or define: members their subclasses must provide, a mixin's shared `self`."""
    by_name = {cls.name: cls for _, cls in found}
    subclassed = {ast.unparse(base).split(".")[-1] for _, cls in found for base in cls.bases}

    def given(cls: ast.ClassDef) -> set[str]:
        bases = [by_name[b] for b in (ast.unparse(base).split(".")[-1] for base in cls.bases) if b in by_name]
        return defined_in_class(cls).union(*(given(base) for base in bases))

    mixins = {}
    for name, cls in found:
        if cls.name not in subclassed or has_init(cls):
            continue
        read = {
            node.attr
            for node in ast.walk(cls)
            if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load) and is_self(node.value)
        }
        missing = sorted(read - given(cls))
        if missing:
            mixins[name] = missing
    return mixins


def test_no_base_class_reads_members_its_subclasses_must_set():
    """A part is handed what it reads (`__init__`), rather than reading members that the classes using it set."""
    mixins = mixin_reads(classes())
    assert not mixins, "mixins (make each a part with an `__init__`, owned by the classes using it):\n" + "\n".join(
        f"{name} reads {missing}" for name, missing in mixins.items()
    )


def test_the_mixin_check_finds_a_base_reading_its_subclasses_members():
    source = (
        "class Plans:\n    def plan(self):\n        return self._position(), self.size, self.steps()\n\n"
        "    def steps(self):\n        return 1\n\n\n"
        "class Owned:\n    def __init__(self, size):\n        self.size = size\n\n    def plan(self):\n"
        "        return self.size, self.other\n\n\n"
        "class Sampler(Plans):\n    size = 1\n\n    def _position(self):\n        return 0\n\n\n"
        "class Child(Owned):\n    pass\n"
    )
    found = [(f"m.py:{node.name}", node) for node in ast.parse(source).body]
    assert mixin_reads(found) == {"m.py:Plans": ["_position", "size"]}


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


def private_writes(path: pathlib.Path, label: str) -> list[str]:
    """`x._name = ...` (also `+=`, annotated, `del`, `setattr(x, "_name", ...)`) where `x` is not `self` or `cls`: a
    write into another object's private state, which only that object's own code may change."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Attribute) and isinstance(node.ctx, (ast.Store, ast.Del)):
            written, name = node.value, node.attr
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in ("setattr", "delattr")
            and len(node.args) >= 2
            and isinstance(node.args[1], ast.Constant)
            and isinstance(node.args[1].value, str)
        ):
            written, name = node.args[0], node.args[1].value
        else:
            continue
        if is_private(name) and not is_self(written):
            found.append(f"{label}:{node.lineno}: {ast.unparse(written)}.{name}")
    return found


def test_no_module_writes_another_objects_private_attributes():
    """An object's private state is set by its own code; a library object's private attribute is set only by a shim
    of `common/upstream.py` that names why (`scheduler._last_lr`, `model._is_accelerate_prepared`)."""
    writes = [
        write for path in package_files() if name_of(path) != SHIMS for write in private_writes(path, name_of(path))
    ]
    assert not writes, "private attributes of another object written:\n" + "\n".join(writes)


def test_the_private_writes_check_finds_a_write_into_another_object(tmp_path):
    writer = tmp_path / "writer.py"
    writer.write_text(
        "def f(scheduler, other, lrs):\n    scheduler._last_lr = lrs\n    other.step._count += 1\n"
        "    setattr(other, '_x', 1)\n    other.public = 1\n    other._x.y = 2\n\n\n"
        "class A:\n    def g(self, other):\n        self._own = other._own\n        self._n: int = 0\n"
    )
    assert private_writes(writer, "writer.py") == [
        "writer.py:2: scheduler._last_lr",
        "writer.py:3: other.step._count",
        "writer.py:4: other._x",
    ]


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
