"""Each worker's pulse in the job's key-value store: what tells a dead worker from a busy one.

A worker killed with SIGKILL (a preempted machine, the OOM killer) leaves no word anywhere. Its peers learn of it
only at their next collective with it, which in DiLoCo may be a whole round away, or from the launcher, which
SIGTERMs the survivors and kills them 30 s later. A survivor asked to stop must then leave at once, not wait for a
stop step the dead worker will never post, nor train on to the round's end (`worker/preemption.py`). A busy or
blocked worker, on the other hand, must be waited for. The pulse tells them apart: a daemon thread of every worker adds
1 to its counter in the store every `period` seconds (the thread runs while the main thread computes or waits in a
collective, both of which release the GIL); a worker whose counter stands still for several periods is gone.
"""

import threading
import time


__all__ = ["PULSE_SECONDS", "Pulse", "ended_key", "pulse_key"]

PULSE_SECONDS = 1.0


def pulse_key(rank: int) -> str:
    """The store key of `rank`'s counter."""
    return f"adloco/pulse/{rank}"


def ended_key(rank: int) -> str:
    """The store key that says whether `rank` stopped its pulse itself ("1", the end of its training) or beats
    ("0"): a peer watch (`common/liveness.py`) does not name a worker that ended."""
    return f"adloco/pulse/{rank}/ended"


class Pulse:
    """This worker's pulse, and the pulses of the others (`silent`).

    Args:
        store: the job's store (the default group's, so one launch attempt never reads another's counters).
        rank: this worker's rank.
        period: seconds between two beats.
    """

    def __init__(self, store, rank: int, period: float = PULSE_SECONDS):
        self._store, self._rank, self.period = store, rank, period
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> "Pulse":
        self._store.set(ended_key(self._rank), "0")
        self._beat()  # the first beat before returning: a peer that looks now already sees this worker
        self._thread = threading.Thread(target=self._run, name="adloco-pulse", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """No beat after this returns (the thread, at most one store call from its end, is waited for)."""
        self._stopped.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()
        try:
            self._store.set(ended_key(self._rank), "1")
        except Exception:  # the store is gone (the launcher stopped): nobody is left to read it
            pass

    def _beat(self) -> None:
        self._store.add(pulse_key(self._rank), 1)

    def _run(self) -> None:
        while not self._stopped.wait(self.period):
            try:
                self._beat()
            except Exception:  # the store is gone (the launcher stopped): nothing left to tell
                return

    def silent(self, ranks, periods: int = 3) -> list[int]:
        """The workers among `ranks` whose pulse does not move in `periods` periods (this call waits that long;
        at once when `ranks` is empty). A worker that never beat counts as silent."""
        ranks = sorted(set(ranks) - {self._rank})
        if not ranks:
            return []
        before = [self._store.add(pulse_key(r), 0) for r in ranks]
        time.sleep(periods * self.period)
        after = [self._store.add(pulse_key(r), 0) for r in ranks]
        return [r for r, b, a in zip(ranks, before, after, strict=True) if a == b]
