"""Command lines: the recipes' (dataclass arguments from a YAML file, overridden on the command line; their `--help`
grouped with AdLoCo's options first; their logging), and `adloco-hf` for what comes after training.

`adloco-hf summary|plot|verify|export|push` (also `python -m adloco_hf.cli`) is in `commands.py`; [`main`] runs it.

`accelerate launch recipes/pretrain_c4.py --config recipes/configs/demo.yaml --max_steps 40` reads every field of
the YAML file as a default, then parses the command line as usual, so the command line wins. Precedence, lowest
first: the dataclass defaults, `defaults=` given by the script, the YAML file, the command line. This is TRL's
`TrlParser` convention, implemented on a plain `HfArgumentParser`.

Example:
```python
from transformers import HfArgumentParser
from adloco_hf import AdLoCoConfig
from adloco_hf.cli import parse_args_with_yaml

parser = HfArgumentParser((ScriptArguments, AdLoCoConfig))
script_args, training_args = parse_args_with_yaml(parser)  # python train.py --config run.yaml --seed 1
```
"""

import argparse
import dataclasses
import difflib
import logging
import os
import sys
from typing import TYPE_CHECKING, Any

from .common.upstream import move_option, optional_actions, parser_actions


if TYPE_CHECKING:
    from transformers import HfArgumentParser, TrainingArguments

# transformers, datasets, yaml and the config are imported where they are used: `adloco-hf --help` (`main`) imports
# none of them (torch, transformers' Trainer and peft take seconds to import; `commands.py` says which command needs
# what).


__all__ = [
    "CONFIG_FLAG",
    "group_options",
    "load_yaml_defaults",
    "main",
    "parse_args_with_yaml",
    "recipe_parser",
    "setup_logging",
]

CONFIG_FLAG = "--config"


def _argument_actions(parser: argparse.ArgumentParser) -> dict[str, list[argparse.Action]]:
    """Every destination of the parser with its actions (a bool field has `--x` and `--no_x`, one destination)."""
    actions: dict[str, list[argparse.Action]] = {}
    for action in parser_actions(parser):
        if action.dest not in (argparse.SUPPRESS, "help", CONFIG_FLAG.lstrip("-")):
            actions.setdefault(action.dest, []).append(action)
    return actions


def _convert(path: str, key: str, value: Any, action: argparse.Action) -> Any:
    """Apply the argument's `type` to YAML strings (YAML 1.1 reads `2e-5` as a string) and check `choices`."""
    convert = action.type if callable(action.type) else None

    def one(item: Any) -> Any:
        if convert is not None and isinstance(item, str):
            try:
                item = convert(item)
            except (TypeError, ValueError, argparse.ArgumentTypeError) as error:
                raise ValueError(f"{path}: {key}: {item!r} is not a valid value ({error})") from None
        if action.choices is not None and item is not None and item not in action.choices:
            raise ValueError(f"{path}: {key}: {item!r} is not one of {list(action.choices)}")
        return item

    return [one(item) for item in value] if isinstance(value, list) else one(value)


def load_yaml_defaults(parser: argparse.ArgumentParser, path: str | os.PathLike) -> dict[str, Any]:
    """Read a YAML mapping of argument names to values and check every key against the parser.

    Args:
        parser: the parser whose arguments the file sets (keys are destinations: `learning_rate`, `max_steps`, ...).
        path: the YAML file.

    Returns:
        The values, converted with each argument's `type`, ready for `parser.set_defaults(**values)`.

    Raises:
        ValueError: the file is not a mapping, names an argument the parser does not have (with the closest
            names), or holds a value the argument rejects.
    """
    import yaml

    path = os.fspath(path)
    with open(path, encoding="utf-8") as f:
        config = yaml.safe_load(f)
    if config is None:
        return {}
    if not isinstance(config, dict):
        raise ValueError(f"{path} must hold a mapping of argument names to values, not a {type(config).__name__}")
    actions = _argument_actions(parser)
    unknown = sorted(str(key) for key in config if key not in actions)
    if unknown:
        hints = []
        for key in unknown:
            close = difflib.get_close_matches(key, list(actions), n=3)
            hints.append(f"{key!r}" + (f" (did you mean {', '.join(repr(c) for c in close)}?)" if close else ""))
        raise ValueError(
            f"{path}: unknown key(s) {', '.join(hints)}. Keys are the script's argument names without the leading "
            f"'--' (see --help)."
        )
    return {key: _convert(path, key, value, actions[key][0]) for key, value in config.items()}


