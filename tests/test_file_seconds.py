"""`file_seconds`: each test file's seconds recorded from a run, and the longest files handed to xdist first."""

import json
from types import SimpleNamespace

import file_seconds
import pytest


def item(nodeid):
    return SimpleNamespace(nodeid=nodeid)


def test_files_go_longest_first_unknown_files_before_them_and_tests_keep_their_order_within_a_file():
    items = [item(n) for n in ("a.py::t1", "b.py::t1", "a.py::t2", "c.py::t1", "new.py::t1", "b.py::t2")]
    seconds = {"a.py": 3.0, "b.py": 40.0, "c.py": 0.1}
    ordered = [i.nodeid for i in file_seconds.longest_files_first(items, seconds)]
    assert ordered == ["new.py::t1", "b.py::t1", "b.py::t2", "a.py::t1", "a.py::t2", "c.py::t1"]


def test_a_run_records_each_files_setup_call_and_teardown_seconds_and_keeps_the_files_it_did_not_run(
    tmp_path, monkeypatch
):
    path = tmp_path / "seconds.json"
    path.write_text(json.dumps({"old.py": 7.0, "a.py": 1.0}))
    monkeypatch.setenv(file_seconds.ENV, str(path))
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)
    monkeypatch.setattr(file_seconds, "_recorded", None)
    file_seconds.start_recording()
    for nodeid, duration in (("a.py::t1", 2.0), ("a.py::t1", 0.25), ("b.py::K::t", 30.0), ("a.py::t2", 0.5)):
        file_seconds.add(SimpleNamespace(nodeid=nodeid, duration=duration))
    file_seconds.write()
    assert json.loads(path.read_text()) == {"b.py": 30.0, "old.py": 7.0, "a.py": 2.8}
    assert list(json.loads(path.read_text())) == ["b.py", "old.py", "a.py"]  # longest first, to read
    assert not (tmp_path / "seconds.json.tmp").exists()


@pytest.mark.parametrize("worker", ["gw0", None])
def test_only_the_process_that_sees_every_report_records(tmp_path, monkeypatch, worker):
    path = tmp_path / "seconds.json"
    monkeypatch.setattr(file_seconds, "_recorded", None)
    if worker:
        monkeypatch.setenv(file_seconds.ENV, str(path))
        monkeypatch.setenv("PYTEST_XDIST_WORKER", worker)  # an xdist worker: its controller records
    else:
        monkeypatch.delenv(file_seconds.ENV, raising=False)  # not asked to record
    file_seconds.start_recording()
    file_seconds.add(SimpleNamespace(nodeid="a.py::t", duration=1.0))
    file_seconds.write()
    assert not path.exists()


def test_the_committed_record_maps_test_files_to_seconds():
    seconds = file_seconds.load()
    assert seconds, "tests/file_seconds.json is missing: record it (see tests/file_seconds.py)"
    assert all(name.startswith("tests/") and name.endswith(".py") for name in seconds)
    assert all(isinstance(value, float | int) and value >= 0 for value in seconds.values())
