"""`built_once`: a session fixture's folder built by one process of a pytest-xdist run and read by the others."""

import multiprocessing
import os
import time

import pytest
from built_once import built_once


class Factory:
    """What `built_once` uses of pytest's `tmp_path_factory`: each xdist worker's base folder, under a shared one."""

    def __init__(self, shared, worker):
        self.base = shared / f"popen-{worker}"
        self.base.mkdir(parents=True, exist_ok=True)

    def getbasetemp(self):
        return self.base

    def mktemp(self, name):
        folder = self.base / name
        folder.mkdir()
        return folder


def build(folder):
    with open(folder.parent / "builds.log", "a") as log:
        log.write(f"{os.getpid()}\n")
    time.sleep(0.5)  # widens the window in which the other process asks for the folder (no assertion on time)
    (folder / "value").write_text("built")


def worker(shared, name, results):
    os.environ["PYTEST_XDIST_WORKER"] = name
    folder = built_once(Factory(shared, name), "reference", build)
    results.put((name, str(folder), (folder / "value").read_text()))


def test_two_xdist_workers_asking_at_once_build_the_folder_once_and_read_the_same(tmp_path):
    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    processes = [context.Process(target=worker, args=(tmp_path, f"gw{i}", results)) for i in range(2)]
    for process in processes:
        process.start()
    got = sorted(results.get(timeout=120) for _ in processes)
    for process in processes:
        process.join(timeout=60)
        assert process.exitcode == 0
    assert [name for name, _, _ in got] == ["gw0", "gw1"]
    assert {folder for _, folder, _ in got} == {str(tmp_path / "reference")}
    assert {value for _, _, value in got} == {"built"}
    assert len((tmp_path / "builds.log").read_text().split()) == 1


def test_a_build_that_raised_is_built_again_from_an_empty_folder(tmp_path, monkeypatch):
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw0")
    factory = Factory(tmp_path, "gw0")

    def failing(folder):
        (folder / "partial").write_text("half")
        raise RuntimeError("launch failed")

    with pytest.raises(RuntimeError, match="launch failed"):
        built_once(factory, "reference", failing)
    folder = built_once(factory, "reference", build)
    assert sorted(path.name for path in folder.iterdir()) == [".built", "value"]
    assert built_once(factory, "reference", failing) == folder  # built: not asked again


def test_without_xdist_each_session_builds_its_own_folder(tmp_path, monkeypatch):
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)
    folder = built_once(Factory(tmp_path, "main"), "reference", build)
    assert folder == tmp_path / "popen-main" / "reference"
    assert (folder / "value").read_text() == "built"
