"""The releases of transformers and accelerate that adloco_hf supports, and the Trainer internals that differ in them.

One place, read by everything that needs the releases: `setup.py` (`install_requires`), `import adloco_hf` (the check
below), the Makefile (`make install` installs the reference releases, `make test-versions` the lowest and the highest
in CI) and the built-in corpus `builtin:python-source` (the reference releases' source). It imports only the standard
library at module level, so `setup.py` and the Makefile read it as a file, without the package:
`python adloco_hf/common/versions.py lowest` prints `transformers==5.10.1 accelerate==1.14.0`.

| releases | transformers | accelerate | what they are |
|---|---|---|---|
| `LOWEST` | 5.10.1 | 1.14.0 | the oldest that work (`make test-versions` runs the core tests); older ones are refused at import |
| `REFERENCE` | 5.23.0 | 1.15.0 | what `make install` installs: the whole suite, the benchmarks, the demo's corpus |
| `HIGHEST` | 5.24.0 | 1.15.0 | the newest tested; newer ones of the same major install, and warn once at import |

**Why these lowest.** Both are the first releases without a silent error, found by running the core tests on older
ones (`make test-versions LOWEST="transformers==X accelerate==Y"`):

- accelerate < 1.14: `prepare_model` wraps a model it has already prepared. AdLoCo prepares the model without DDP
  (`AdLoCoTrainer._wrap_model`); the Trainer's later `accelerator.prepare(model, optimizer)` then wrapped it in DDP
  over every process, so each inner step all-reduced its gradients and AdLoCo silently became DDP (measured with
  1.3.0 and 1.13.0: the replicas were identical inside a round). 1.14 returns an already prepared model unchanged.
- transformers < 5.10: `Trainer._get_num_items_in_batch` counts a causal LM's loss tokens over the unshifted labels,
  one token per sequence too many, so switch mode's accumulated micro-batches no longer give the whole batch's
  gradient, nor the evaluation its exact loss (measured with 5.5.4 to 5.9.0: six tests of `tests/trainer/` fail).
  Below 5.5 the Trainer's private methods that AdLoCo overrides (`_run_epoch`, `_init_training_state`) do not exist.

**No upper bound below the next major.** `install_requires` allows every release from `LOWEST` up to the next major
(`transformers<6`, `accelerate<2`), not only the tested ones. A cap at the next untested minor is what kept
`transformers==5.23.0` from installing beside 5.24, and every release would bring that back until ours catches up
(TRL also gives transformers a lower bound only). The cost: AdLoCo overrides some of the Trainer's private methods
(`trainer/trainer.py` names each with the release it follows), which a minor release may change; so an untested
release warns once at import, naming the tested range, and `make test-versions HIGHEST="transformers==X
accelerate==Y"` tests it. A new major changes too much to be allowed untested.

**What differs inside the range** (each shim names the release that changed):

| internal | releases | shim |
|---|---|---|
| `Trainer.end()` (finish the trackers, destroy the process group) | added in transformers 5.18 | [`end_training`] |
| `huggingface_hub`'s HTTP library (the errors of a failed upload) | httpx2 from huggingface_hub 2.0, which transformers allows from 5.18; httpx before | none: `reporting/hub.py` retries any error and reads `error.response.status_code`, which both have |
"""

import importlib.metadata
import os
import re
import sys
import warnings


__all__ = [
    "HIGHEST",
    "LOWEST",
    "REFERENCE",
    "check_installed_versions",
    "end_training",
    "requirements",
    "supported_range",
]

# The oldest and newest releases `make test-versions` runs the core tests against (CI), and the reference install.
LOWEST = {"transformers": "5.10.1", "accelerate": "1.14.0"}
HIGHEST = {"transformers": "5.24.0", "accelerate": "1.15.0"}
# `make install`; the built-in corpus `builtin:python-source` is the source of exactly these (with torch 2.13.0).
REFERENCE = {"transformers": "5.23.0", "accelerate": "1.15.0"}

_warned: set[str] = set()


def _release(version: str) -> tuple[int, ...]:
    """`"5.24.0"` -> (5, 24, 0); a pre-release or local label (`5.25.0.dev0`, `2.13.0+cpu`) keeps its numbers."""
    numbers = re.match(r"\d+(?:\.\d+)*", version)
    if numbers is None:
        raise ValueError(f"cannot read the release numbers of version {version!r}")
    return tuple(int(part) for part in numbers.group().split("."))


def _next_major(version: str) -> str:
    return f"{_release(version)[0] + 1}"


def supported_range(package: str) -> str:
    """The requirement specifier of `package`: `">=5.17.0,<6"` (every release from the lowest tested to the next
    major)."""
    return f">={LOWEST[package]},<{_next_major(LOWEST[package])}"


def requirements() -> list[str]:
    """`install_requires` entries for the packages this module tracks: `["transformers>=5.17.0,<6", ...]`."""
    return [f"{package}{supported_range(package)}" for package in LOWEST]


def _installed(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def check_installed_versions() -> None:
    """Refuse releases outside the supported range, warn (once, on the first process) about newer untested ones.

    Reads only the installed distributions' metadata (no import of transformers or accelerate), so it runs first in
    `import adloco_hf`, before an unsupported release could fail with an unrelated error.

    Raises:
        ImportError: transformers or accelerate is missing, older than `LOWEST` or at the next major; the message
            names the supported range and the pip command that installs it.
    """
    for package, lowest in LOWEST.items():
        installed = _installed(package)
        pip = f"pip install '{package}{supported_range(package)}'"
        if installed is None:
            raise ImportError(f"adloco_hf needs {package}{supported_range(package)}, which is not installed: {pip}")
        tested = f"tested with {package} {lowest} to {HIGHEST[package]}"
        if _release(installed) < _release(lowest) or _release(installed)[0] >= _release(lowest)[0] + 1:
            raise ImportError(
                f"adloco_hf supports {package}{supported_range(package)} ({tested}), but {package} {installed} is "
                f"installed: {pip}"
            )
        if _release(installed) > _release(HIGHEST[package]) and package not in _warned:
            _warned.add(package)
            if os.environ.get("RANK", "0") == "0":
                warnings.warn(
                    f"{package} {installed} is newer than the releases adloco_hf was tested with ({tested}). It should "
                    f"work; if the Trainer integration fails, install {package}=={HIGHEST[package]} and report the "
                    "error.",
                    UserWarning,
                    stacklevel=2,
                )


def end_training(trainer, parent) -> None:
    """The Trainer's `end()` (finish the trackers, destroy the process group) from an override of it.

    Args:
        trainer: the trainer.
        parent: `super()` inside the override, so classes between it and `Trainer` still take part.

    transformers < 5.18 has no `Trainer.end`: it calls `trainer.accelerator.end_training()`, what `Trainer.end` does.
    """
    if hasattr(parent, "end"):
        parent.end()
    else:
        trainer.accelerator.end_training()


if __name__ == "__main__":
    # For the Makefile: `python adloco_hf/common/versions.py lowest|highest|reference` prints pip requirements.
    chosen = {"lowest": LOWEST, "highest": HIGHEST, "reference": REFERENCE}
    if len(sys.argv) != 2 or sys.argv[1] not in chosen:
        sys.exit(f"usage: python {sys.argv[0]} {{{'|'.join(chosen)}}}")
    print(" ".join(f"{package}=={version}" for package, version in chosen[sys.argv[1]].items()))
