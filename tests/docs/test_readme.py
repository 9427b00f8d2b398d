"""The README and docs/ as a user reads them: every command that runs a recipe parses with that recipe's own parser,
the ones that run in seconds at tiny sizes run end to end, the README's first example trains on CPU workers, every
link resolves, and the configuration page's defaults are `AdLoCoConfig`'s."""

import argparse
import ast
import contextlib
import dataclasses
import glob
import importlib
import io
import json
import os
import random
import re
import shlex
import stat
import subprocess
import sys
from dataclasses import dataclass

import pytest
from helpers import DATA_BUILDERS, REPO, launch
from transformers import TrainingArguments

from adloco_hf import AdLoCoConfig
from adloco_hf.cli import parse_args_with_yaml


DOC_FILES = [
    os.path.join(REPO, "README.md"),
    *sorted(glob.glob(os.path.join(REPO, "docs", "*.md"))),
    *sorted(glob.glob(os.path.join(REPO, "docs", "results", "*.md"))),  # the results data's index
]
SHELL_LANGUAGES = ("bash", "sh", "shell", "console", "")
# Commands that start a program: the Python interpreter (any path to it), accelerate and torchrun.
COMMAND_START = re.compile(
    r"^(?:sudo\s+)?(?:[A-Za-z_][A-Za-z0-9_]*=\S*\s+)*(?:\S*python3?\s|accelerate\s+launch\s|torchrun\s)"
)
ENV_ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")


def relative(path: str) -> str:
    return os.path.relpath(path, REPO)


@dataclass(frozen=True)
class Command:
    """A shell command of a page: where it is and its text (continuation lines joined, comments dropped)."""

    path: str
    line: int
    text: str

    def __str__(self) -> str:
        return f"{relative(self.path)}:{self.line}: {self.text}"


def fenced_blocks(text: str):
    """(language, first line number of the body, body) of every fenced code block."""
    for match in re.finditer(r"^( *)```([\w-]*)[^\n]*\n(.*?)^\1```", text, re.S | re.M):
        yield match.group(2), text.count("\n", 0, match.start(3)) + 1, match.group(3)


def block_commands(path: str, first_line: int, body: str) -> list[Command]:
    """The commands of a shell block: `\\`-continued lines joined, comment lines and blank lines left out."""
    commands, pending, start = [], "", None
    for number, raw in enumerate(body.split("\n"), start=first_line):
        line = re.sub(r"^ *", "", raw) if not pending else raw.strip()
        if not pending and (not line.strip() or line.lstrip().startswith("#")):
            continue
        start = number if not pending else start
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        commands.append(Command(path, start, (pending + line).strip()))
        pending = ""
    return commands


def page_commands(path: str) -> list[Command]:
    """Every shell command of a page: the lines of its shell blocks, and code spans in its prose that start a
    program (`python recipes/plot_run.py OUTPUT_DIR`, which may wrap onto the next line)."""
    text = open(path, encoding="utf-8").read()
    commands = []
    for language, first_line, body in fenced_blocks(text):
        if language in SHELL_LANGUAGES:
            commands.extend(block_commands(path, first_line, body))
    prose = re.sub(r"^( *)```.*?^\1```", lambda m: "\n" * m.group(0).count("\n"), text, flags=re.S | re.M)
    for match in re.finditer(r"`([^`]+)`", prose):
        span = " ".join(match.group(1).split())
        if COMMAND_START.match(span + " ") and "recipes" in span:  # prose names `accelerate launch` too
            commands.append(Command(path, prose.count("\n", 0, match.start()) + 1, span))
    return commands


@dataclass(frozen=True)
class RecipeRun:
    """A command that runs a recipe: the module to import, the recipe's arguments, and the launcher's."""

    command: Command
    module: str
    args: list[str]
    env: dict[str, str]
    launcher: str  # "python", "accelerate" or "torchrun"
    error: str | None = None  # the launcher's parser rejected the command: reported by the test, not at collection


