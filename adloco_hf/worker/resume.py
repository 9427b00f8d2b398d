"""A worker's resume state: what `state_dict` writes into `adloco/rank-R.pt`, and how `start` restores it.

The Trainer loads a checkpoint before the model, optimizer and sampler are set up, so `load_state_dict` only keeps
the state; `start` applies it (`_restore`) once they exist. A checkpoint written by another number of workers
arrives re-split for this rank (`checkpoint/elastic.py`); the worker then settles its instance's φ and draws random
generators of its own.
"""

import time
from dataclasses import asdict
from typing import Any

from transformers import set_seed

from ..common.logs import get_logger
from ..common.rng import get_rng_state
from ..rounds.state import RunTotals
from ..rounds.tally import RoundTally
from ..sampling.stream_sampler import check_sampler_kind


__all__ = ["WorkerResume"]

logger = get_logger(__name__)


class WorkerResume:
    """The checkpoint calls of [`Worker`] (a part of it, which holds the state they save and restore)."""

    def state_dict(self) -> dict[str, Any]:
        """This worker's resume state: instance table, φ and momentum, inner optimizer, sampler, scaler, totals."""
        elapsed = self._elapsed()
        return {
            "world_size": self.world_size,
            "rank": self.rank,
            "processes_per_worker": self.processes_per_worker,
            "outer_step": self.outer_step,
            "last_synced_step": self.last_synced_step,
            "inner_steps": self.inner_steps,
            "instances": [i.to_row() for i in self.instances],
            "max_batch_size": self.max_batch_size,
            "base_lrs": self._base_lrs,
            "base_adam": self._base_adam,
            "global_model": self.global_model.state_dict(),
            "inner_optimizer": self.replica.optimizer_state(self._optimizer),
            "sampler": self._sampler.state_dict(),
            "scaler": None if self._scaler is None else self._scaler.state_dict(),
            "totals": {**asdict(self.totals), "elapsed": elapsed},
            "rng": get_rng_state(),
            "round": self._tally.state_dict(self._part(), self.collector),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Keep a checkpoint's state until `start` (models and optimizers are set up in between). The trainer has
        checked that the checkpoint has one state per worker (`checkpoint.check_rank_states`); one written by another
        number of workers comes re-split for this rank (`elastic.elastic_rank_state`)."""
        self._pending = state

    def _restore(self, state: dict[str, Any]) -> None:
        """Apply a kept checkpoint state (from `start`, once the instance table and φ exist)."""
        check_sampler_kind(state["sampler"], self._sampler)  # a stream's position cannot restore a map-style run
        saved_g = int(state.get("processes_per_worker", 1))
        if saved_g != self.processes_per_worker:
            raise ValueError(
                f"the checkpoint was written with processes_per_worker={saved_g}, this run has "
                f"processes_per_worker={self.processes_per_worker}: resume with processes_per_worker={saved_g}"
            )
        self.outer_step = int(state["outer_step"])
        self.last_synced_step = int(state["last_synced_step"])
        self.inner_steps = int(state.get("inner_steps", self.settings.inner_steps))  # older checkpoints: fixed H
        self.max_batch_size = int(state["max_batch_size"])
        # The scheduler was loaded from rank 0's files, scaled for rank 0's batch: start again from the unscaled rates.
        self._base_lrs = list(state.get("base_lrs") or self._base_lrs)
        self._base_adam = [dict(group) for group in state.get("base_adam") or self._base_adam]  # likewise
        self.totals = RunTotals(**state["totals"])
        self._train_start = time.time()
        self.global_model.load_state_dict(state["global_model"])
        self.global_model.restore_params()
        self.replica.load_optimizer_state(self._optimizer, state["inner_optimizer"])
        self._sampler.load_state_dict(state["sampler"])
        if self._scaler is not None and state["scaler"] is not None:
            self._scaler.load_state_dict(state["scaler"])
        if state.get("round") is not None:
            self._tally = RoundTally.restore(state["round"], self._part(), self.collector)
        self._rng_to_restore = state.get("rng")  # right before the first inner step, see `common/rng.py`
        if state.get("elastic") is not None:
            self._settle_elastic()
        self._pending = None

    def _settle_elastic(self) -> None:
        """After an elastic resume (`checkpoint/elastic.py`) every worker of an instance holds the same φ (overlapped: the
        average in flight applied, the offset dropped), the compression residual of the old ring is dropped, and a
        new rank gets random generators of its own (seeded by seed, rank and step), not the shared initial ones."""
        self.global_model.settle()
        self.global_model.reset_error_feedback()
        if self._rng_to_restore is None:
            set_seed(hash((self.settings.seed, self.rank, self.last_synced_step)) % 2**32)
            self._rng_to_restore = get_rng_state()

    def _log_elastic(self, elastic: dict[str, Any], global_step: int) -> None:
        """Rank 0: the elastic resume in the log (WARNING) and as a line of `adloco_resumes.jsonl`."""
        logger.warning(
            f"elastic resume: {elastic['checkpoint']} was written by {elastic['from_workers']} workers, this run has "
            f"{elastic['to_workers']}; " + "; ".join(elastic["lines"])
        )
        keys = ("checkpoint", "from_workers", "to_workers", "workers_before", "workers_after", "optimizer_sources")
        line = {"global_step": global_step, "outer_step": self.outer_step, **{key: elastic[key] for key in keys}}
        line["data"] = "map-style: every sample of the passes started is drawn exactly once by old and new workers"
        self.run_log.record_resume(line)
