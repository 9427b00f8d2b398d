"""The command lines: `adloco-hf` (`python -m adloco_hf.cli`) on a real run folder, and the recipes' `--help`."""

import ast
import json
import os
import shutil
import stat
import subprocess
import sys

import pytest
import torch
from helpers import REPO, sequence_dataset, tiny_model
from transformers import AutoModelForCausalLM

import adloco_hf.reporting.hub as hub
from adloco_hf import AdLoCoConfig, AdLoCoTrainer
from adloco_hf.commands import main


def adloco_hf_cli(*args: str, cwd=None, umask: int = -1) -> subprocess.CompletedProcess:
    """The entry point as a user runs it (`adloco-hf ARGS` is `python -m adloco_hf.cli ARGS`), under `umask` if given."""
    env = os.environ | {"PYTHONPATH": REPO, "MPLCONFIGDIR": "/tmp/adloco-mpl", "HF_HUB_OFFLINE": "1"}
    command = [sys.executable, "-m", "adloco_hf.cli", *args]
    return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=120, umask=umask)


# What a command imported, printed at its exit (`--help` exits through argparse's SystemExit).
IMPORTS_AT_EXIT = (
    "import atexit, sys\n"
    "atexit.register(lambda: print('imported:', sorted(m for m in ('torch', 'transformers', 'peft', 'datasets') "
    "if m in sys.modules)))\n"
    "from adloco_hf.cli import main\n"
    "sys.exit(main(sys.argv[1:]))\n"
)


def test_help_summary_and_plot_import_neither_torch_nor_transformers(run, tmp_path):
    """`adloco-hf --help` took 11-21 s on 2 busy cores, `import adloco_hf` about 8 (issue 41): both imported torch,
    transformers' Trainer and peft, which they do not use. Checked by what they import, not by a time."""
    env = os.environ | {"PYTHONPATH": REPO, "MPLCONFIGDIR": str(tmp_path / "mpl")}
    for args in (["--help"], ["summary", run], ["plot", run, "--out", str(tmp_path / "run.png")]):
        result = subprocess.run(
            [sys.executable, "-c", IMPORTS_AT_EXIT, *args], env=env, capture_output=True, text=True, timeout=120
        )
        assert result.returncode == 0, result.stderr
        assert result.stdout.strip().endswith("imported: []"), (args, result.stdout[-500:])
    lazy = "import sys, adloco_hf; print(sorted(m for m in ('torch', 'transformers', 'peft') if m in sys.modules))"
    result = subprocess.run([sys.executable, "-c", lazy], env=env, capture_output=True, text=True, timeout=120)
    assert result.stdout.strip() == "[]", result.stdout + result.stderr
    # ...and the public names still load on first use.
    named = "import adloco_hf; print(adloco_hf.AdLoCoTrainer.__name__, adloco_hf.norm_test.__name__)"
    result = subprocess.run([sys.executable, "-c", named], env=env, capture_output=True, text=True, timeout=120)
    assert result.stdout.strip() == "AdLoCoTrainer norm_test", result.stderr
    # `recipes/plot_run.py` reads a run through `adloco_hf.inspection`, which loads each name on first use.
    script = [sys.executable, os.path.join(REPO, "recipes", "plot_run.py"), run, "--out", str(tmp_path / "p.png")]
    as_main = IMPORTS_AT_EXIT.split("from adloco_hf.cli")[0] + "import runpy\nsys.argv = sys.argv[1:]\n"
    as_main += "runpy.run_path(sys.argv[0], run_name='__main__')\n"
    plot = subprocess.run(
        [sys.executable, "-c", as_main, *script[1:]], env=env, capture_output=True, text=True, timeout=120
    )
    assert plot.returncode == 0 and plot.stdout.strip().endswith("imported: []"), plot.stdout[-500:] + plot.stderr


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> str:
    """A real run's output_dir: 2 rounds of a tiny Llama, checkpoints at steps 2 and 4, evaluations, merged/."""
    out = str(tmp_path_factory.mktemp("cli") / "run")
    args = AdLoCoConfig(
        output_dir=out, max_steps=4, inner_steps=2, save_steps=2, per_device_train_batch_size=2, max_batch_size=4,
        use_cpu=True, report_to=[], disable_tqdm=True, eval_strategy="steps", eval_steps=2, seed=0,
    )  # fmt: skip
    trainer = AdLoCoTrainer(
        model=tiny_model(), args=args, train_dataset=sequence_dataset(64), eval_dataset=sequence_dataset(8, seed=2)
    )
    trainer.train()
    trainer.end()
    return out