def recipe_run(command: Command) -> RecipeRun | None:
    """The recipe a command runs (`python recipes/X.py`, `python -m recipes.X`, `accelerate launch ... recipes/X.py`,
    `torchrun ... recipes/X.py`), or None for any other command. The launchers' own options are parsed with
    accelerate's and torchrun's parsers."""
    tokens = shlex.split(command.text, comments=True)
    if tokens and tokens[0] == "sudo":
        tokens = tokens[1:]
    if tokens and tokens[0] == "srun":  # SLURM runs the launcher on every node (docs/multi_node.md)
        tokens = tokens[1:]
        while tokens and tokens[0].startswith("-"):
            tokens = tokens[1:]
    env = {}
    while tokens and ENV_ASSIGNMENT.match(tokens[0]):
        key, _, value = tokens.pop(0).partition("=")
        env[key] = value
    if not tokens:
        return None
    program = os.path.basename(tokens[0])
    if program in ("python", "python3"):
        launcher, module_flag = "python", tokens[1] == "-m"
        script, args = (tokens[2], tokens[3:]) if module_flag else (tokens[1], tokens[2:])
    elif tokens[:2] == ["accelerate", "launch"]:
        from accelerate.commands.launch import launch_command_parser

        namespace = parse_or_fail(launch_command_parser(), tokens[2:], command)
        launcher, module_flag = "accelerate", bool(namespace.module)
        script, args = namespace.training_script, namespace.training_script_args
        if namespace.config_file is not None:
            assert os.path.isfile(os.path.join(REPO, namespace.config_file)), f"{command}: no {namespace.config_file}"
    elif program == "torchrun":
        from torch.distributed.run import get_args_parser

        namespace = parse_or_fail(get_args_parser(), tokens[1:], command)
        launcher, module_flag = "torchrun", bool(namespace.module)
        script, args = namespace.training_script, namespace.training_script_args
    else:
        return None
    if module_flag:
        module = script
    else:
        if not script.startswith("recipes/"):
            return None
        assert script.endswith(".py") and os.path.isfile(os.path.join(REPO, script)), f"{command}: no {script}"
        module = script[: -len(".py")].replace("/", ".")
    if not module.startswith("recipes"):
        return None
    return RecipeRun(command, module, list(args), env, launcher)


def last_line(stream: io.StringIO) -> str:
    """argparse's error line, without the usage (hundreds of lines for the Trainer recipes)."""
    lines = stream.getvalue().strip().splitlines()
    return lines[-1] if lines else ""


def parse_or_fail(parser: argparse.ArgumentParser, args: list[str], command: Command):
    """`parser.parse_args(args)`, failing the test with argparse's own message (and the command) on an error."""
    stderr = io.StringIO()
    try:
        with contextlib.redirect_stderr(stderr), contextlib.redirect_stdout(io.StringIO()):
            return parser.parse_args(args)
    except SystemExit as error:
        if error.code == 0:  # --help
            return None
        pytest.fail(f"{command}\nis rejected by its parser (exit {error.code}): {last_line(stderr)}")


def recipe_module(name: str):
    """The module whose parser a recipe uses: the module itself, or a package's `__main__` where the package exports
    no `parse_args` (none of today's benchmarks needs it: each exports its parser)."""
    module = importlib.import_module(name)
    if not hasattr(module, "parse_args") and hasattr(module, "__path__"):
        module = importlib.import_module(f"{name}.__main__")
    return module


def parse_recipe_args(run: RecipeRun) -> argparse.Namespace:
    """Parse the command's arguments with the recipe's own parser, without training or building anything.

    The Trainer recipes (`build_parser()`: `HfArgumentParser` over their `ScriptArguments` and `AdLoCoConfig`) go
    through `parse_args_with_yaml`, which reads and checks `--config FILE.yaml`, then stop at argparse's namespace
    (building `AdLoCoConfig` would need the command's devices); the other recipes have `parse_args(argv)`."""
    module = recipe_module(run.module)
    if hasattr(module, "build_parser"):
        parser, parsed = module.build_parser(), {}

        def parse_only(args=None, **_):
            parsed["namespace"] = parse_or_fail(parser, args, run.command)
            return (parsed["namespace"],)

        parser.parse_args_into_dataclasses = parse_only
        try:
            parse_args_with_yaml(parser, run.args)
        except SystemExit as error:  # --help, from argparse inside parse_args_with_yaml's first pass
            if error.code != 0:
                raise
        except ValueError as error:  # a YAML file with an unknown key or a bad value
            pytest.fail(f"{run.command}\n{error}")
        return parsed.get("namespace")
    assert hasattr(module, "parse_args"), f"{run.module} has no parse_args(argv) for the docs' commands to use"
    stderr = io.StringIO()
    try:
        with contextlib.redirect_stderr(stderr), contextlib.redirect_stdout(io.StringIO()):
            parsed = module.parse_args(run.args)
    except SystemExit as error:
        if error.code == 0:  # --help
            return None
        pytest.fail(f"{run.command}\nis rejected by its parser (exit {error.code}): {last_line(stderr)}")
    return parsed[0] if isinstance(parsed, tuple) else parsed


