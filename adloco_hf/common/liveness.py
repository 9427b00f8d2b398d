"""A dead peer named within `peer_timeout`, whatever the waits' own timeouts (docs/faults.md#timeouts).

A machine whose link dies leaves its worker alive and its sockets silent. The others, waiting for it in a
collective, learn of it only when that wait's timeout passes: `worker_timeout`, 30 minutes by default, because a
healthy wait may be that long (a merge sends an instance's weights as one message: a 1 B model takes 53 minutes over
10 Mbit/s). One timeout cannot both wait that long for a transfer and name a dead peer within a minute.

The pulse (`common/pulse.py`) tells them apart: every worker's counter in the job's store moves every second while
its process lives and reaches the store, whatever its main thread does (computing, or sending a merge over a
saturated link: the pulse's few bytes share the link). So a watch thread in every worker reads the others' counters
once a period; a peer whose counter has stood still for `peer_timeout` seconds, and that did not stop its pulse
itself at the end of training, is named, and this worker ends with exit code 75 (`PEER_LOST_EXIT_CODE`) and a
message naming it. Its launcher then restarts it or gives up, as for any failed worker, and the run resumes from the
newest intact checkpoint. Ending the process is the only way out: the main thread may be blocked in a collective
that no exception can interrupt (torch's NCCL watchdog ends a process whose collective hung for the same reason).

A link's outage of T seconds leaves a pulse silent for up to about 2 T (TCP retransmits after intervals that double,
0.2, 0.4, 0.8 ... s), so an outage shorter than half of `peer_timeout` costs nothing. The cut machine's own calls to
the store are bounded by `peer_timeout` too (`common/job_store.py`): it ends itself about when the others name it.
What the watch does not catch: a worker whose process lives and beats but whose main thread is stuck (a deadlock)
is waited for until `worker_timeout`.
"""

import contextlib
import os
import threading
import time

from .pulse import PULSE_SECONDS, ended_key, pulse_key
from .upstream import exit_now


__all__ = ["PEER_LOST_EXIT_CODE", "PeerWatch", "silent_peers"]

# EX_TEMPFAIL (sysexits.h), as the store watchdog's: a temporary failure, the launcher may try again.
PEER_LOST_EXIT_CODE = 75


def silent_peers(last_moved: dict[int, float], now: float, timeout: float) -> list[int]:
    """The ranks whose counter last moved `timeout` seconds or more before `now` (pure)."""
    return sorted(rank for rank, moved in last_moved.items() if now - moved >= timeout)


class PeerWatch:
    """Reads the other workers' pulses every `period` seconds and ends this process when one stands still for
    `timeout` seconds (module docstring).

    Args:
        store: the job's store (`common/job_store.job_store`), where the pulses beat.
        rank: this worker's rank; world_size: the number of ranks, every one of which beats.
        timeout: `peer_timeout`, seconds a peer's pulse may stand still.
        period: seconds between two reads (the pulse's period).
    """

    def __init__(self, store, rank: int, world_size: int, timeout: float, period: float = PULSE_SECONDS):
        self._store, self._rank, self.timeout, self.period = store, rank, timeout, period
        self._peers = [r for r in range(world_size) if r != rank]
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> "PeerWatch":
        if self._peers:
            self._thread = threading.Thread(target=self._run, name="adloco-peer-watch", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        """No peer is named after this returns (the thread is at most one read of the store from its end)."""
        self._stopped.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()

    def _counts(self) -> list[int]:
        return [self._store.add(pulse_key(rank), 0) for rank in self._peers]

    def _ended(self, rank: int) -> bool:
        """Whether `rank` stopped its pulse itself (the end of its training), not died."""
        key = ended_key(rank)
        return bool(self._store.check([key])) and self._store.get(key) == b"1"

    def _run(self) -> None:
        try:
            counts = self._counts()
        except Exception:  # the store is gone (the launcher stopped): nothing left to watch
            return
        start = time.monotonic()
        last_moved = dict.fromkeys(self._peers, start)
        while not self._stopped.wait(self.period):
            try:
                now_counts = self._counts()
                now = time.monotonic()
                for rank, before, after in zip(self._peers, counts, now_counts, strict=True):
                    if after != before:
                        last_moved[rank] = now
                counts = now_counts
                lost = [r for r in silent_peers(last_moved, now, self.timeout) if not self._ended(r)]
            except Exception:
                return
            if lost and not self._stopped.is_set():
                self._end(lost, now - min(last_moved[r] for r in lost))

    def _end(self, lost: list[int], silent_for: float) -> None:
        """End the process, naming `lost` (written with os.write: the main thread may hold Python's locks)."""
        message = (
            f"AdLoCo: rank {self._rank}: worker rank(s) {', '.join(map(str, lost))} gave no pulse for "
            f"{silent_for:.0f} s (peer_timeout={self.timeout:g}): their machine died or lost its link (a busy or "
            "waiting worker still beats every second). No round can end without them, so this worker ends with exit "
            f"code {PEER_LOST_EXIT_CODE}; its launcher restarts the run from the newest intact checkpoint "
            "(train(resume_from_checkpoint='auto'), --max_restarts) or gives up. If a link's outages are expected to "
            "last longer than peer_timeout / 2, raise peer_timeout (docs/faults.md#timeouts).\n"
        )
        with contextlib.suppress(OSError):
            os.write(2, message.encode())
        exit_now(PEER_LOST_EXIT_CODE)
