"""The package's layout: folders by part of the algorithm, imports that only run down the layers, no cycle, and no
module over 400 lines (docs/architecture.md draws the layers).

Imports anywhere in a file count (module level, inside functions, `TYPE_CHECKING` blocks).
"""

import ast
import pathlib

import pytest


PACKAGE = pathlib.Path(__file__).resolve().parent.parent / "adloco_hf"

# Lowest first: a folder may import from itself and from the folders before it, never from one after it.
LAYERS = [
    "common",
    "config",
    "batch",
    "outer",
    "sampling",
    "data",
    "instances",
    "checkpoint",
    "rounds",
    "reporting",
    "worker",
    "evaluation",
    "trainer",
]
# Modules directly in the package: the public names, the old module paths, the recipes' command lines and models,
# `adloco-hf`'s commands, the test launcher, the benchmarks' inspection surface. They sit above every folder.
TOP = {
    "adloco_hf",
    "adloco_hf._aliases",
    "adloco_hf.cli",
    "adloco_hf.commands",
    "adloco_hf.inspection",
    "adloco_hf.presets",
    "adloco_hf.testing",
}
MAX_LINES = 400


def module_name(path: pathlib.Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: pathlib.Path, modules: set[str]) -> set[str]:
    """Package modules imported by the file: `from . import x` counts as the module `x`, not its package."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            submodules = [f"{base}.{alias.name}" for alias in node.names if f"{base}.{alias.name}" in modules]
            targets = submodules + ([base] if len(submodules) < len(node.names) else [])
        else:
            continue
        found |= {t for t in targets if t in modules}
    return found - {name}


def layer_of(module: str) -> int:
    if module in TOP:
        return len(LAYERS)
    folder = module.split(".")[1]
    return LAYERS.index(folder) if folder in LAYERS else -1


@pytest.fixture(scope="module")
def files() -> list[pathlib.Path]:
    return sorted(PACKAGE.rglob("*.py"))


@pytest.fixture(scope="module")
def graph(files) -> dict[str, set[str]]:
    modules = {module_name(f) for f in files}
    return {module_name(f): imports_of(f, modules) for f in files}


def test_every_module_lives_in_a_layer(graph):
    assert sorted(m for m in graph if layer_of(m) < 0 and m != "adloco_hf.metrics.perplexity") == []


def test_imports_only_run_down_the_layers(graph):
    upward = sorted(
        f"{module} imports {dep}" for module, deps in graph.items() for dep in deps if layer_of(dep) > layer_of(module)
    )
    assert upward == [], "\n".join(upward)


def test_nothing_in_the_package_imports_the_trainer(graph):
    importers = sorted(
        m
        for m, deps in graph.items()
        if any(d.startswith("adloco_hf.trainer") for d in deps)
        and m not in TOP
        and not m.startswith("adloco_hf.trainer")
    )
    assert importers == []


def test_the_import_graph_has_no_cycle(graph):
    # The package's __init__ only re-exports; it is the root, not part of a cycle.
    edges = {m: {d for d in deps if d != "adloco_hf"} for m, deps in graph.items() if m != "adloco_hf"}
    state: dict[str, int] = {}

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for dep in sorted(edges.get(node, ())):
            if state.get(dep) == 1:
                raise AssertionError("import cycle: " + " → ".join(path[path.index(dep) :] + [dep]))
            if dep not in state:
                visit(dep, path + [dep])
        state[node] = 2

    for module in sorted(edges):
        if module not in state:
            visit(module, [module])


def test_no_module_is_over_400_lines(files):
    long = sorted(
        f"{f.relative_to(PACKAGE.parent)}: {n} lines"
        for f in files
        if (n := len(f.read_text().splitlines())) > MAX_LINES
    )
    assert long == [], "\n".join(long)


def test_every_folder_is_a_package():
    """A folder without `__init__.py` would import (a namespace package) but be left out of a built wheel by
    `find_packages`; `metrics/` is package data that `evaluate` loads by path."""
    folders = {f.parent for f in PACKAGE.rglob("*.py")} - {PACKAGE / "metrics"}
    assert sorted(str(d.relative_to(PACKAGE)) for d in folders if not (d / "__init__.py").exists()) == []

