"""What a config asks of the machine it runs on, checked when it is built (after `TrainingArguments` normalised its
options), before any data is read: the folders it names (`paths.py`), the reporting integrations it names (are they
installed?), the device its precision needs, and the options that work badly with AdLoCo (`compat.py`).

- `report_to="wandb"` without wandb installed was raised when the trainer was built, after the data: refused here,
  naming the package to install and the integrations that are installed.
- `fp16=True` on a CPU was accepted and did nothing (the Trainer trains in float32 there; the losses equal
  float32's): warned once, naming the fix.
- `dataloader_pin_memory=True` (the default) on a machine without an accelerator made every loader warn that there
  is nothing to pin into: set to False there, where pinning does nothing.
"""

import difflib

import torch

from .compat import has_distributed_accelerator, warn_about_what_works_badly, warn_once
from .paths import check_paths


__all__ = ["check_environment", "check_report_to", "on_cpu", "warn_about_precision_on_cpu"]

# The package `pip install` needs for an integration, where it is not the integration's own name.
_PACKAGES = {"azure_ml": "azureml-core", "comet_ml": "comet_ml", "flyte": "flytekit flytekitplugins-deck-standard"}
# Integrations `get_available_reporting_integrations` does not list even when installed: not checked.
_NOT_LISTED = ("flyte",)


def on_cpu(config) -> bool:
    """Whether the Trainer will train on the CPU: `use_cpu`, or no accelerator at all."""
    mps = getattr(torch.backends, "mps", None)
    return bool(config.use_cpu) or not (has_distributed_accelerator() or (mps is not None and mps.is_available()))


def check_report_to(report_to) -> None:
    """Refuse a reporting integration that transformers does not know, or whose package is not installed."""
    from transformers.integrations import get_available_reporting_integrations
    from transformers.integrations.integration_utils import INTEGRATION_TO_CALLBACK

    names = [report_to] if isinstance(report_to, str) else list(report_to or [])
    names = [name for name in names if name not in ("none", "all")]
    report_to = names[0] if len(names) == 1 else report_to  # as the user most likely wrote it
    known = list(INTEGRATION_TO_CALLBACK)
    installed = None
    for name in names:
        if name not in INTEGRATION_TO_CALLBACK:
            close = difflib.get_close_matches(str(name), known, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ValueError(
                f"report_to={report_to!r}: {name!r} is not a reporting integration of transformers{hint}; choose from "
                f"{known}, or report_to='none'."
            )
        if name in _NOT_LISTED:
            continue
        installed = get_available_reporting_integrations() if installed is None else installed
        if name not in installed:
            others = f"the installed ones are {installed}" if installed else "none is installed"
            raise ValueError(
                f"report_to={report_to!r}: {name} is not installed ({others}). Install it (pip install "
                f"{_PACKAGES.get(name, name)}) or set report_to='none'."
            )


def warn_about_precision_on_cpu(config) -> None:
    """`fp16=True` on a CPU trains in float32: one warning. Nothing to pin memory into: pinning off."""
    if not on_cpu(config):
        return
    if config.fp16:
        warn_once(
            "fp16=True does nothing on a CPU: the Trainer trains in float32 there (the losses equal float32's). Set "
            "fp16=False, or bf16=True for bfloat16 autocast on the CPU; on a GPU fp16=True is mixed precision (the "
            "README's fp16=torch.cuda.is_available())."
        )
    config.dataloader_pin_memory = False


def check_environment(config) -> None:
    """The folders, the reporting integrations and the device of `config`, and what works badly (module docstring)."""
    check_paths(config)
    check_report_to(config.report_to)
    warn_about_precision_on_cpu(config)
    warn_about_what_works_badly(config)
