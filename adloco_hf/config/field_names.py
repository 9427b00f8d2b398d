"""A field `AdLoCoConfig` does not have (`inner_step=20`) is refused naming the closest ones, where Python's own error
is a bare `TypeError: __init__() got an unexpected keyword argument 'inner_step'`."""

import difflib
import functools
from collections.abc import Callable
from dataclasses import fields


__all__ = ["refuse_unknown_fields", "unknown_fields_message"]


def unknown_fields_message(name: str, unknown: dict, known: set[str]) -> str:
    """`name` has no field `x=1` (did you mean `y`?) for every unknown keyword."""
    hints = []
    for field, value in unknown.items():
        close = difflib.get_close_matches(field, sorted(known), n=3)
        hints.append(f"{field}={value!r}" + (f" (did you mean {' or '.join(close)}?)" if close else ""))
    return (
        f"{name} has no field {', '.join(hints)}. Its fields are TrainingArguments' and AdLoCo's "
        "(docs/configuration.md lists AdLoCo's)."
    )


def refuse_unknown_fields(init: Callable, config_class: type) -> Callable:
    """`config_class.__init__` (the dataclass's) refusing an unknown keyword with [`unknown_fields_message`], still a
    `TypeError`. A dataclass that subclasses `config_class` gets an `__init__` of its own, unchecked."""
    known = {setting.name for setting in fields(config_class) if setting.init}

    @functools.wraps(init)
    def checked_init(self, *args, **kwargs):
        unknown = {name: value for name, value in kwargs.items() if name not in known}
        if unknown:
            raise TypeError(unknown_fields_message(config_class.__name__, unknown, known))
        init(self, *args, **kwargs)

    return checked_init