def documented_runs() -> list[RecipeRun]:
    runs = []
    for path in DOC_FILES:
        for command in page_commands(path):
            if "recipes" not in command.text:
                continue
            try:
                run = recipe_run(command)
            except (pytest.fail.Exception, AssertionError) as error:
                run = RecipeRun(command, "?", [], {}, "?", error=str(error))
            if run is not None:
                runs.append(run)
    return runs


RUNS = documented_runs()


def test_the_docs_commands_are_found():
    """The extraction itself: a README and docs/ that lost their commands (or a parser of them that finds none)
    must not pass the tests below by having nothing to check."""
    scripts = {run.module for run in RUNS}
    assert {"recipes.pretrain_c4", "recipes.finetune_clm", "recipes.plot_run"} <= scripts, scripts
    assert {
        "recipes.benchmarks.convergence",
        "recipes.benchmarks.links",
        "recipes.benchmarks.device_profile",
    } <= scripts
    assert {"python", "accelerate"} <= {run.launcher for run in RUNS}
    assert len(RUNS) >= 25, [str(run.command) for run in RUNS]
    readme = [run for run in RUNS if run.command.path.endswith("README.md")]
    assert any("--dataset_files" in run.args and run.module == "recipes.finetune_clm" for run in readme)


@pytest.mark.parametrize("run", RUNS, ids=lambda run: f"{relative(run.command.path)}:{run.command.line}")
def test_every_documented_recipe_command_parses(run):
    """Each command's arguments, parsed by that recipe's own parser (and its YAML file checked key by key)."""
    if run.error is not None:
        pytest.fail(run.error)
    namespace = parse_recipe_args(run)
    if run.module in ("recipes.pretrain_c4", "recipes.finetune_clm"):
        # Where the command's values can be built on this machine (one process, no fp16 without a GPU), build the
        # dataclasses as the recipe does: AdLoCoConfig's own checks (save_steps a multiple of inner_steps, ...).
        # A resume needs the run's checkpoints, which AdLoCoConfig looks for (docs/resuming.md's `last`).
        resumes = "--resume_from_checkpoint" in run.args
        if namespace is not None and not namespace.fp16 and namespace.processes_per_worker == 1 and not resumes:
            script_args, training_args = recipe_module(run.module).parse_args(run.args)
            assert isinstance(training_args, AdLoCoConfig) and dataclasses.is_dataclass(script_args)


def test_a_rejected_argument_fails_the_check(tmp_path):
    """The check above can fail: a documented command with a misspelt option, or a YAML key the recipe lacks."""
    run = next(run for run in RUNS if run.module == "recipes.finetune_clm")
    broken = RecipeRun(run.command, run.module, [*run.args, "--inner_stepz", "5"], run.env, run.launcher)
    with pytest.raises(pytest.fail.Exception, match="unrecognized arguments: --inner_stepz"):
        parse_recipe_args(broken)
    config = tmp_path / "typo.yaml"
    config.write_text("inner_stepz: 5\n")
    run = next(run for run in RUNS if run.module == "recipes.pretrain_c4")
    broken = RecipeRun(run.command, run.module, ["--config", str(config)], run.env, run.launcher)
    with pytest.raises(pytest.fail.Exception, match="unknown key"):
        parse_recipe_args(broken)
    run = next(run for run in RUNS if run.module == "recipes.benchmarks.convergence")
    broken = RecipeRun(run.command, run.module, [*run.args, "--methods", "no_such_method"], run.env, run.launcher)
    with pytest.raises(pytest.fail.Exception, match="invalid choice"):
        parse_recipe_args(broken)


