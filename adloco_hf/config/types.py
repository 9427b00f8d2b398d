"""The type of every number and choice of `AdLoCoConfig`, checked first: before any other check compares it.

A string where a number is expected (`outer_lr="0.7"`, `num_instances="2"`: a value quoted in a JSON file or read
from an environment variable) made the checks fail with a bare `TypeError: '>' not supported between ...`, and
`inner_steps="10"` was told to "set an integer >= 1" without being told it was a string. [`check_types`] names the
field, the value, its type and what to write instead. The command line and the recipes' YAML files convert their
values already (`HfArgumentParser`, `cli.py`); a config built in Python is where these mistakes happen.

It checks every field whose annotation is `int`, `float` or `bool` (or one of them or None): AdLoCo's own and
`TrainingArguments`' (AdLoCo's checks read `max_steps`, the batch sizes and the step counts before
`TrainingArguments.__post_init__` does), and every AdLoCo field with a list of choices (`config/choices.py`).
"""

import difflib
import functools
import numbers
import types
import typing
from dataclasses import Field, fields
from typing import Any

from .fields import GROUPS


__all__ = ["FieldTypeError", "check_types"]

_NAMES = {int: "an integer", float: "a number", bool: "True or False"}


class FieldTypeError(TypeError, ValueError):
    """A config field holds a value of the wrong type: a `TypeError`, and a `ValueError` like the config's other
    refusals (a non-integral `num_fragments` was refused as a `ValueError` before this check: code catching it still
    does)."""


def _number_kind(annotation: Any) -> tuple[type, bool] | None:
    """(int, float or bool; whether None is allowed) of a number field's annotation, None for any other field."""
    optional = False
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union:
        others = [arg for arg in typing.get_args(annotation) if arg is not type(None)]
        if len(others) != 1 or len(others) == len(typing.get_args(annotation)):
            return None
        annotation, optional = others[0], True
    return (annotation, optional) if annotation in _NAMES else None


def _fits(value: Any, kind: type) -> bool:
    if kind is bool:
        return isinstance(value, bool)
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        return False
    return kind is float or isinstance(value, numbers.Integral)


def _parsed(value: str, kind: type) -> Any:
    """What the user most likely meant by a string, or None when it reads as nothing of `kind`."""
    text = value.strip()
    if kind is bool:
        return {"true": True, "false": False}.get(text.lower())
    try:
        number = float(text)
    except ValueError:
        return None
    if kind is int:
        return int(number) if number.is_integer() else None
    return int(number) if number.is_integer() and "." not in text and "e" not in text.lower() else number


def _refuse(setting: Field, value: Any, kind: type, optional: bool) -> FieldTypeError:
    name, wanted = setting.name, _NAMES[kind] + (", or None" if optional else "")
    got = f"{name}={value!r} is a {type(value).__name__}, not {_NAMES[kind]}"
    meant = _parsed(value, kind) if isinstance(value, str) else None
    if meant is not None:
        return FieldTypeError(f"{got}: write {name}={meant!r} (without quotes).")
    if kind is int and isinstance(value, float) and not isinstance(value, bool):
        return FieldTypeError(f"{got}: set {wanted} (e.g. {name}={round(value)}).")
    return FieldTypeError(f"{got}: set {wanted} (its default is {setting.default!r}).")


def _check_choice(setting: Field, value: Any, allowed: list[str]) -> None:
    name = setting.name
    if not isinstance(value, str):
        raise FieldTypeError(f"{name}={value!r} is a {type(value).__name__}, not a string: choose one of {allowed}.")
    if value not in allowed:
        close = difflib.get_close_matches(value, allowed, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ValueError(f"{name}={value!r} is not supported; choose one of {allowed}{hint}.")


def check_types(config: Any) -> None:
    """Refuse a value of the wrong type in a number or choice field of `config` (an `AdLoCoConfig`), naming the field,
    the value, its type and the fix. An integer field takes a whole float as its integer (`1e3`); `max_batch_size`
    takes an integer, a string of digits (made an integer) or `"auto"`.

    Raises:
        FieldTypeError: a value of the wrong type. `ValueError`: a string that is none of a field's choices.
    """
    own = {setting.name for group in GROUPS for setting in fields(group)}
    annotations = _annotations(type(config))
    for setting in fields(config):
        value = getattr(config, setting.name)
        allowed = setting.metadata.get("choices") if setting.name in own else None  # TrainingArguments checks its own
        if allowed is not None:
            _check_choice(setting, value, list(allowed))
            continue
        if setting.name == "max_batch_size":
            _check_max_batch_size(config, value)
            continue
        kind = _number_kind(annotations.get(setting.name))
        if kind is None:
            continue
        number, optional = kind
        if (value is None and optional) or _fits(value, number):
            continue
        if number is int and isinstance(value, float) and value.is_integer():
            setattr(config, setting.name, int(value))
            continue
        raise _refuse(setting, value, number, optional)


@functools.cache
def _annotations(cls: type) -> dict[str, Any]:
    """The fields' annotations as written: `HfArgumentParser` rewrites a dataclass field's `type` in place (`int | None`
    becomes `int`, `str | bool` becomes `bool`) once a parser was built over the class."""
    return typing.get_type_hints(cls)


def _check_max_batch_size(config: Any, value: Any) -> None:
    if isinstance(value, str) and value.strip().isdigit():
        config.max_batch_size = int(value)
    elif isinstance(value, float) and value.is_integer():
        config.max_batch_size = int(value)
    elif not (isinstance(value, str) or _fits(value, int)):
        raise FieldTypeError(
            f"max_batch_size={value!r} is a {type(value).__name__}: set a positive integer or 'auto' (the default)."
        )
