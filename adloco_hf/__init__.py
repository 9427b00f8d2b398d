"""adloco_hf: AdLoCo (adaptive-batch, multi-instance DiLoCo; arXiv 2508.18182) for the Hugging Face Trainer."""

from .common.versions import check_installed_versions


# First: an unsupported transformers or accelerate is named before importing them could fail some other way.
check_installed_versions()

from . import _aliases
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

__all__ = [
    "AdLoCoCallback",
    "AdLoCoConfig",
    "AdLoCoState",
    "AdLoCoTrainer",
    "AdaptiveBatchSampler",
    "HubUploadError",
    "BatchPlan",
    "SkippedRoundsError",
    "TrainingPreempted",
    "Worker",
    "augmented_inner_product_test",
    "estimate_variance",
    "inner_product_test",
    "norm_test",
    "plan_batch",
]
