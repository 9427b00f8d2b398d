"""The supported transformers/accelerate releases: the check at import, setup.py and the Makefile read them from one
place, and the shim for what differs inside the range."""

import os
import shutil
import subprocess
import sys
import textwrap

import pytest
from helpers import REPO, sequence_dataset, tiny_model
from transformers import Trainer, default_data_collator

from adloco_hf import AdLoCoConfig, AdLoCoTrainer
from adloco_hf.common import versions


def fake_distribution(root, package: str, version: str) -> str:
    """A folder whose `{package}-{version}.dist-info` is what `importlib.metadata` finds first when it leads the path."""
    info = root / f"{package}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {package}\nVersion: {version}\n")
    return str(root)


def import_with(*fakes: str, env: dict | None = None) -> subprocess.CompletedProcess:
    """`import adloco_hf` in a fresh interpreter whose path starts with the fake distributions; prints the error's
    message and whether transformers had been imported when it was raised."""
    script = textwrap.dedent(
        """
        import sys, warnings
        warnings.simplefilter("always")
        try:
            import adloco_hf
            print("imported")
        except ImportError as error:
            print("ImportError:", error)
            print("transformers imported:", "transformers" in sys.modules)
        """
    )
    path = os.pathsep.join([*fakes, REPO])
    return subprocess.run(
        [sys.executable, "-c", script], env={**os.environ, "PYTHONPATH": path, **(env or {})},
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def test_an_older_transformers_is_refused_at_import_before_it_is_imported(tmp_path):
    fake = fake_distribution(tmp_path, "transformers", "5.9.0")
    run = import_with(fake)
    lowest = versions.LOWEST["transformers"]
    assert f"ImportError: adloco_hf supports transformers>={lowest},<6" in run.stdout, run.stdout + run.stderr
    assert "transformers 5.9.0 is installed" in run.stdout
    assert f"pip install 'transformers>={lowest},<6'" in run.stdout
    assert "transformers imported: False" in run.stdout  # named before transformers could fail some other way


def test_a_newer_untested_release_imports_and_warns_once_on_the_first_process(tmp_path):
    fake = fake_distribution(tmp_path, "accelerate", "1.99.0")
    run = import_with(fake)
    assert "imported" in run.stdout, run.stderr
    tested = f"tested with accelerate {versions.LOWEST['accelerate']} to {versions.HIGHEST['accelerate']}"
    assert run.stderr.count("accelerate 1.99.0 is newer than the releases adloco_hf was tested with") == 1
    assert tested in run.stderr
    quiet = import_with(fake, env={"RANK": "1"})  # every worker imports the package: one warning, from the first
    assert "imported" in quiet.stdout and "1.99.0" not in quiet.stderr


@pytest.mark.parametrize(
    "installed, refused",
    [("5.10.0", True), ("6.0.0.dev0", True), ("6.1.0", True), (None, True), ("5.10.1", False), ("5.99.0", False)],
)
def test_the_range_is_from_the_lowest_tested_to_the_next_major(monkeypatch, installed, refused):
    monkeypatch.setitem(versions.LOWEST, "transformers", "5.10.1")
    real = versions._installed
    monkeypatch.setattr(versions, "_installed", lambda p: installed if p == "transformers" else real(p))
    monkeypatch.setattr(versions, "_warned", {"transformers"})  # the warning for newer releases is tested above
    if refused:
        with pytest.raises(ImportError, match=r"transformers>=5\.10\.1,<6.*pip install 'transformers>=5\.10\.1,<6'"):
            versions.check_installed_versions()
    else:
        versions.check_installed_versions()


def test_the_ranges_hold_the_tested_and_reference_releases():
    for package in versions.LOWEST:
        releases = (versions.LOWEST, versions.REFERENCE, versions.HIGHEST)
        lowest, reference, highest = (versions._release(r[package]) for r in releases)
        assert lowest <= reference <= highest and highest[0] == lowest[0], package


def test_setup_py_requires_the_supported_ranges():
    """setup.py run for real (its `setup()` replaced by a probe): install_requires comes from versions.py."""
    pytest.importorskip("setuptools")
    probe = "import runpy, setuptools; setuptools.setup = lambda **kw: print(kw['install_requires']); runpy.run_path('setup.py')"
    run = subprocess.run(
        [sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True, timeout=60, check=True
    )
    requires = eval(run.stdout)  # noqa: S307 - a list literal printed by the line above
    lowest = versions.LOWEST
    assert f"transformers>={lowest['transformers']},<6" in requires
    assert f"accelerate>={lowest['accelerate']},<2" in requires


@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
def test_the_makefile_installs_the_reference_and_tests_the_lowest_and_highest():
    def pins(releases):
        return " ".join(f"{package}=={version}" for package, version in releases.items())

    def dry_run(target):
        return subprocess.run(
            ["make", "-n", "-B", target], cwd=REPO, capture_output=True, text=True, timeout=60
        ).stdout

    assert f'pip install -q -e ".[dev]" {pins(versions.REFERENCE)}' in dry_run("install")
    planned = dry_run("test-versions")
    for venv, releases in ((".venv-lowest", versions.LOWEST), (".venv-highest", versions.HIGHEST)):
        assert f'{venv}/bin/python -m pip install -q -e ".[dev]" {pins(releases)}' in planned
        assert f'{venv}/bin/python -m pytest -m "not slow" tests/reporting/test_hub.py tests/trainer' in planned


@pytest.mark.parametrize("has_end", [True, False])
def test_end_training_uses_the_trainers_end_or_what_it_calls_before_5_18(tmp_path, monkeypatch, has_end):
    args = AdLoCoConfig(output_dir=str(tmp_path), max_steps=4, inner_steps=2, use_cpu=True, report_to=[])
    trainer = AdLoCoTrainer(
        model=tiny_model(), args=args, train_dataset=sequence_dataset(16), data_collator=default_data_collator
    )
    calls = []
    monkeypatch.setattr(trainer.accelerator, "end_training", lambda: calls.append("accelerator.end_training"))
    if has_end:
        monkeypatch.setattr(Trainer, "end", lambda self: calls.append("Trainer.end"), raising=False)
    else:  # transformers < 5.18
        monkeypatch.delattr(Trainer, "end", raising=False)
    trainer.end()
    assert calls == (["Trainer.end"] if has_end else ["accelerator.end_training"])
