"""The timeouts of a run, from the innermost out, and the check that refuses a set that contradicts itself.

1. The pulse (`common/pulse.py`, 1 s): a worker whose counter in the store stands still for 3 periods is gone (read
   when a worker is asked to stop, so that it does not wait for a dead one).
2. `worker_timeout` (AdLoCo, default 1800 s): every wait of AdLoCo for the other workers (a round's end, a merge, a
   save, a public collective) and AdLoCo's own process groups. When it passes, `WorkerTimeoutError` names the
   workers that did not arrive. A worker that lost its link (its process alive, its sockets silent) is named after
   it, not before: it is the time to detection of a dead machine or link. Twice it bounds every call to the job's
   key-value store (`common/job_store.py`): the machine that lost its link ends its worker (exit code 75) instead of
   waiting forever in torch's TCPStore client, and its launcher restarts it or gives up.
3. `ddp_timeout` (`TrainingArguments`, default 1800 s): torch.distributed's own bound, on the default group (forming
   it, and the collectives that run on it, among them an instance that spans the whole world). It is the backstop:
   when it passes first, torch raises its own error, which names no worker and no round.
4. The launcher: its monitor interval (how often it looks at its workers; 1 s with `--max_restarts`), its shutdown
   timeout (how long it waits after SIGTERM before SIGKILL: 30 s, above `preemption_grace_seconds`), and the
   rendezvous timeout of a restart (how long it waits for the machines to join again). A dead *process* is seen by
   the launcher within its monitor interval, whatever the timeouts above; a dead *link* only through 2 or 3.

Beside them, `peer_timeout` (default 45 s where `worker_timeout` is above a minute): how long a worker's pulse may
stand still before the workers waiting for it name it and end, for their launcher to restart them
(`common/liveness.py`). It names a dead machine or link within a minute while `worker_timeout` stays long enough for
a large merge over a slow link; the cut machine ends itself after it too (its store calls are bounded by it).

So `worker_timeout` <= `ddp_timeout`, and `peer_timeout` (when on) between 3 pulses and `worker_timeout`: the check
below refuses the reverse before any data is built.
"""

from ..common.pulse import PULSE_SECONDS


__all__ = ["DEFAULT_PEER_TIMEOUT", "check_timeouts", "default_peer_timeout", "resolve_peer_timeout"]

# A dead peer named within a minute: 45 s of silence, read every pulse period (TCP's backoff lets an outage of up to
# 25 s pass: its retransmissions go at 0.2, 0.6, 1.4, ... 25.4 s, the next at 51 s).
DEFAULT_PEER_TIMEOUT = 45.0
# Where worker_timeout is at most this, it names a lost worker within a minute itself: the watch stays off by default.
_WATCH_ABOVE_WORKER_TIMEOUT = 60.0


def default_peer_timeout(worker_timeout: float) -> float:
    """What `peer_timeout=None` (the default) resolves to: `DEFAULT_PEER_TIMEOUT` where `worker_timeout` is above a
    minute, else 0 (off)."""
    return DEFAULT_PEER_TIMEOUT if worker_timeout > _WATCH_ABOVE_WORKER_TIMEOUT else 0.0


def resolve_peer_timeout(config) -> None:
    """`peer_timeout=None` (the default) becomes `default_peer_timeout(worker_timeout)`: the config, its JSON and a
    checkpoint hold the watch that ran."""
    if config.peer_timeout is None:
        config.peer_timeout = default_peer_timeout(config.worker_timeout)


def check_timeouts(config) -> None:
    """Refuse `worker_timeout` above `ddp_timeout` (module docstring: torch's backstop would fire first, with a
    message that names no worker), and a `peer_timeout` that is negative, within a few pulses (a busy machine's late
    beat would be taken for a death) or above `worker_timeout` (which would name the worker first), naming the fix."""
    check_peer_timeout(config)
    ddp_timeout = getattr(config, "ddp_timeout", None)
    if ddp_timeout is not None and config.worker_timeout > ddp_timeout:
        raise ValueError(
            f"worker_timeout={config.worker_timeout:g} is above ddp_timeout={ddp_timeout:g}: torch.distributed's own "
            "timeout would stop a collective on the default group first, with an error that names no worker. Set "
            f"ddp_timeout >= worker_timeout (e.g. ddp_timeout={int(-(-config.worker_timeout // 1))}) or lower "
            "worker_timeout (docs/faults.md#timeouts)."
        )


def check_peer_timeout(config) -> None:
    """`peer_timeout`: 0 (off), or from 3 pulse periods up to `worker_timeout`."""
    peer, least = config.peer_timeout, 3 * PULSE_SECONDS
    if peer is None or peer == 0:
        return
    if peer < least:
        raise ValueError(
            f"peer_timeout={peer:g}: set 0 (off) or at least {least:g} s: a worker's pulse beats every "
            f"{PULSE_SECONDS:g} s, and a busy machine may miss a beat or two (45 s names a dead link within a minute)."
        )
    if peer > config.worker_timeout:
        raise ValueError(
            f"peer_timeout={peer:g} is above worker_timeout={config.worker_timeout:g}: worker_timeout would name a "
            f"lost worker first, so the watch could never act. Set peer_timeout <= worker_timeout (e.g. "
            f"peer_timeout={min(DEFAULT_PEER_TIMEOUT, config.worker_timeout):g}) or 0 to turn it off "
            "(docs/faults.md#timeouts)."
        )