def test_every_documented_adloco_hf_command_parses():
    """`adloco-hf ...` in the docs' shell blocks, parsed by the command's own parser (tests/recipes/test_cli.py runs
    each command on a real run)."""
    from adloco_hf.commands import build_parser

    commands = [c for path in DOC_FILES for c in page_commands(path) if c.text.split()[0] == "adloco-hf"]
    assert {shlex.split(c.text, comments=True)[1] for c in commands} >= {
        "summary",
        "plot",
        "verify",
        "export",
        "push",
    }, commands
    for command in commands:
        words = shlex.split(command.text, comments=True)[1:]
        parsed = parse_or_fail(build_parser(), words, command)
        assert parsed is not None or words == ["--version"], command  # --version prints and exits 0


# ---- run end to end: the fine-tune command and the plot of its run, offline and at tiny sizes ----

TINY = ["--max_steps", "20", "--block_size", "32", "--report_to", "none", "--disable_tqdm", "true"]


def write_notes(path, documents: int = 60) -> list[str]:
    rng = random.Random(0)
    texts = [
        " ".join(
            f"The {rng.choice(['cat', 'dog', 'fox'])} in the {rng.choice(['barn', 'garden'])} eats "
            f"{rng.choice(['apples', 'bread'])}."
            for _ in range(rng.randint(4, 8))
        )
        for _ in range(documents)
    ]
    with open(path, "w", encoding="utf-8") as f:
        f.writelines(json.dumps({"text": text}) + "\n" for text in texts)
    return texts


def run_as_documented(run: RecipeRun, cwd, extra: list[str], timeout: int = 300) -> subprocess.CompletedProcess:
    """The command's own arguments from `cwd` (where the files it names were made), `extra` appended (the command
    line's last value wins), with the interpreter running these tests."""
    script = os.path.join(REPO, *run.module.split(".")) + ".py"
    env = (
        os.environ
        | run.env
        | {
            "PYTHONPATH": REPO,
            "HF_HUB_OFFLINE": "1",
            "HF_DATASETS_OFFLINE": "1",
            "HF_HOME": str(cwd / "hf"),
            "MPLCONFIGDIR": str(cwd / "mpl"),
            "OMP_NUM_THREADS": "1",
        }
    )
    command = [sys.executable, script, *run.args, *extra]
    result = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert result.returncode == 0, f"{run.command}\n{result.stdout[-4000:]}\n{result.stderr[-4000:]}"
    return result


def test_the_readme_fine_tune_command_and_plot_run_as_written(tmp_path):
    """`python recipes/finetune_clm.py --model_name_or_path outputs/demo/merged --dataset_files my.jsonl ...` from a
    folder holding a tiny `outputs/demo/merged` and `my.jsonl`, then `python recipes/plot_run.py OUTPUT_DIR` on it."""
    import datasets

    from adloco_hf.data import load_or_train_tokenizer
    from adloco_hf.presets import build_model

    readme = [run for run in RUNS if run.command.path.endswith("README.md")]
    finetune = next(run for run in readme if run.module == "recipes.finetune_clm" and "--dataset_files" in run.args)
    model_dir = finetune.args[finetune.args.index("--model_name_or_path") + 1]
    data_file = finetune.args[finetune.args.index("--dataset_files") + 1]
    output_dir = finetune.args[finetune.args.index("--output_dir") + 1]
    texts = write_notes(tmp_path / data_file)
    tokenizer = load_or_train_tokenizer(
        None, datasets.Dataset.from_dict({"text": texts}), vocab_size=300, cache_dir=str(tmp_path / "cache")
    )
    tokenizer.save_pretrained(tmp_path / model_dir)
    build_model("tiny", vocab_size=len(tokenizer), seed=0).save_pretrained(tmp_path / model_dir)

    run_as_documented(finetune, tmp_path, TINY)
    results = json.loads((tmp_path / output_dir / "finetune_results.json").read_text())
    assert results["perplexity_after"] < results["perplexity_before"], results
    # An evaluation at every round's end and the merged model's at the end: the run's plot has its eval points (the
    # recipe left adloco_eval.jsonl empty before, issue 41).
    evals = [json.loads(line) for line in open(tmp_path / output_dir / "adloco_eval.jsonl")]
    assert [(e["global_step"], e["instance"]) for e in evals] == [(10, 0), (20, 0), (20, "merged")], evals

    plot = next(run for run in RUNS if run.module == "recipes.plot_run" and run.args == ["OUTPUT_DIR"])
    plot = RecipeRun(plot.command, plot.module, [output_dir], plot.env, plot.launcher)
    summary = run_as_documented(plot, tmp_path, [])
    assert (tmp_path / output_dir / "adloco_run.png").stat().st_size > 0, summary.stdout


