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

So `worker_timeout` <= `ddp_timeout`: the check below refuses the reverse before any data is built.
"""

__all__ = ["check_timeouts"]


def check_timeouts(config) -> None:
    """Refuse `worker_timeout` above `ddp_timeout` (module docstring: torch's backstop would fire first, with a
    message that names no worker), naming both fields and the fix."""
    ddp_timeout = getattr(config, "ddp_timeout", None)
    if ddp_timeout is not None and config.worker_timeout > ddp_timeout:
        raise ValueError(
            f"worker_timeout={config.worker_timeout:g} is above ddp_timeout={ddp_timeout:g}: torch.distributed's own "
            "timeout would stop a collective on the default group first, with an error that names no worker. Set "
            f"ddp_timeout >= worker_timeout (e.g. ddp_timeout={int(-(-config.worker_timeout // 1))}) or lower "
            "worker_timeout (docs/faults.md#timeouts)."
        )
