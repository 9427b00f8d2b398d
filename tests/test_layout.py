"""The package's import graph: dependencies point one way (trainer → worker → the rest), with no cycle.

Type-only imports count too: a `TYPE_CHECKING` import of the trainer is still a dependency on it.
"""

import ast
import pathlib

import pytest


PACKAGE = pathlib.Path(__file__).resolve().parent.parent / "adloco_hf"


def module_name(path: pathlib.Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: pathlib.Path, modules: set[str]) -> set[str]:
    """Package modules imported anywhere in the file (module level, functions, TYPE_CHECKING blocks)."""
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
            targets = [base] + [f"{base}.{alias.name}" for alias in node.names]
        else:
            continue
        found |= {t for t in targets if t in modules}
    return found - {name}


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    files = sorted(PACKAGE.rglob("*.py"))
    modules = {module_name(f) for f in files}
    return {module_name(f): imports_of(f, modules) for f in files}


def test_nothing_in_the_package_imports_the_trainer(graph):
    importers = sorted(m for m, deps in graph.items() if "adloco_hf.trainer" in deps and m != "adloco_hf")
    assert importers == []


def test_the_worker_does_not_import_the_trainer_or_transformers_trainer_machinery(graph):
    assert "adloco_hf.trainer" not in graph["adloco_hf.worker"]
    assert "adloco_hf.worker" in graph["adloco_hf.trainer"]


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