def test_the_readme_quotes_no_test_count():
    """A count of tests drifts with every change (the README said 900 where `make test` collected 1,701): the
    README names the suite, the collection counts it."""
    text = open(os.path.join(REPO, "README.md"), encoding="utf-8").read()
    assert not re.search(r"\d[\d,]* tests\b", text), re.findall(r".{40}\d[\d,]* tests\b.{10}", text)


def test_the_docs_round_lines_use_the_consoles_units():
    """Every round line quoted in the README and docs/ spells its bytes as the console does (`format_bytes`: B, KiB,
    MiB, ...): docs/outputs.md showed "sent 6.2 MB" where the console prints MiB."""
    from adloco_hf.common.formats import format_bytes

    units = {format_bytes(1024**power * 3).split()[-1] for power in range(5)}
    quoted = [
        (relative(path), match.group(1))
        for path in DOC_FILES
        for match in re.finditer(r"round \d+ \(step \d+\) \|[^\n`]*?\| sent [\d.]+ (\w+)", open(path).read())
    ]
    assert quoted, "no round line quoted in the docs"
    assert all(unit in units for _, unit in quoted), [q for q in quoted if q[1] not in units]


# ---- links and the configuration page ----


def anchors(path: str) -> set[str]:
    """GitHub's anchors of a page's headings: lower case, punctuation dropped, spaces to hyphens."""
    text = open(path, encoding="utf-8").read()
    text = re.sub(r"^( *)```.*?^\1```", "", text, flags=re.S | re.M)
    result = set()
    for heading in re.findall(r"^#+ +(.+?) *$", text, re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.lower().replace("`", "")).replace(" ", "-")
        result.add(slug)
    return result


@pytest.mark.parametrize("path", DOC_FILES, ids=relative)
def test_every_link_and_image_of_the_docs_resolves(path):
    text = open(path, encoding="utf-8").read()
    text = re.sub(r"^( *)```.*?^\1```", "", text, flags=re.S | re.M)
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+://", target):
            continue
        file, _, anchor = target.partition("#")
        resolved = os.path.normpath(os.path.join(os.path.dirname(path), file)) if file else path
        assert os.path.exists(resolved), f"{relative(path)}: {target} does not exist"
        if anchor and resolved.endswith(".md"):
            assert anchor in anchors(resolved), f"{relative(path)}: no heading for #{anchor} in {relative(resolved)}"


def test_the_configuration_page_gives_the_defaults_of_the_code():
    """Every `| \\`field\\` | default | ... |` row of docs/configuration.md is AdLoCoConfig's field and default."""
    text = open(os.path.join(REPO, "docs", "configuration.md"), encoding="utf-8").read()
    fields = {field.name: field for field in dataclasses.fields(AdLoCoConfig)}
    rows = re.findall(r"^\| `(\w+)` \| `([^`|]+)` \|", text, re.M)
    assert len(rows) >= 45, rows
    for name, default in rows:
        assert name in fields, f"docs/configuration.md: {name} is not a field of AdLoCoConfig"
        assert ast.literal_eval(default) == fields[name].default, f"{name}: {default} in the docs"
    own = {name for name in fields if name not in {f.name for f in dataclasses.fields(TrainingArguments)}}
    assert own <= {name for name, _ in rows}, f"undocumented: {sorted(own - {name for name, _ in rows})}"


# ---- the README's first example ----


def readme_example() -> str:
    text = open(os.path.join(REPO, "README.md"), encoding="utf-8").read()
    section = text[text.index("## Use it in your script") :]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


