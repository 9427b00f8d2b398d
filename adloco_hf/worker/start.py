"""The worker's set-up, once, when training begins (`Worker.start`).

Every rank runs the same steps in the same order (process groups are created collectively): connect the workers,
check the model and inner optimizer, then either start afresh (instance table, initial weights, the largest
micro-batch) or restore a checkpoint's state (`resume.py`), and finally the first round's batch plan.
"""

import time
from collections.abc import Callable
from typing import Any

import torch

from ..batch.grad_stats import GradientStatisticsCollector, check_adam_moments
from ..batch.lr_scaling import ADAM_RULES, adam_hyperparameters, check_adam_optimizer, check_scheduler
from ..checkpoint.folders import remove_stale_staging
from ..common.distributed import WorkerMonitor, check_models_match, destroy_process_groups_at_exit
from ..common.logs import get_logger
from ..instances.table import Instance, initial_instances
from ..outer.step import GlobalModel
from .initialise import resolve_max_batch_size
from .preemption import Preemption


__all__ = ["WorkerStart"]

logger = get_logger(__name__)

INNER_PRODUCT_TESTS = ("inner_product", "augmented_inner_product")


class WorkerStart:
    """`Worker.start` and its steps (a part of [`Worker`], which holds the state they set)."""

    def start(
        self,
        *,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        lr_scheduler,
        sampler,
        scaler,
        max_steps: int,
        global_step: int,
        probe_step: Callable[[int], None],
    ) -> None:
        """Set up (or restore) this worker's AdLoCo state when training begins (collective: every rank)."""
        self._model, self._optimizer, self._scheduler = model, optimizer, lr_scheduler
        self._sampler, self._scaler, self.max_steps = sampler, scaler, max_steps
        self._connect()
        settings = self.settings
        check_models_match(model, settings.device)
        self.collector = GradientStatisticsCollector(
            model.parameters(), inner_products=settings.steps.batch_size_test in INNER_PRODUCT_TESTS
        )
        self.collector.sum_group = self.replica.statistics_group
        self._check_inner_optimizer()
        resume = self._pending
        if resume is None:
            self.instances = initial_instances(
                self.num_workers,
                settings.num_instances,
                self.processes_per_worker * settings.initial_batch_size,
            )
            self.process_groups.refresh(self.instances)
            self.replica.initialise_weights(model, self.instance)
        else:
            self.instances = [Instance.from_row(row) for row in resume["instances"]]
            self.process_groups.refresh(self.instances)
        self.global_model = GlobalModel.from_settings(
            self._part(), settings.outer, device=settings.device, positions=self.replica.positions(model)
        )
        self.replica.attach(self.global_model)
        if resume is None:
            self.replica.check_settings()
            self.max_batch_size = resolve_max_batch_size(settings, self._trainable(), probe_step)
            self._train_start = time.time()
        else:
            self._restore(resume)
        self._update_rules()  # the largest micro-batch and the sampler's shard are known from here on
        self._apply_plan()
        if self.rank == 0:
            self._log_start(resume, global_step)

    def _connect(self) -> None:
        """The workers' monitor (a lost worker ends the run with a resume hint) and the preemption handlers."""
        destroy_process_groups_at_exit()
        self.monitor = WorkerMonitor(self.settings.worker_timeout)
        self.monitor.check("start of training")
        self.preemption = Preemption(self.settings.preemption_grace_seconds, self.monitor.someone_ahead)
        self.preemption.install()
        if self.rank == 0:
            remove_stale_staging(self.settings.output_dir)

    def _check_inner_optimizer(self) -> None:
        """Refuse an optimizer or scheduler the settings cannot scale or read, and keep the rates and Adam
        hyperparameters before any batch scaling (every round scales from these)."""
        steps = self.settings.steps
        if steps.lr_batch_scaling != "none":
            check_scheduler(self._scheduler)
        if steps.noise_preconditioner == "adam":
            check_adam_moments(self._optimizer)
        if steps.lr_batch_scaling in ADAM_RULES:
            check_adam_optimizer(self._optimizer)
            self._base_adam = adam_hyperparameters(self._optimizer)
        self._base_lrs = list(getattr(self._scheduler, "base_lrs", []))

    def _log_start(self, resume: dict[str, Any] | None, global_step: int) -> None:
        """Rank 0: the run log's start (or resume) line and the run's shape on the console."""
        self.run_log.start(
            resumed_outer_step=None if resume is None else self.outer_step,
            resumed_global_step=None if resume is None else global_step,
        )
        if resume is not None and resume.get("elastic") is not None:
            self._log_elastic(resume["elastic"], global_step)
        workers = f"{self.num_workers} worker{'s' * (self.num_workers != 1)}" + (
            f" of {self.processes_per_worker} processes" if self.processes_per_worker > 1 else ""
        )
        # The Trainer's banner keeps its true lines (steps, parameters); this one says the rest (trainer/round_console.py).
        settings = self.settings
        fixed = self.rules.inner_steps_rule == "fixed"
        rounds = f"{-(-self.max_steps // self.inner_steps)} rounds" if fixed else "rounds"
        cap = f", at most {settings.batch_size_cap}" if settings.batch_size_cap else ""
        instances = f"{len(self.instances)} instance{'s' * (len(self.instances) != 1)}"
        logger.info(
            f"AdLoCo: {workers}, {instances}, max_steps {self.max_steps} in {rounds} of "
            f"{self.inner_steps} inner steps, batch {settings.initial_batch_size} per worker at the start"
            f"{cap} (batch-size test {settings.steps.batch_size_test}), micro-batches of at most {self.max_batch_size}"
        )
