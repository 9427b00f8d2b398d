"""A new user's mistakes (issue 55): each one refused or warned about before any data is read, naming the field and
the fix, in a user's own script (the README's example, config first) and in the recipes.

Each case runs the README's example with one mistake written into it and every data call (reading the corpus,
training the tokenizer, packing, building the model) replaced by one that raises `DataRead`: a refusal raised
instead of `DataRead` came before any data was read. A warning must be logged before `DataRead`. The data's own
mistakes (an empty evaluation set) can only be seen once the data exists: they are refused when the trainer is built,
before training.
"""

import logging
import os
import re
from dataclasses import dataclass

import pytest
import torch
from helpers import DATA_BUILDERS, REPO, sequence_dataset, tiny_model, tiny_run_config

from adloco_hf import AdLoCoConfig, AdLoCoTrainer
from adloco_hf.config import compat


def readme_example() -> str:
    """The README's first example (`tests/docs/test_readme.py` runs it as written)."""
    text = open(os.path.join(REPO, "README.md"), encoding="utf-8").read()
    section = text[text.index("## Use it in your script") :]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


class DataRead(Exception):
    """A data call of the README's example ran: nothing before it refused the mistake."""


@dataclass(frozen=True)
class Mistake:
    """One mistake: `written` in the README's example becomes `mistake`; `raises` is the refusal (None: a warning),
    `words` what its message must hold (the field, and the fix)."""

    written: str
    mistake: str
    raises: type[Exception] | None
    words: tuple[str, ...]