# What the example's data calls build (the tokenizer's training and the packing), recorded per rank by a preamble
# of the launched script: the example's order decides whether one worker builds or all of them race to.
RECORD_BUILDS = """
import os, torch.distributed as dist
import adloco_hf.data.packing as _packing, adloco_hf.data.tokenizer as _tokenizer
def _recorded(module, name):
    original = getattr(module, name)
    def build(*args, **kwargs):
        rank = dist.get_rank() if dist.is_initialized() else "no group"
        with open(os.path.join({folder!r}, "builds.txt"), "a") as f:
            f.write(f"{{name}} rank {{rank}}\\n")
        return original(*args, **kwargs)
    setattr(module, name, build)
_recorded(_packing, "_tokenize_and_pack")
_recorded(_tokenizer, "_train_byte_level_bpe")
"""


@pytest.mark.multiprocess
def test_the_first_example_of_the_readme_trains_on_cpu_workers(tmp_path):
    code = readme_example()
    assert "use_cpu" not in code  # AdLoCoConfig forms the CPU world itself
    # Only shorter: fewer steps, and every path under tmp_path.
    code = code.replace("max_steps=200", "max_steps=40").replace("eval_steps=100", "eval_steps=40")
    code = code.replace('"out"', repr(str(tmp_path / "out"))).replace('"cache"', repr(str(tmp_path / "cache")))
    script = tmp_path / "train.py"
    preamble = RECORD_BUILDS.format(folder=str(tmp_path))
    script.write_text(preamble + code + "\nassert trainer.args.world_size == 4, trainer.args.world_size\n")
    result = launch(str(script), num_processes=4, timeout=600)
    output = result.stdout + result.stderr
    assert os.path.isfile(tmp_path / "out" / "merged" / "model.safetensors")
    assert "round 2 (step 40)" in output  # the round line reaches the user's console at log_level="info"
    # A quiet console: one line per round (its adloco/* dict goes to report_to only), a banner that holds (no
    # sys.maxsize epochs), and none of the warnings every run printed: the Trainer's PAD/BOS/EOS (the model now takes
    # the tokenizer's special tokens, `build_model(tokenizer=...)`) and torch's pin_memory (nothing to pin into on a
    # CPU). The run ends with the recipes' summary in one line, on rank 0.
    assert output.count("round 1 (step 20)") == 1 and "{'adloco/" not in output
    assert "9,223,372,036,854,775,807" not in output and "Num Epochs" not in output
    assert "AdLoCo: 4 workers, 2 instances, max_steps 40 in 2 rounds of 20 inner steps" in output
    assert "PAD/BOS/EOS" not in output and "pin_memory" not in output
    assert output.count("AdLoCo run done: 2 rounds (step 40), instances 2 -> 2") == 1  # merged at the end
    # The 4 workers share one cache: rank 0 trained the tokenizer and packed the data once, the others read it (with
    # the data built before the config, there is no process group yet and every worker builds into the cache at once).
    builds = sorted((tmp_path / "builds.txt").read_text().splitlines())
    assert builds == ["_tokenize_and_pack rank 0", "_train_byte_level_bpe rank 0"], builds