def copy_of(run: str, tmp_path) -> str:
    return str(shutil.copytree(run, tmp_path / "run"))


# ---- adloco-hf ----


def test_the_entry_point_prints_its_usage_and_is_declared_in_setup_py():
    result = adloco_hf_cli("--help")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("usage: adloco-hf [-h] [--version] COMMAND ...")
    for command in ("summary", "plot", "verify", "export", "push"):
        assert f"\n    {command} " in result.stdout, result.stdout
    assert main([]) == 2  # no command: the usage, on stderr
    tree = ast.parse(open(os.path.join(REPO, "setup.py"), encoding="utf-8").read())
    setup = next(n for n in ast.walk(tree) if isinstance(n, ast.Call) and getattr(n.func, "id", None) == "setup")
    entry_points = ast.literal_eval(next(k.value for k in setup.keywords if k.arg == "entry_points"))
    assert entry_points == {"console_scripts": ["adloco-hf = adloco_hf.cli:main"]}
    import adloco_hf.cli

    assert callable(adloco_hf.cli.main)


def test_summary_prints_the_runs_table_and_json(run, capsys):
    result = adloco_hf_cli("summary", run)
    assert result.returncode == 0, result.stderr
    assert f"AdLoCo run: {run}" in result.stdout
    assert "rounds                 2 (global step 4)" in result.stdout
    assert "eval perplexity" in result.stdout
    assert main(["summary", run, "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["rounds"] == 2 and summary["global_step"] == 4, summary
    assert main(["summary", os.path.dirname(run)]) == 1
    error = capsys.readouterr().err
    assert error.startswith("error: ") and "adloco_rounds.jsonl" in error, error


def test_plot_writes_the_png(run, tmp_path):
    out = tmp_path / "run.png"
    result = adloco_hf_cli("plot", run, "--out", str(out))
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"wrote {out}"
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_verify_checks_every_checkpoint_and_model_and_names_a_damaged_file(run, tmp_path):
    result = adloco_hf_cli("verify", run)
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    assert [line.split()[:2] for line in lines] == [
        ["ok", "checkpoint-4:"], ["ok", "checkpoint-2:"], ["ok", "merged:"]
    ], lines  # fmt: skip
    assert "manifest (" in lines[0] and "21 tensors read" in lines[2]

    damaged = copy_of(run, tmp_path)
    weights = os.path.join(damaged, "checkpoint-2", "model.safetensors")
    os.truncate(weights, os.path.getsize(weights) - 100)
    merged = os.path.join(damaged, "merged", "model.safetensors")
    os.truncate(merged, os.path.getsize(merged) - 100)  # no manifest there: safetensors itself must notice
    result = adloco_hf_cli("verify", damaged)
    assert result.returncode == 1
    assert "ok       checkpoint-4:" in result.stdout
    assert f"DAMAGED  checkpoint-2: {weights} has" in result.stdout and "truncated" in result.stdout
    assert "DAMAGED  merged: model.safetensors cannot be read" in result.stdout
    assert "error: 2 of 3 folder(s) damaged" in result.stderr
    assert main(["verify", os.path.join(damaged, "checkpoint-4")]) == 0  # a single checkpoint


def test_export_writes_a_plain_folder_that_loads_the_merged_weights(run, tmp_path, capsys):
    dest = tmp_path / "exported"
    result = adloco_hf_cli("export", run, str(dest), "--dtype", "bfloat16", umask=0o022)
    assert result.returncode == 0, result.stderr
    # save_pretrained writes model.safetensors with mode 0600 (transformers 5.23, safetensors 0.8): the export gets the
    # umask's modes, so that others can read it on a shared file system.
    modes = {name: stat.S_IMODE(os.stat(dest / name).st_mode) for name in os.listdir(dest)}
    assert set(modes.values()) == {0o644}, modes
    assert "LlamaForCausalLM" in result.stdout
    assert sorted(os.listdir(dest)) == [
        "README.md",
        "adloco_run.png",  # the run's plot, which the card shows
        "config.json",
        "generation_config.json",
        "model.safetensors",
    ]
    exported = AutoModelForCausalLM.from_pretrained(dest)
    merged = AutoModelForCausalLM.from_pretrained(os.path.join(run, "merged"))
    assert exported.dtype == torch.bfloat16
    for (name, a), (_, b) in zip(exported.state_dict().items(), merged.state_dict().items(), strict=True):
        assert torch.equal(a, b.to(torch.bfloat16)), name
    card = (dest / "README.md").read_text()
    assert f'from_pretrained("{dest}")' in card and "/merged" not in card
    assert main(["export", run, str(dest)]) == 1
    error = capsys.readouterr().err
    assert "not empty" in error and "--overwrite" in error, error


class FakeHubApi:
    """Records the uploads (nothing here reaches the Hub); the first `fail` uploads raise."""

    def __init__(self, fail: int = 0):
        self.calls, self.fail = [], fail

    def create_repo(self, repo_id, private=None, exist_ok=False, **kwargs):
        self.calls.append(("create_repo", repo_id, private))
        return type("RepoUrl", (), {"repo_id": repo_id})()

    def upload_folder(self, *, repo_id, folder_path, path_in_repo=None, commit_message=None, revision=None):
        files = {name: open(os.path.join(folder_path, name), "rb").read() for name in sorted(os.listdir(folder_path))}
        self.calls.append(("upload_folder", repo_id, path_in_repo, files))
        if self.fail:
            self.fail -= 1
            raise ConnectionError("[Errno 111] Connection refused")
        return "commit-sha"


def test_push_uploads_the_merged_folder_with_a_card_that_loads_from_the_repo(run, tmp_path, monkeypatch, capsys):
    copy = copy_of(run, tmp_path)
    api = FakeHubApi()
    monkeypatch.setattr(hub, "get_hub_api", lambda token=None: api)
    assert main(["push", copy, "me/tiny-adloco", "--private"]) == 0
    assert capsys.readouterr().out.strip() == f"uploaded {copy}/merged to me/tiny-adloco"
    (create, repo, private), (upload, repo2, path_in_repo, files) = api.calls
    assert (create, repo, private, upload, repo2, path_in_repo) == (
        "create_repo", "me/tiny-adloco", True, "upload_folder", "me/tiny-adloco", None
    )  # fmt: skip
    assert files["model.safetensors"] == open(os.path.join(run, "merged", "model.safetensors"), "rb").read()
    assert b'from_pretrained("me/tiny-adloco")' in files["README.md"]

    failing = FakeHubApi(fail=3)
    monkeypatch.setattr(hub, "get_hub_api", lambda token=None: failing)
    monkeypatch.setattr(hub, "PUSH_RETRY_SECONDS", 0.001)
    assert main(["push", copy, "me/tiny-adloco"]) == 1
    error = capsys.readouterr().err
    assert error.startswith(f"error: could not upload {copy}/merged to the Hub repo me/tiny-adloco"), error
    assert "after 3 tries" in error


# ---- the recipes' --help ----


@pytest.mark.parametrize("recipe", ["pretrain_c4", "finetune_clm"])
def test_a_recipes_help_starts_with_its_description_then_adlocos_options(recipe):
    script = os.path.join(REPO, "recipes", f"{recipe}.py")
    env = os.environ | {"PYTHONPATH": REPO, "COLUMNS": "120"}
    result = subprocess.run([sys.executable, script, "--help"], env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == f"usage: {recipe}.py [-h] [--config FILE.yaml] [--OPTION VALUE ...]"
    docstring = __import__(f"recipes.{recipe}", fromlist=["_"]).__doc__
    assert lines[2] == docstring.splitlines()[0]  # the description, right after the one-line usage
    sections = [line[:-1] for line in lines if line and not line.startswith(" ") and line.endswith(":")]
    assert sections == [
        "options",  # -h and --config
        "AdLoCo: rounds",
        "AdLoCo: instances and merges",
        "AdLoCo: batch size",
        "AdLoCo: workers and failures",
        "this recipe (ScriptArguments)",
        "transformers TrainingArguments",
    ], sections
    first = lines.index("AdLoCo: rounds:")
    assert lines[first + 3].lstrip().startswith("--inner_steps"), lines[first : first + 4]
    assert lines.index("AdLoCo: rounds:") < 60  # AdLoCo's options on the first screen, not from line ~667
    # The sections only move the help's lines: parsing still reads every option.
    module = __import__(f"recipes.{recipe}", fromlist=["_"])
    required = ["--model_name_or_path", "m", "--dataset_files", "x.jsonl"] if recipe == "finetune_clm" else []
    namespace = module.build_parser().parse_args([*required, "--inner_steps", "5", "--learning_rate", "0.1"])
    assert (namespace.inner_steps, namespace.learning_rate) == (5, 0.1)
