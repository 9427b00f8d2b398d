"""Preemption: a SIGTERM or SIGINT to any worker, or to the launcher (which forwards it), ends the run cleanly.

Kubernetes, Slurm and spot instances send SIGTERM and kill the job after a grace period (torchrun itself waits 30 s
before SIGKILL). On the first SIGTERM/SIGINT a worker only raises a flag; every worker then stops at the same step,
a checkpoint is written there and training ends with [`TrainingPreempted`] naming it. A second signal stops at
once (the default behaviour).

Where the workers stop:

- At the round's end when it is expected within `preemption_grace_seconds` (from the recent step time): the flag
  travels in the round-end all-gather (`WorkerReport.preempt`), so every worker learns it there, even those that got
  no signal. Nothing is cut: the checkpoint is an ordinary round-end one.
- Otherwise at the next step every worker can reach: the worker that got the signal posts a request in the job's
  key-value store; every worker looks for it after each step (at most once a second), posts the step it is at and
  waits; once all have posted, the stop step is the largest posted one, so nobody has to go back. The checkpoint is
  then written inside the round, with each worker's own weights and round tallies, so the resumed run continues
  the round exactly. The decision is written once in the store (compare-and-set) and every worker uses it.
- A worker that does not post in time (a few step times) may be blocked in another collective that waits for the
  posters (a logging gather at `logging_steps`, or a callback's own): then the decision is the round's end, the
  posters go on, which releases it, and it reads the decision at its next look. The same holds when a worker has
  already entered the round's end. So with per-step collectives the run stops at the round's end, never hangs.
- Unless it is dead: a worker that does not post and whose pulse (`common/pulse.py`) has stopped was killed (the
  launcher SIGTERMs the survivors of a SIGKILLed worker). No stop step or round's end can be reached with it, so
  every survivor raises `WorkerTimeoutError` naming it, without a checkpoint, and the launcher restarts the run from
  the last one (`train(resume_from_checkpoint="auto")`).
"""

import logging
import signal
import threading
import time
from collections.abc import Callable

import torch.distributed as dist

from ..common.distributed import WorkerTimeoutError, stop_waiting_for_workers
from ..common.job_store import job_store
from ..common.liveness import PeerWatch
from ..common.pulse import Pulse


__all__ = ["Preemption", "TrainingPreempted", "set_timings", "stop_requested"]

logger = logging.getLogger(__name__)

_REQUEST_KEY = "adloco/preempt/request"
_DECISION_KEY = "adloco/preempt/decision"  # the stop step, or _ROUND_END; written once (compare_set)
_ROUND_END = "round_end"
_POLL_SECONDS = 1.0  # how often a worker without a signal looks for a request in the store
# How long a worker waits for the others to post, beyond two polls and three step times: past it a worker that has not
# posted is taken to be blocked in another collective, and the run stops at the round's end instead.
_AGREE_SECONDS = 1.0


def set_timings(*, poll_seconds: float | None = None, agree_seconds: float | None = None) -> None:
    """Shorten the protocol's waits in this process (None: left as they are): fault tests and benchmarks
    (`adloco_hf.fault_points.set_preemption_timings`, which documents both)."""
    global _POLL_SECONDS, _AGREE_SECONDS
    if poll_seconds is not None:
        _POLL_SECONDS = poll_seconds
    if agree_seconds is not None:
        _AGREE_SECONDS = agree_seconds


def stop_requested(store) -> bool:
    """Whether a worker has posted a stop request in the job's store (`adloco_hf.fault_points.stop_requested`)."""
    return store.check([_REQUEST_KEY])


class TrainingPreempted(RuntimeError):
    """Training stopped on SIGTERM/SIGINT after writing `checkpoint`; resume from it to continue exactly."""

    def __init__(self, message: str, checkpoint: str | None):
        super().__init__(message)
        self.checkpoint = checkpoint

    @classmethod
    def saved(cls, checkpoint: str, step: int, signal_name: str | None) -> "TrainingPreempted":
        """The error of a run that stopped at `step` and saved `checkpoint` inside a round."""
        return cls(
            f"training was preempted ({signal_name or 'a signal to another worker'}) and stopped at step {step}: "
            f"every worker saved its state in {checkpoint}. Resume with train(resume_from_checkpoint={checkpoint!r}) "
            "(or True) and the same number of processes (it was written inside a round: another number of workers "
            "can resume only from a round's end).",
            checkpoint,
        )


