"""Each test file's seconds, recorded from a run and read back to hand pytest-xdist the longest files first.

`make test` runs whole files in one of two processes (`--dist loadfile`), handed out in the order they are collected.
A long file collected last (the restarts, the README's launches) then runs alone at the end while the other process
idles. Under xdist the suite's files are therefore collected longest first, from `tests/file_seconds.json` (files it
does not know first of all, as they may be long; tests keep their order within a file). The file is a heuristic for
the order only: a stale one costs time, never a test.

Record it again after the suite changes (only the files that ran are updated):

    ADLOCO_TEST_SECONDS=tests/file_seconds.json make test
"""

import json
import math
import os


PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "file_seconds.json")
ENV = "ADLOCO_TEST_SECONDS"
_recorded: dict[str, float] | None = None  # None: not recording in this process


def file_of(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


def load(path: str = PATH) -> dict[str, float]:
    if not os.path.exists(path):
        return {}
    with open(path) as handle:
        return json.load(handle)


def longest_files_first(items: list, seconds: dict[str, float]) -> list:
    """`items` with whole files ordered by their recorded seconds, longest (and unknown) first; a stable sort."""
    return sorted(items, key=lambda item: -seconds.get(file_of(item.nodeid), math.inf))


def start_recording() -> None:
    """Record in the process that sees every report: the only one, or xdist's controller (not its workers)."""
    global _recorded
    if os.environ.get(ENV) and not os.environ.get("PYTEST_XDIST_WORKER"):
        _recorded = {}


def add(report) -> None:
    """Adds a setup, call or teardown report's seconds to its file (a session fixture's to the file that built it)."""
    if _recorded is not None:
        name = file_of(report.nodeid)
        _recorded[name] = _recorded.get(name, 0.0) + report.duration


def write() -> None:
    """Updates the recorded files' seconds in the file `ADLOCO_TEST_SECONDS` names (atomically)."""
    if not _recorded:
        return
    path = os.environ[ENV]
    seconds = {**load(path), **{name: round(value, 1) for name, value in _recorded.items()}}
    with open(f"{path}.tmp", "w") as handle:
        json.dump(dict(sorted(seconds.items(), key=lambda entry: (-entry[1], entry[0]))), handle, indent=1)
        handle.write("\n")
    os.replace(f"{path}.tmp", path)
