"""The package's layout: folders by part of the algorithm, imports that only run down the layers, no cycle, and no
module over 400 lines (docs/architecture.md draws the layers); and recipes/'s: one folder per benchmark over a public
toolkit, no private names read across modules, the library through its public surface (recipes/benchmarks/README.md).

Imports anywhere in a file count (module level, inside functions, `TYPE_CHECKING` blocks).
"""

import ast
import pathlib
import re

import pytest


PACKAGE = pathlib.Path(__file__).resolve().parent.parent / "adloco_hf"

# Lowest first: a folder may import from itself and from the folders before it, never from one after it.
LAYERS = [
    "common",
    "quorum",
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
# `adloco-hf`'s commands, the test launcher, the benchmarks' inspection surface and fault points. They sit above every
# folder.
TOP = {
    "adloco_hf",
    "adloco_hf._aliases",
    "adloco_hf.cli",
    "adloco_hf.commands",
    "adloco_hf.fault_points",
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


MAX_MODULES = 15


def test_no_folder_holds_more_than_15_modules():
    """A folder is one part of the algorithm; past 15 modules it holds two (`__init__.py` aside)."""
    folders = {f.parent for f in PACKAGE.rglob("*.py")}
    crowded = {
        str(d.relative_to(PACKAGE)): n
        for d in folders
        if (n := len([f for f in d.glob("*.py") if f.name != "__init__.py"])) > MAX_MODULES
    }
    assert crowded == {}


@pytest.mark.parametrize("old, new", [("worker.ddp", "worker.replicas.ddp"), ("worker.fsdp", "worker.replicas.fsdp"),
                                      ("worker.replica", "worker.replicas.replica"), ("worker_fsdp", "worker.replicas.fsdp"),
                                      ("common.restart", "config.restart")])  # fmt: skip
def test_a_moved_module_still_imports_by_its_old_path_as_the_same_module(old, new):
    import importlib

    assert importlib.import_module(f"adloco_hf.{old}") is importlib.import_module(f"adloco_hf.{new}")


# ---- recipes/: the recipes and the benchmarks (a tool set: one folder per benchmark over a public toolkit) ----
REPO = PACKAGE.parent
RECIPES = REPO / "recipes"
BENCHMARKS = RECIPES / "benchmarks"
TOOLKIT = "recipes.benchmarks.toolkit"
# The library as recipes and benchmarks may use it: the public API, the recipes' command lines, models and launcher,
# the contract paths (DESIGN §3), the inspection surface for what benchmarks read of the internals, and the fault
# points the fault benchmarks wrap.
LIBRARY_SURFACE = {
    "adloco_hf",
    "adloco_hf.batch_size",
    "adloco_hf.cli",
    "adloco_hf.data",
    "adloco_hf.fault_points",
    "adloco_hf.inspection",
    "adloco_hf.presets",
    "adloco_hf.switch_mode",
    "adloco_hf.testing",
}


def dotted_name(path: pathlib.Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def project_modules() -> set[str]:
    return {dotted_name(f) for root in (PACKAGE, RECIPES) for f in root.rglob("*.py")}


def import_statements(name: str, source: str, is_package: bool = False) -> list[tuple[str, list | None, ast.AST]]:
    """(module, its imported aliases or None for `import module`, node) of every import of module `name`, relative
    imports resolved."""
    package = name if is_package else name.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(alias.name, None, node) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            found.append((base, node.names, node))
    return found


def imports_in(path: pathlib.Path) -> list[tuple[str, list | None, ast.AST]]:
    return import_statements(dotted_name(path), path.read_text(), path.name == "__init__.py")


def is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def private_reads(where: str, name: str, source: str, project: set[str]) -> list[str]:
    """Where module `name` reads another module's private names: `from m import _x`, an import of a module whose path
    has a private part (`m._x`), or `m._x` on a module it imported. Modules outside `project` (torch, datasets) are
    their own business."""
    roots = {m.split(".")[0] for m in project}
    found, bound = [], set()
    for module, aliases, node in import_statements(name, source):
        if module.split(".")[0] not in roots:
            continue
        if any(is_private(part) for part in module.split(".")):
            found.append(f"{where}:{node.lineno} imports the private module {module}")
        for alias in node.names:
            imported = alias.name if aliases is None else f"{module}.{alias.name}"
            if aliases is not None and is_private(alias.name):
                found.append(f"{where}:{node.lineno} imports the private name {imported}")
            if imported in project:
                bound.add(alias.asname or (alias.name if aliases is not None else alias.name.split(".")[0]))
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            if node.value.id in bound and is_private(node.attr):
                found.append(f"{where}:{node.lineno} reads {node.value.id}.{node.attr}")
    return found


@pytest.fixture(scope="module")
def recipe_files() -> list[pathlib.Path]:
    return sorted(RECIPES.rglob("*.py"))


@pytest.fixture(scope="module")
def recipe_graph(recipe_files) -> dict[str, set[str]]:
    """Module → the recipes modules it imports (`from package import module` counts as the module)."""
    modules = {dotted_name(f) for f in recipe_files}
    graph = {}
    for path in recipe_files:
        deps = set()
        for module, aliases, _ in imports_in(path):
            submodules = [f"{module}.{a.name}" for a in aliases or [] if f"{module}.{a.name}" in modules]
            deps |= set(submodules)
            if aliases is None or len(submodules) < len(aliases):
                deps.add(module)
        graph[dotted_name(path)] = {d for d in deps if d in modules} - {dotted_name(path)}
    return graph


def benchmark_of(module: str) -> str | None:
    """The folder of recipes/benchmarks/ (a benchmark, or the toolkit) a module belongs to; None outside them."""
    parts = module.split(".")
    return parts[2] if len(parts) > 2 and parts[:2] == ["recipes", "benchmarks"] else None


def test_no_recipes_module_is_over_400_lines(recipe_files):
    long = sorted(
        f"{f.relative_to(REPO)}: {n} lines" for f in recipe_files if (n := len(f.read_text().splitlines())) > MAX_LINES
    )
    assert long == [], "\n".join(long)


def test_the_recipes_import_graph_has_no_cycle(recipe_graph):
    state: dict[str, int] = {}

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for dep in sorted(recipe_graph.get(node, ())):
            if state.get(dep) == 1:
                raise AssertionError("import cycle: " + " → ".join(path[path.index(dep) :] + [dep]))
            if dep not in state:
                visit(dep, path + [dep])
        state[node] = 2

    for module in sorted(recipe_graph):
        if module not in state:
            visit(module, [module])


def test_every_benchmark_is_a_folder_run_by_its_main():
    """`python -m recipes.benchmarks.NAME` runs NAME/__main__.py; nothing but the package's __init__ sits loose."""
    assert sorted(p.name for p in BENCHMARKS.glob("*.py") if p.name != "__init__.py") == []
    folders = sorted(d for d in BENCHMARKS.iterdir() if d.is_dir() and any(d.rglob("*.py")))
    assert len(folders) >= 10, folders
    for folder in folders:
        needed = ["__init__.py"] if folder.name == "toolkit" else ["__init__.py", "__main__.py"]
        assert [n for n in needed if not (folder / n).exists()] == [], folder
    packages = {f.parent for f in RECIPES.rglob("*.py")}
    assert sorted(str(d.relative_to(REPO)) for d in packages if not (d / "__init__.py").exists()) == []


def test_the_toolkit_imports_no_benchmark(recipe_graph):
    upward = sorted(
        f"{m} imports {d}"
        for m, deps in recipe_graph.items()
        if m.startswith(TOOLKIT)
        for d in deps
        if not d.startswith(TOOLKIT)
    )
    assert upward == [], "\n".join(upward)


def test_a_benchmark_reads_another_only_through_its_package(recipe_graph):
    """A benchmark may use another's public names (device_profile names gpu_bench's launch logs by its `LAUNCHES_SUFFIX`) as that
    package exports them, never its modules; the recipes' scripts import no benchmark."""
    wrong = []
    for module, deps in recipe_graph.items():
        mine = benchmark_of(module)
        for dep in deps:
            theirs = benchmark_of(dep)
            if theirs is None or theirs == mine or (theirs == "toolkit" and mine is not None):
                continue
            if mine is None or dep != f"recipes.benchmarks.{theirs}":
                wrong.append(f"{module} imports {dep}")
    assert sorted(wrong) == [], "\n".join(sorted(wrong))


def test_no_recipes_module_reads_another_modules_private_names(recipe_files):
    """Private names stay in their module: what another one needs is public (in the library: adloco_hf.inspection).
    The same check can cover the package (`PACKAGE`'s files) once it holds there."""
    project = project_modules()
    found = [
        line
        for f in recipe_files
        for line in private_reads(str(f.relative_to(REPO)), dotted_name(f), f.read_text(), project)
    ]
    assert found == [], "\n".join(found)


def test_the_private_names_check_finds_each_kind_of_read():
    source = (
        "import torch\n"
        "from recipes.benchmarks.toolkit import stats\n"
        "from recipes.benchmarks.toolkit.results import _cell\n"
        "import adloco_hf.data._cache\n"
        "stats._private(torch._dynamo)\n"
    )
    project = project_modules() | {"recipes.benchmarks.toolkit.stats", "recipes.benchmarks.toolkit.results"}
    found = private_reads("probe.py", "recipes.benchmarks.probe", source, project)
    assert found == [
        "probe.py:3 imports the private name recipes.benchmarks.toolkit.results._cell",
        "probe.py:4 imports the private module adloco_hf.data._cache",
        "probe.py:5 reads stats._private",
    ]


# What the test suite's own files would be imported as (`helpers`, a worker script), with tests/ on the path.
TEST_SUITE_MODULES = {"tests"} | {p.stem for p in (REPO / "tests").rglob("*.py") if not p.stem.startswith("test_")}
TESTS_PATH = re.compile(r"(^|[/\\])tests([/\\]|$)")
# The one run of the test suite itself from recipes/: `make gpu-check` runs its CUDA tests as a user would (`pytest -m
# cuda tests`), the whole suite, not a script or helper of it.
SUITE_RUNS = {("recipes/benchmarks/gpu_check/steps.py", "tests")}


def reaches_into_tests(where: str, name: str, source: str) -> list[str]:
    """Where module `name` uses the test suite at run time: a string naming a path under tests/ (`"tests"` as a path
    part, as `os.path.join(REPO, "tests", ...)` or `f"{REPO}/tests/..."` write it) outside a docstring, or an import
    of a module of tests/ (`helpers`, a worker script). A docstring or a comment may point at a test."""
    tree = ast.parse(source)
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    found = [
        f"{where}:{node.lineno} names the path {node.value!r}"
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and id(node) not in docstrings
        and TESTS_PATH.search(node.value)
        and (where, node.value) not in SUITE_RUNS
    ]
    found += [
        f"{where}:{node.lineno} imports {module}"
        for module, _, node in import_statements(name, source)
        if module.split(".")[0] in TEST_SUITE_MODULES
    ]
    return found


def test_no_recipes_module_runs_anything_of_the_test_suite(recipe_files):
    """A benchmark launches and imports only recipes/ and the library: a worker script, a fault hook or a helper it
    needs lives under recipes/ (the fault benchmarks' worker: `toolkit/worker/`), and the tests reuse it from there."""
    found = [
        line
        for f in recipe_files
        for line in reaches_into_tests(str(f.relative_to(REPO)), dotted_name(f), f.read_text())
    ]
    assert found == [], "\n".join(found)


def test_the_test_suite_check_finds_each_kind_of_use():
    source = (
        '"""Launches the test suite\'s worker, `tests/scripts/adloco_worker.py`."""\n'
        "import os\n"
        "import helpers\n"
        "from adloco_worker import RecordingTrainer\n"
        "WORKER = os.path.join(REPO, 'tests', 'scripts', 'adloco_worker.py')\n"
        "OTHER = f'{REPO}/tests/scripts/restarts.py'\n"
        "NOT_A_PATH = 'the tests pass'\n"
    )
    assert reaches_into_tests("probe.py", "recipes.benchmarks.probe", source) == [
        "probe.py:5 names the path 'tests'",
        "probe.py:6 names the path '/tests/scripts/restarts.py'",
        "probe.py:3 imports helpers",
        "probe.py:4 imports adloco_worker",
    ]


def test_recipes_use_the_library_through_its_public_surface(recipe_files):
    """The public API, the recipes' helpers (`cli`, `presets`, `testing`) and `adloco_hf.inspection`: the folders
    inside the package can move without breaking a recipe or a benchmark."""
    modules = project_modules()
    inside = []
    for f in recipe_files:
        for module, aliases, node in imports_in(f):
            named = [module] if aliases is None else [f"{module}.{a.name}" for a in aliases] + [module]
            reached = [m for m in named if m in modules and m.split(".")[0] == "adloco_hf"]
            inside += [f"{f.relative_to(REPO)}:{node.lineno} imports {m}" for m in reached if m not in LIBRARY_SURFACE]
    assert sorted(set(inside)) == [], "\n".join(sorted(set(inside)))


BENCHMARK_PATH = re.compile(r"(?<![\w/])recipes/benchmarks/[A-Za-z_/]+\.py")
BENCHMARK_MODULE = re.compile(r"(?<![\w.])recipes\.benchmarks(?:\.[a-z_]+)+")


def stale_benchmark_names(text: str) -> list[str]:
    """The benchmark files (`recipes/benchmarks/x/y.py`) and modules (`recipes.benchmarks.x.y`) that `text` names
    and that do not exist: a benchmark that moved leaves no stale pointer in a docstring, a comment or a guide."""
    stale = [path for path in BENCHMARK_PATH.findall(text) if not (REPO / path).is_file()]
    for module in BENCHMARK_MODULE.findall(text):
        path = REPO / module.replace(".", "/")
        # `recipes.benchmarks.gpu_bench.throughput.main` names a function: the longest existing prefix must be a module
        while not (path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()) and path != REPO:
            path = path.parent
        if path.relative_to(REPO).parts[:2] != ("recipes", "benchmarks") or len(path.relative_to(REPO).parts) < 3:
            stale.append(module)
    return stale


def test_every_benchmark_named_in_the_code_tests_and_docs_exists():
    texts = [*PACKAGE.rglob("*.py"), *(REPO / "tests").rglob("*.py"), *(REPO / "recipes").rglob("*.py")]
    texts += [*(REPO / "docs").rglob("*.md"), *(REPO / "recipes").rglob("*.md"), REPO / "README.md", REPO / "Makefile"]
    stale = []
    for path in texts:
        if path == pathlib.Path(__file__).resolve():
            continue  # this file names made-up modules in its own checks
        stale += [f"{path.relative_to(REPO)}: {name}" for name in stale_benchmark_names(path.read_text())]
    assert stale == [], "\n".join(stale)


def test_the_stale_benchmark_check_can_fail():
    text = "see `recipes/benchmarks/links.py`, `recipes.benchmarks._convergence_worker` and recipes.benchmarks.links"
    assert stale_benchmark_names(text) == ["recipes/benchmarks/links.py", "recipes.benchmarks._convergence_worker"]


def test_no_two_test_files_share_a_name():
    """pytest imports each test file by its base name (no `__init__.py` under tests/): a second file of the same name
    in another folder fails to collect ("import file mismatch") on a clean clone."""
    names: dict[str, list[str]] = {}
    for path in (REPO / "tests").rglob("test_*.py"):
        names.setdefault(path.name, []).append(str(path.relative_to(REPO)))
    assert {name: paths for name, paths in names.items() if len(paths) > 1} == {}