def test_the_first_example_of_the_readme_runs_as_written_with_python(tmp_path):
    """`python train.py`, one process: it was refused in train() after the data was built ("num_instances=2 exceeds
    the 1 worker(s)"), although the example says it runs as written on a laptop CPU (issue 41). It trains one
    instance, warns, writes the README's files with the modes umask 022 gives, and into a log file (not a terminal)
    prints each round line on a line of its own, without transformers' lines for every file of a save."""
    code = readme_example().replace("max_steps=200", "max_steps=40").replace("eval_steps=100", "eval_steps=40")
    code = code.replace('"out"', repr(str(tmp_path / "out"))).replace('"cache"', repr(str(tmp_path / "cache")))
    (tmp_path / "train.py").write_text(code)
    env = os.environ | {
        "PYTHONPATH": REPO,
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "HF_HOME": str(tmp_path / "hf"),
        "MPLCONFIGDIR": str(tmp_path / "mpl"),
        "OMP_NUM_THREADS": "2",
    }
    log = tmp_path / "train.log"
    with open(log, "w") as f:
        result = subprocess.run(
            [sys.executable, "train.py"], cwd=tmp_path, env=env, stdout=f, stderr=subprocess.STDOUT, timeout=600,
            umask=0o022,
        )  # fmt: skip
    output = log.read_text()
    assert result.returncode == 0, output[-6000:]
    assert "num_instances=2, but this launch has one process (`python train.py`)" in output, output[-6000:]
    out = tmp_path / "out"
    for name in ("adloco_rounds.jsonl", "adloco_eval.jsonl", "adloco_run.png", "merged/model.safetensors"):
        assert (out / name).is_file(), name
    modes = {
        os.path.relpath(os.path.join(folder, name), out): stat.S_IMODE(os.stat(os.path.join(folder, name)).st_mode)
        for folder, folders, files in os.walk(out)
        for name in folders + files
    }
    expected = {path: 0o755 if (out / path).is_dir() else 0o644 for path in modes}
    assert modes == expected, {path: oct(mode) for path, mode in modes.items() if mode != expected[path]}
    assert "merged/model.safetensors" in modes and "checkpoint-40/model.safetensors" in modes, sorted(modes)
    rounds = [line for line in output.split("\n") if "round " in line and "(step " in line]
    assert len(rounds) == 2 and all(line.startswith("[transformers] round ") for line in rounds), rounds
    assert "Configuration saved in" not in output and ".tmp-" not in output
    assert f"saved {out / 'checkpoint-40'}" in output
    assert "PAD/BOS/EOS" not in output and "pin_memory" not in output  # printed by every run before issue 55
    assert output.count("AdLoCo run done: 2 rounds (step 40)") == 1  # the recipes' summary, in a user's script


@pytest.mark.parametrize(
    ("written", "mistake", "error", "words"),
    [
        ("eval_steps=100", "eval_steps=30", ValueError, "eval_steps=30 is not a multiple of inner_steps=20"),
        ("inner_steps=20,", "inner_step=20,", TypeError, "no field inner_step=20 (did you mean inner_steps"),
        ("batch_size_cap=32,", "batch_size_cap=1,", ValueError, "batch_size_cap=1 is below the initial request"),
        ("max_steps=200,", "max_steps=10,", ValueError, "inner_steps=20 is more than max_steps=10"),
    ],
    ids=["eval_steps", "misspelt field", "batch_size_cap", "max_steps"],
)
def test_the_readme_example_checks_its_config_before_building_any_data(
    tmp_path, monkeypatch, written, mistake, error, words
):
    """The example run with a config mistake: AdLoCoConfig refuses it before the corpus is read, the tokenizer
    trained, the data packed or the model built, naming the field."""

    def too_early(name):
        def build(*args, **kwargs):
            raise AssertionError(f"the README example calls {name} before AdLoCoConfig has checked its settings")

        return build

    for module, name in DATA_BUILDERS:
        monkeypatch.setattr(module, name, too_early(name))
    code = readme_example().replace('"out"', repr(str(tmp_path / "out"))).replace('"cache"', repr(str(tmp_path)))
    assert written in code
    with pytest.raises(error) as raised:
        exec(compile(code.replace(written, mistake, 1), "README.md", "exec"), {})
    assert words in str(raised.value), raised.value


def test_the_readme_example_prepares_its_data_under_main_process_first():
    """Every data call of the example (reading, tokenizer, packing) sits in `with args.main_process_first(...)`."""
    tree = ast.parse(readme_example())
    data_calls = {"load_text_corpus", "load_or_train_tokenizer", "build_lm_datasets"}

    def called(nodes) -> set[str]:
        return {
            node.func.id
            for tree in nodes
            for node in ast.walk(tree)
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
        }

    guarded = [
        node
        for node in tree.body
        if isinstance(node, ast.With)
        and any(
            isinstance(item.context_expr, ast.Call)
            and getattr(item.context_expr.func, "attr", None) == "main_process_first"
            for item in node.items
        )
    ]
    assert guarded, "the README example has no `with args.main_process_first(...)` block"
    outside = [node for node in tree.body if node not in guarded]
    assert data_calls <= called(guarded), called(guarded)
    assert not data_calls & called(outside), data_calls & called(outside)
    # ...and the block comes after the config: `main_process_first` needs the workers' group the config forms.
    config = next(i for i, node in enumerate(tree.body) if "AdLoCoConfig" in called([node]))
    assert config < tree.body.index(guarded[0])
