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


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs an NVIDIA GPU")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def records(caplog):
    """Records of adloco_hf's loggers, which hang under the (non-propagating) `transformers` logger (pytest >= 8
    attaches caplog's handler to such loggers itself; otherwise it is added here)."""
    library = logging.getLogger("transformers")
    added = caplog.handler not in library.handlers
    if added:
        library.addHandler(caplog.handler)
    yield caplog
    if added:
        library.removeHandler(caplog.handler)