def parse_args_with_yaml(
    parser: "HfArgumentParser", args: list[str] | None = None, *, defaults: dict[str, Any] | None = None
) -> tuple[Any, ...]:
    """Parse the command line into the parser's dataclasses, with defaults from `--config file.yaml`.

    Adds `--config` to `parser` (once), sets the YAML values as defaults (`parser.set_defaults`; arguments the
    file sets are no longer required), then runs `parse_args_into_dataclasses`. The defaults stay on the parser.

    Args:
        parser: an `HfArgumentParser` over the script's dataclasses.
        args: the command line without the program name; `None` reads `sys.argv[1:]`.
        defaults: values the script chooses before the YAML file and the command line (e.g. `use_cpu=True` on a
            machine without a GPU).

    Returns:
        One instance per dataclass of the parser, in order.

    Raises:
        ValueError: from [`load_yaml_defaults`], or for command-line arguments the parser does not know.
    """
    if not any(CONFIG_FLAG in action.option_strings for action in parser_actions(parser)):
        parser.add_argument(
            CONFIG_FLAG,
            default=None,
            metavar="FILE.yaml",
            help="YAML file of argument values (keys are argument names); the command line overrides them.",
        )
    config_parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    config_parser.add_argument(CONFIG_FLAG, default=None)
    config_path = config_parser.parse_known_args(args)[0].config

    values = dict(defaults or {})
    if config_path is not None:
        values.update(load_yaml_defaults(parser, config_path))
    if values:
        actions = _argument_actions(parser)
        unknown = sorted(set(values) - set(actions))
        if unknown:
            raise ValueError(f"defaults name unknown argument(s) {unknown}")
        for key in values:
            for action in actions[key]:
                action.required = False
        parser.set_defaults(**values)
    outputs = parser.parse_args_into_dataclasses(args=args)
    # The leftover namespace holds only `config`: the caller wants the dataclasses.
    return tuple(output for output in outputs if not isinstance(output, argparse.Namespace))


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """The defaults after each option's help (as `HfArgumentParser`'s), the description as written (its examples)."""


# AdLoCo's four groups of fields, under these titles (their docstrings describe them).
_GROUP_TITLES = {
    "RoundFields": "AdLoCo: rounds",
    "InstanceFields": "AdLoCo: instances and merges",
    "BatchFields": "AdLoCo: batch size",
    "WorkerFields": "AdLoCo: workers and failures",
}


def _dest_actions(parser: argparse.ArgumentParser) -> dict[str, list[argparse.Action]]:
    actions: dict[str, list[argparse.Action]] = {}
    for action in optional_actions(parser):
        actions.setdefault(action.dest, []).append(action)
    return actions


def group_options(parser: argparse.ArgumentParser, groups: list[tuple[str, str | None, list[str]]]) -> None:
    """Move options out of the parser's one list into titled groups, printed by `--help` in the order given (after
    `-h` and `--config`, which stay first). Parsing is unchanged: only the help's sections move.

    Args:
        groups: (title, description, destinations) per group; a bool field's `--x` and `--no_x` move together.
    """
    actions = _dest_actions(parser)
    for title, description, dests in groups:
        group = parser.add_argument_group(title, description)
        for dest in dests:
            for action in actions.pop(dest, []):
                move_option(parser, action, group)


def _fields(dataclass: type) -> list[str]:
    return [field.name for field in dataclasses.fields(dataclass) if field.init]


def recipe_parser(script_arguments: type, description: str, prog: str | None = None) -> "HfArgumentParser":
    """The parser of a Trainer recipe: `HfArgumentParser((script_arguments, AdLoCoConfig))` whose `--help` starts with
    a short usage and `description`, then AdLoCo's options in their four groups, the recipe's own (`script_arguments`,
    described by its docstring), and last the `TrainingArguments` options (a few hundred lines)."""
    from transformers import HfArgumentParser

    from .config.arguments import AdLoCoConfig
    from .config.fields import GROUPS

    parser = HfArgumentParser(
        (script_arguments, AdLoCoConfig),
        prog=prog,
        usage="%(prog)s [-h] [--config FILE.yaml] [--OPTION VALUE ...]",
        description=description,
        formatter_class=_HelpFormatter,
    )
    adloco = {name for group in GROUPS for name in _fields(group)}
    trainer = [name for name in _fields(AdLoCoConfig) if name not in adloco]
    script_doc = (script_arguments.__doc__ or "").strip().splitlines()
    group_options(
        parser,
        [(_GROUP_TITLES[group.__name__], group.__doc__.strip(), _fields(group)) for group in GROUPS]
        + [
            (
                f"this recipe ({script_arguments.__name__})",
                script_doc[0] if script_doc else None,
                _fields(script_arguments),
            )
        ]
        + [("transformers TrainingArguments", "Every field of the Trainer's TrainingArguments.", trainer)],
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    """`adloco-hf` (and `python -m adloco_hf.cli`): summarise, plot, verify, export or push a run (`commands.py`)."""
    from .commands import main as run_command

    return run_command(argv)


def setup_logging(training_args: "TrainingArguments") -> None:
    """INFO on global rank 0 (the library's per-round lines), WARNING on the other workers, each line tagged with
    its rank; transformers and datasets follow `log_level` / `log_level_replica`."""
    import datasets
    import transformers

    is_main = training_args.process_index == 0
    logging.basicConfig(
        format=f"%(asctime)s [rank {training_args.process_index}] %(levelname)s %(name)s: %(message)s",
        datefmt="%H:%M:%S",
        level=logging.INFO if is_main else logging.WARNING,
        stream=sys.stdout,
        force=True,
    )
    log_level = training_args.get_process_log_level()
    transformers.utils.logging.set_verbosity(log_level)
    # One way out for every line: transformers' (and so the library's) records reach the handler above, tagged with
    # the rank, and transformers' own stderr handler is off. Otherwise a line printed twice wherever transformers'
    # logger propagates (transformers turns propagation on when the CI environment variable is set).
    transformers.utils.logging.disable_default_handler()
    transformers.utils.logging.enable_propagation()
    # The library's logger hangs under transformers' (common/logs.py), whose level `log_level` sets; a recipe shows the
    # per-round lines on rank 0 whatever `log_level` is.
    logging.getLogger("adloco_hf").setLevel(min(logging.INFO if is_main else logging.WARNING, log_level))
    datasets.utils.logging.set_verbosity(log_level)
    if not is_main:
        datasets.disable_progress_bars()


if __name__ == "__main__":
    sys.exit(main())
