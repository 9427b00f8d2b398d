"""A session fixture's folder built once per test run, also when pytest-xdist runs the suite in several processes.

Each xdist worker process has its own pytest session, so a `scope="session"` fixture runs once per process: a
launch that several test files read (the resume tests' reference run, the two-by-two DDP run) would run once in each
process that collects one of those files. `built_once` builds the folder in the run's temporary folder that every
worker shares (`tmp_path_factory.getbasetemp().parent` under xdist), under a file lock: the first process to need it
builds it, the others wait and read it. A build that raised leaves no marker, so the next process to need it starts
again from an empty folder.
"""

import fcntl
import os
import shutil
from collections.abc import Callable
from pathlib import Path


DONE = ".built"


def built_once(tmp_path_factory, name: str, build: Callable[[Path], None]) -> Path:
    """The folder `name`, filled by `build(folder)` once per test run (per process without xdist)."""
    base = tmp_path_factory.getbasetemp()
    folder = (base if os.environ.get("PYTEST_XDIST_WORKER") is None else base.parent) / name
    with open(f"{folder}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, also when `build` raises
        if (folder / DONE).exists():
            return folder
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir()
        build(folder)
        (folder / DONE).touch()
    return folder