# The list: config (types, choices, a misspelt field), paths (output_dir, resume_from_checkpoint), reporting, devices.
# "{tmp}" is the test's folder (files and runs are made there by `situation`).
SETTING = 'report_to="none",'
MISTAKES = {
    # ---- config: a value's type ----
    "outer_lr a string": Mistake(SETTING, SETTING + ' outer_lr="0.7",', TypeError, ("outer_lr='0.7' is a str", "write outer_lr=0.7")),
    "num_instances a string": Mistake("num_instances=2,", 'num_instances="2",', TypeError, ("num_instances='2' is a str", "write num_instances=2")),
    "batch_size_cap a string": Mistake("batch_size_cap=32,", 'batch_size_cap="32",', TypeError, ("batch_size_cap='32' is a str", "write batch_size_cap=32")),
    "inner_steps a string": Mistake("inner_steps=20,", 'inner_steps="20",', TypeError, ("inner_steps='20' is a str, not an integer", "write inner_steps=20")),
    "max_steps a string": Mistake("max_steps=200,", 'max_steps="200",', TypeError, ("max_steps='200' is a str", "write max_steps=200")),
    "learning_rate a string": Mistake("learning_rate=3e-3,", 'learning_rate="3e-3",', TypeError, ("learning_rate='3e-3' is a str", "write learning_rate=0.003")),
    "inner_steps a fraction": Mistake("inner_steps=20,", "inner_steps=20.5,", TypeError, ("inner_steps=20.5 is a float, not an integer", "set an integer")),
    "eta a bool": Mistake(SETTING, SETTING + " eta=True,", TypeError, ("eta=True is a bool, not a number", "set a number")),
    "fp16 a string": Mistake("fp16=torch.cuda.is_available(),", 'fp16="false",', TypeError, ("fp16='false' is a str", "write fp16=False")),
    # ---- config: a choice ----
    "merge_policy misspelt": Mistake(SETTING, SETTING + ' merge_policy="smallest",', ValueError, ("merge_policy='smallest' is not supported", "did you mean 'smallest_pair'")),
    "pseudo_grad_dtype a torch dtype": Mistake(SETTING, SETTING + " pseudo_grad_dtype=torch.bfloat16,", TypeError, ("pseudo_grad_dtype=torch.bfloat16 is a dtype, not a string", "choose one of ['float32', 'bfloat16', 'float16']")),
    "max_batch_size a word": Mistake("max_batch_size=8,", 'max_batch_size="eight",', ValueError, ("max_batch_size='eight'", "set a positive integer or 'auto'")),
    "a misspelt field": Mistake("inner_steps=20,", "inner_step=20,", TypeError, ("no field inner_step=20", "did you mean inner_steps")),
    # ---- the output folder ----
    "output_dir a file": Mistake('output_dir="out",', 'output_dir="{tmp}/notes.txt",', ValueError, ("output_dir='{tmp}/notes.txt' is a file", "Pass the path of a folder")),
    "output_dir inside a file": Mistake('output_dir="out",', 'output_dir="{tmp}/notes.txt/run",', ValueError, ("lies inside {tmp}/notes.txt, which is a file", "Pass the path of a folder")),
    # ---- the checkpoint to resume from ----
    "resume_from_checkpoint a file": Mistake(SETTING, SETTING + ' resume_from_checkpoint="{tmp}/notes.txt",', ValueError, ("resume_from_checkpoint='{tmp}/notes.txt' is a file, not a checkpoint folder", "pass a checkpoint-N folder")),
    "resume_from_checkpoint missing": Mistake(SETTING, SETTING + ' resume_from_checkpoint="{tmp}/out/checkpoint-40",', FileNotFoundError, ("resume_from_checkpoint='{tmp}/out/checkpoint-40' does not exist", "Checkpoints that exist: {tmp}/out: checkpoint-20")),
    "resume_from_checkpoint a run's folder": Mistake(SETTING, SETTING + ' resume_from_checkpoint="{tmp}/out",', ValueError, ("is a run's output_dir, not a checkpoint", "pass one of its checkpoints (checkpoint-20)")),
    "resume_from_checkpoint not AdLoCo's": Mistake(SETTING, SETTING + ' resume_from_checkpoint="{tmp}/plain",', ValueError, ("has no adloco/ folder: it was not written by AdLoCoTrainer", "Pass a checkpoint-N folder of an AdLoCo run")),
    "resume last without a checkpoint": Mistake('output_dir="out",', 'output_dir="{tmp}/new", resume_from_checkpoint="last",', ValueError, ("resume_from_checkpoint='last' resumes the newest checkpoint", "set resume_from_checkpoint='auto'")),
    # ---- reporting ----
    "report_to a package not installed": Mistake(SETTING, 'report_to="wandb",', ValueError, ("report_to='wandb': wandb is not installed", "pip install wandb", "or set report_to='none'")),
    "report_to misspelt": Mistake(SETTING, 'report_to="tensorbord",', ValueError, ("'tensorbord' is not a reporting integration", "did you mean 'tensorboard'")),
    # ---- devices ----
    "fp16 on a CPU": Mistake("fp16=torch.cuda.is_available(),", "fp16=True,", None, ("fp16=True does nothing on a CPU", "Set fp16=False, or bf16=True")),
}  # fmt: skip


def situation(tmp_path) -> None:
    """What the mistakes meet: a file, a run's output_dir with its checkpoint, a folder the Trainer saved alone."""
    (tmp_path / "notes.txt").write_text("not a folder\n")
    (tmp_path / "out" / "checkpoint-20" / "adloco").mkdir(parents=True)
    (tmp_path / "plain").mkdir()


@pytest.fixture
def no_data(monkeypatch):
    def data_read(*args, **kwargs):
        raise DataRead

    for module, name in DATA_BUILDERS:
        monkeypatch.setattr(module, name, data_read)
    monkeypatch.setattr(compat, "_warned", set())  # warnings are said once per process: each case says its own
    # No reporting integration is installed here (wandb is named as one that is not).
    monkeypatch.setattr("transformers.integrations.get_available_reporting_integrations", lambda: [])


def run_readme_with(mistake: Mistake, tmp_path) -> None:
    code = readme_example().replace('"cache"', repr(str(tmp_path / "cache")))
    assert mistake.written in code, mistake.written
    code = code.replace(mistake.written, mistake.mistake.replace("{tmp}", str(tmp_path)), 1)
    code = code.replace('output_dir="out"', f"output_dir={str(tmp_path / 'out')!r}")
    exec(compile(code, "README.md", "exec"), {})


def test_the_list_holds_at_least_15_distinct_mistakes():
    assert len(MISTAKES) >= 15 and len({m.mistake for m in MISTAKES.values()}) == len(MISTAKES)


