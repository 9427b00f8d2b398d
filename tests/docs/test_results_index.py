"""docs/results/README.md names, for every file kept in docs/results/, the command that regenerates it: a file
without a row, a row without a command (or the reason none exists), or a command naming a benchmark or make target
that does not exist fails here. `test_readme.py` parses each of these commands with its benchmark's own parser."""

import os
import re

from helpers import REPO
from test_readme import page_commands, recipe_run


RESULTS = os.path.join(REPO, "docs", "results")
INDEX = os.path.join(RESULTS, "README.md")
# A row that no command of today's code regenerates must say so, and why.
NOT_REGENERABLE = re.compile(r"\bnot regenerable\b|\bneeds an H200\b")


def rows() -> list[tuple[str, str]]:
    """(file cell, command cell) of every row of the index's table."""
    found = []
    for line in open(INDEX, encoding="utf-8"):
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if line.startswith("| ") and len(cells) == 3 and cells[0] not in ("file", "---"):
            found.append((cells[0], cells[1]))
    return found


def named(cell: str) -> set[str]:
    """The paths under docs/results/ a file cell names: its links' targets and its code spans (folders)."""
    links = re.findall(r"\]\(([^)]+)\)", cell)
    spans = re.findall(r"`([^`]+)`", cell)
    return {os.path.normpath(path).rstrip("/") for path in links + spans}


def test_every_results_file_has_a_row():
    covered = set().union(*(named(cell) for cell, _ in rows()))
    kept = set()
    for entry in sorted(os.listdir(RESULTS)):
        if entry == "README.md":
            continue
        if entry == "device_profiles":  # each profile on a row of its own
            kept |= {f"device_profiles/{name}" for name in os.listdir(os.path.join(RESULTS, entry))}
        elif entry == "gpu":  # each device and day's folder on a row
            kept |= {f"gpu/{name}" for name in os.listdir(os.path.join(RESULTS, entry))}
        else:
            kept.add(entry)
    assert sorted(kept - covered) == [], "add a row to docs/results/README.md for these files"
    named_but_absent = sorted(path for path in covered if not os.path.exists(os.path.join(RESULTS, path)))
    assert named_but_absent == []


def test_every_row_names_a_command_that_exists_or_why_none_does():
    makefile = open(os.path.join(REPO, "Makefile"), encoding="utf-8").read()
    targets = set(re.findall(r"^([A-Za-z][\w-]*):", makefile, re.M))
    commands = {command.line: command for command in page_commands(INDEX)}
    lines = open(INDEX, encoding="utf-8").read().splitlines()
    assert len(rows()) >= 20
    for number, line in enumerate(lines, start=1):
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if not line.startswith("| ") or len(cells) != 3 or cells[0] in ("file", "---"):
            continue
        make = re.findall(r"`make ([\w-]+)`", cells[1])
        runs = [recipe_run(commands[number])] if number in commands else []
        assert all(target in targets for target in make), f"line {number}: no such make target {make}"
        for run in runs:
            assert run is not None and run.module.startswith("recipes.benchmarks."), f"line {number}: {run}"
            module_path = os.path.join(REPO, *run.module.split("."))
            assert os.path.isdir(module_path) or os.path.isfile(module_path + ".py"), f"line {number}: {run.module}"
        assert make or runs or NOT_REGENERABLE.search(cells[1]), f"line {number}: no command, and no reason why"


def test_the_index_check_finds_a_missing_row(tmp_path, monkeypatch):
    """The row check itself: a results file the index does not name is reported."""
    import test_results_index as index

    (tmp_path / "README.md").write_text("| file | command that regenerates it | cited in |\n|---|---|---|\n")
    (tmp_path / "orphan.json").write_text("{}")
    monkeypatch.setattr(index, "RESULTS", str(tmp_path))
    monkeypatch.setattr(index, "INDEX", str(tmp_path / "README.md"))
    try:
        index.test_every_results_file_has_a_row()
    except AssertionError as error:
        assert "orphan.json" in str(error)
    else:
        raise AssertionError("a results file without a row passed")
