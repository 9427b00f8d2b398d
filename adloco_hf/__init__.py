"""adloco_hf: AdLoCo (adaptive-batch, multi-instance DiLoCo; arXiv 2508.18182) for the Hugging Face Trainer.

The public names load on first use (`common/lazy.py`): `import adloco_hf` alone, and so `adloco-hf --help`, does not
import torch, transformers' Trainer and peft (which `transformers.trainer_utils` imports when it is installed): about
8 s on 2 busy cores. `from adloco_hf import AdLoCoTrainer` imports them as before.
"""

from typing import TYPE_CHECKING

from .common.versions import check_installed_versions


# First: an unsupported transformers or accelerate is named before importing them could fail some other way.
check_installed_versions()

from . import _aliases
from .common.lazy import lazy_exports


if TYPE_CHECKING:  # what type checkers and IDEs read
    from .batch.size_tests import augmented_inner_product_test, estimate_variance, inner_product_test, norm_test
    from .batch.switch_mode import BatchPlan, plan_batch
    from .config.arguments import AdLoCoConfig
    from .instances.health import SkippedRoundsError
    from .reporting.hub import HubUploadError
    from .rounds.state import AdLoCoState
    from .sampling.sampler import AdaptiveBatchSampler
    from .trainer.callback import AdLoCoCallback
    from .trainer.trainer import AdLoCoTrainer
    from .worker.core import Worker
    from .worker.preemption import TrainingPreempted


_aliases.install()

__version__ = "0.1.0"

# Each public name and the module that defines it.
_EXPORTS = {
    "AdLoCoCallback": ".trainer.callback",
    "AdLoCoConfig": ".config.arguments",
    "AdLoCoState": ".rounds.state",
    "AdLoCoTrainer": ".trainer.trainer",
    "AdaptiveBatchSampler": ".sampling.sampler",
    "BatchPlan": ".batch.switch_mode",
    "HubUploadError": ".reporting.hub",
    "SkippedRoundsError": ".instances.health",
    "TrainingPreempted": ".worker.preemption",
    "Worker": ".worker.core",
    "augmented_inner_product_test": ".batch.size_tests",
    "estimate_variance": ".batch.size_tests",
    "inner_product_test": ".batch.size_tests",
    "norm_test": ".batch.size_tests",
    "plan_batch": ".batch.switch_mode",
}
__getattr__ = lazy_exports(__name__, _EXPORTS)

__all__ = [
    "AdLoCoCallback",
    "AdLoCoConfig",
    "AdLoCoState",
    "AdLoCoTrainer",
    "AdaptiveBatchSampler",
    "BatchPlan",
    "HubUploadError",
    "SkippedRoundsError",
    "TrainingPreempted",
    "Worker",
    "augmented_inner_product_test",
    "estimate_variance",
    "inner_product_test",
    "norm_test",
    "plan_batch",
]