@pytest.mark.parametrize("name", list(MISTAKES))
def test_every_mistake_is_named_before_any_data_is_read(name, tmp_path, no_data, records):
    if name == "fp16 on a CPU" and torch.cuda.is_available():
        pytest.skip("fp16 is mixed precision on a GPU")
    mistake = MISTAKES[name]
    situation(tmp_path)
    words = [word.replace("{tmp}", str(tmp_path)) for word in mistake.words]
    if mistake.raises is None:  # a warning, then the data (which the test stops)
        with pytest.raises(DataRead):
            run_readme_with(mistake, tmp_path)
        warned = [r.getMessage() for r in records.records if r.levelno == logging.WARNING]
        assert any(all(word in line for word in words) for line in warned), warned
        return
    with pytest.raises(mistake.raises) as raised:
        run_readme_with(mistake, tmp_path)
    message = str(raised.value)
    assert all(word in message for word in words), message


# ---- the recipes: the config is built first, from the command line ----
def recipe_parse(argv: list[str]):
    from recipes import pretrain_c4

    return pretrain_c4.parse_args(["--config", os.path.join(REPO, "tests", "fixtures", "pretrain_tiny.yaml"), *argv])


@pytest.mark.parametrize(
    ("argv", "error", "words"),
    [
        (["--output_dir", "{tmp}/notes.txt"], ValueError, "output_dir='{tmp}/notes.txt' is a file"),
        (["--output_dir", "{tmp}/o", "--resume_from_checkpoint", "{tmp}/notes.txt"], ValueError, "is a file, not a"),
        (
            ["--output_dir", "{tmp}/o", "--resume_from_checkpoint", "last"],
            ValueError,
            "which has no checkpoint-* folder",
        ),
        (["--output_dir", "{tmp}/o", "--report_to", "wandb"], ValueError, "wandb is not installed"),
        (["--output_dir", "{tmp}/o", "--merge_policy", "smallest"], SystemExit, None),  # argparse's choices
    ],
    ids=["output_dir a file", "resume a file", "resume last, no checkpoint", "report_to", "a choice"],
)
def test_the_recipes_name_the_same_mistakes_when_their_config_is_built(tmp_path, no_data, argv, error, words):
    situation(tmp_path)
    argv = [arg.replace("{tmp}", str(tmp_path)) for arg in argv]
    with pytest.raises(error) as raised:
        recipe_parse(argv)
    if words is not None:
        assert words.replace("{tmp}", str(tmp_path)) in str(raised.value), raised.value


def test_the_recipes_warn_about_fp16_on_a_cpu_when_their_config_is_built(tmp_path, no_data, records):
    if torch.cuda.is_available():
        pytest.skip("fp16 is mixed precision on a GPU")
    _, args = recipe_parse(["--output_dir", str(tmp_path / "o"), "--fp16", "true"])
    assert args.fp16 and not args.dataloader_pin_memory  # nothing to pin into on a CPU: no warning from each loader
    assert any("fp16=True does nothing on a CPU" in r.getMessage() for r in records.records)


# ---- the data's own mistakes: refused when the trainer is built, before training ----
def test_an_empty_evaluation_set_and_none_are_refused_before_training(tmp_path):
    data, args = sequence_dataset(32), tiny_run_config(tmp_path, eval_strategy="steps", eval_steps=6)
    with pytest.raises(ValueError, match=r"eval_dataset has no samples.*set eval_strategy='no'"):
        AdLoCoTrainer(model=tiny_model(), args=args, train_dataset=data, eval_dataset=data.select([]))
    with pytest.raises(ValueError, match="eval_dataset"):  # none at all: the Trainer's own refusal (or ours)
        AdLoCoTrainer(model=tiny_model(), args=args, train_dataset=data)


def test_a_config_without_mistakes_passes_every_check(tmp_path):
    args = AdLoCoConfig(output_dir=str(tmp_path / "out"), max_steps=20, inner_steps=10, max_batch_size="8")
    assert args.max_batch_size == 8 and args.report_to == []
