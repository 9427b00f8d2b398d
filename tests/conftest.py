import logging
import os
import sys

import pytest
import torch


TESTS = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(TESTS)
# The tests import `helpers` (tests/) and the benchmarks' package `recipes.benchmarks` (the repository root); neither
# is part of the installed library. (pytest's `pythonpath = [".", "tests"]` setting would do the same.)
for folder in (REPO, TESTS):
    if folder not in sys.path:
        sys.path.insert(0, folder)
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import file_seconds  # noqa: E402  (tests/, on the path from here)


def pytest_collection_modifyitems(config, items):
    if os.environ.get("PYTEST_XDIST_WORKER"):
        items[:] = file_seconds.longest_files_first(items, file_seconds.load())
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs an NVIDIA GPU")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)


def pytest_configure(config):
    file_seconds.start_recording()


def pytest_runtest_logreport(report):
    file_seconds.add(report)


def pytest_sessionfinish(session, exitstatus):
    file_seconds.write()


@pytest.fixture(scope="session", autouse=True)
def profile_cache(tmp_path_factory):
    """The goodput rule's startup profiles (`batch/profile_cache.py`) are kept in a folder of this test run, shared by
    its xdist processes (as `built_once`'s folders are) and by every run the tests launch, never in the user's
    ~/.cache: runs of one configuration then decide from the same profile, as a user's second run does."""
    base = tmp_path_factory.getbasetemp()
    folder = (base if os.environ.get("PYTEST_XDIST_WORKER") is None else base.parent) / "adloco-cache"
    folder.mkdir(exist_ok=True)
    saved = os.environ.get("ADLOCO_HF_CACHE")
    os.environ["ADLOCO_HF_CACHE"] = str(folder)
    yield folder
    if saved is None:
        os.environ.pop("ADLOCO_HF_CACHE", None)
    else:
        os.environ["ADLOCO_HF_CACHE"] = saved


@pytest.fixture
def records(caplog, monkeypatch):
    """Records of adloco_hf's loggers, each once. They hang under the `transformers` logger, which does not propagate
    to the root logger unless the environment has `CI=true` (transformers' own rule): the test makes it
    non-propagating and gives it caplog's handler, so a record reaches the handler by one path whatever `CI` says
    (pytest >= 8 also attaches the handler to non-propagating loggers itself)."""
    library = logging.getLogger("transformers")
    monkeypatch.setattr(library, "propagate", False)
    added = caplog.handler not in library.handlers
    if added:
        library.addHandler(caplog.handler)
    yield caplog
    if added:
        library.removeHandler(caplog.handler)


@pytest.fixture(scope="session")
def resume_reference(tmp_path_factory) -> str:
    """The output folder of the resume tests' uninterrupted run (`helpers.RESUME_CONFIG`, 2 workers, attention dropout
    0.1, `scripts/adloco_worker.py`): launched once per session, shared by every test that compares a stopped and
    resumed run with it (read only). Built once per test run, also under pytest-xdist (`built_once`)."""
    import json

    from built_once import built_once
    from helpers import RESUME_CONFIG, SCRIPTS, launch, worker_spec

    def build(root):
        spec = worker_spec(str(root / "out"), root / "probe", 2, RESUME_CONFIG, dropout=0.1)
        launch(os.path.join(SCRIPTS, "adloco_worker.py"), json.dumps(spec), num_processes=2, timeout=300)

    return str(built_once(tmp_path_factory, "resume-reference", build) / "out")


@pytest.fixture(scope="session")
def two_by_two_ddp(tmp_path_factory):
    """(output folder, probe folder) of `helpers.TWO_BY_TWO` with DDP inside each worker (`scripts/adloco_worker.py`,
    4 processes): launched once, read by test_worker_processes.py's checks and compared with FSDP's run of the same
    config in test_worker_fsdp.py. Built once per test run, also under pytest-xdist (`built_once`)."""
    from built_once import built_once
    from helpers import SCRIPTS, TWO_BY_TWO, launch_run

    def build(root):
        launch_run(os.path.join(SCRIPTS, "adloco_worker.py"), root, TWO_BY_TWO, world_size=4, name="ddp")

    root = built_once(tmp_path_factory, "two-by-two", build)
    return str(root / "ddp"), root / "probe-ddp"