class Preemption:
    """One worker's view of a preemption: its signal handlers and the agreement on where to stop.

    Args:
        grace_seconds: how far away (in expected seconds) the round's end may be for the run to stop there.
        reached_round_end: tells whether any worker has entered the current round's end (then nobody waits for it).
    """

    def __init__(
        self, grace_seconds: float, reached_round_end: Callable[[], bool] = lambda: False, peer_timeout: float = 0.0
    ):
        self.grace_seconds = grace_seconds
        self.peer_timeout = peer_timeout  # > 0: a peer watch names a dead worker after it (`common/liveness.py`)
        self._reached_round_end = reached_round_end
        self.signal_name: str | None = None  # the first signal received by this worker
        self.stop_step: int | None = None  # the step every worker stops at, once agreed
        self.at_round_end = False  # stop at the round's end (the flag travels in the all-gather)
        self._previous: dict[int, object] = {}
        self._last_poll = 0.0
        self._last_step_time: float | None = None
        self._step_seconds: float | None = None
        self._store = None
        self._pulse: Pulse | None = None
        self._watch: PeerWatch | None = None

    # ---- signals ----
    def install(self) -> None:
        """Handle SIGTERM and SIGINT (main thread only; elsewhere Python cannot install handlers)."""
        if threading.current_thread() is not threading.main_thread():
            return
        stop_waiting_for_workers(False)
        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            # The rendezvous store, as WorkerMonitor uses it; without one only round-end stops are possible.
            self._store = job_store()
        if self._store is not None:
            self._pulse = Pulse(self._store, dist.get_rank()).start()
            if self.peer_timeout > 0:
                self._watch = PeerWatch(self._store, dist.get_rank(), dist.get_world_size(), self.peer_timeout).start()
        for signum in (signal.SIGTERM, signal.SIGINT):
            self._previous[signum] = signal.signal(signum, self._handle)

    def uninstall(self) -> None:
        if self._watch is not None:  # before the pulse: a peer that ends first is not taken for a dead one
            self._watch.stop()
            self._watch = None
        if self._pulse is not None:
            self._pulse.stop()
            self._pulse = None
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous = {}

    def _handle(self, signum, frame) -> None:
        if self.signal_name is not None:  # a second signal: give up the clean stop
            self.uninstall()
            signal.raise_signal(signum)
            return
        self.signal_name = signal.Signals(signum).name
        stop_waiting_for_workers()  # a worker only waiting to learn who failed stops waiting (common/distributed.py)
        logger.warning(
            "received %s: training stops at the next step all workers can reach (the round's end if it is within "
            "%g s), saves a checkpoint and exits; send it again to stop at once",
            self.signal_name,
            self.grace_seconds,
        )

    @property
    def requested(self) -> bool:
        """Whether this worker got a signal, or a stop step or round-end stop was agreed."""
        return self.signal_name is not None or self.stop_step is not None or self.at_round_end

    # ---- where to stop ----
    def after_step(self, step: int, *, steps_to_round_end: int) -> bool:
        """Called after every inner step (before the round's end, if it is one): whether to stop at this step.

        `steps_to_round_end` is 0 when this step ends a round; stopping there is left to the round's all-gather.
        """
        now = time.monotonic()
        if self._last_step_time is not None:
            seconds = now - self._last_step_time
            self._step_seconds = seconds if self._step_seconds is None else 0.7 * self._step_seconds + 0.3 * seconds
        self._last_step_time = now
        if self.stop_step is not None:
            return step >= self.stop_step
        if self.at_round_end or steps_to_round_end == 0:
            return False
        if self.signal_name is not None and self._round_end_within_grace(steps_to_round_end):
            self.at_round_end = True
            return False
        if self.signal_name is None and not self._request_seen(now):
            return False
        self.stop_step = self._agree(step)
        return self.stop_step is not None and step >= self.stop_step

    def _round_end_within_grace(self, steps_to_round_end: int) -> bool:
        if self._step_seconds is None:
            return steps_to_round_end <= 1
        return steps_to_round_end * self._step_seconds <= self.grace_seconds

    def _request_seen(self, now: float) -> bool:
        if self._store is None or now - self._last_poll < _POLL_SECONDS:
            return False
        self._last_poll = now
        return self._store.check([_REQUEST_KEY])

    def _agree(self, step: int) -> int | None:
        """Post this worker's step and wait for the decision every worker will use (the first one written wins):
        the largest posted step once every worker has posted, or the round's end (None) when a worker has entered
        the round's end or does not post in time (it may be blocked in another collective, e.g. a logging gather,
        waiting for this worker: going on releases it, and it learns the decision at its next look)."""
        if self._store is None:
            return step  # a single worker stops where it is
        rank, world = dist.get_rank(), dist.get_world_size()
        self._store.set(_REQUEST_KEY, str(rank))
        self._store.set(f"{_REQUEST_KEY}/step/{rank}", str(step))
        keys = [f"{_REQUEST_KEY}/step/{r}" for r in range(world)]
        seconds = self._step_seconds or 0.0
        # Long enough for every worker to look (a poll interval and a few steps), short enough to keep the grace.
        deadline = time.monotonic() + 2 * _POLL_SECONDS + 3 * seconds + _AGREE_SECONDS
        while True:
            decision = None
            if self._store.check([_DECISION_KEY]):
                decision = self._store.get(_DECISION_KEY).decode()
            elif self._store.check(keys):
                decision = str(max(int(self._store.get(key)) for key in keys))
            elif self._reached_round_end():
                decision = _ROUND_END
            elif time.monotonic() >= deadline:
                self._stop_if_workers_are_gone([r for r, key in enumerate(keys) if not self._store.check([key])])
                decision = _ROUND_END
            if decision is not None:
                # compare_set writes only where nothing is written yet and returns what is stored.
                decision = self._store.compare_set(_DECISION_KEY, "", decision).decode()
                if decision == _ROUND_END:
                    self.at_round_end = True
                    return None
                return int(decision)
            time.sleep(0.05)

    def _stop_if_workers_are_gone(self, silent_so_far: list[int]) -> None:
        """The workers that did not post: busy ones are waited for at the round's end, but dead ones never come (the
        launcher SIGTERMs the survivors of a SIGKILLed worker): a stop step or a round's end would never be reached
        together, so this worker leaves now, with the error naming them, and the launcher can restart the run from
        the last checkpoint (every one written is intact)."""
        gone = self._pulse.silent(silent_so_far) if self._pulse is not None else []
        if gone:
            raise WorkerTimeoutError(
                f"AdLoCo: worker rank(s) {', '.join(map(str, gone))} are gone (their pulse stopped: killed, or their "
                f"machine lost) while this worker (rank {dist.get_rank()}) was asked to stop "
                f"({self.signal_name or 'a stop request from another worker'}); no checkpoint can be written without "
                "them, so this worker stops now. Every checkpoint already written is intact: resume with "
                "train(resume_from_checkpoint='auto') (under a launcher with --max_restarts, the restarted run does)."
            )
