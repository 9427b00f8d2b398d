"""adloco_hf: AdLoCo (adaptive-batch, multi-instance DiLoCo; arXiv 2508.18182) for the Hugging Face Trainer."""

from .batch_size import (
    augmented_inner_product_test,
    estimate_variance,
    inner_product_test,
    norm_test,
)
from .callback import AdLoCoCallback
from .config import AdLoCoConfig
from .health import SkippedRoundsError
from .hub import HubUploadError
from .preemption import TrainingPreempted
from .rounds import AdLoCoState
from .sampler import AdaptiveBatchSampler
from .switch_mode import BatchPlan, plan_batch
from .trainer import AdLoCoTrainer
from .worker import Worker


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
