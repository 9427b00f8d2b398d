"""The lighthouse: the one service every worker asks, each round, which workers are alive (torchft's
`LighthouseServer`, a Rust gRPC server). It forms a quorum once `min_workers` workers have asked and either every
worker that is alive (heartbeating) has asked or `join_timeout` has passed; a worker whose heartbeats (every 0.1 s,
on a thread of their own) stop for `heartbeat_timeout` is dead for the next quorum.

The two timeouts are AdLoCo's two (docs/faults.md#timeouts), and default to their defaults:

- `heartbeat_timeout` is `peer_timeout` (45 s): it names the dead. A dead worker's heartbeats stop, and the next
  quorum forms without it once they have been silent that long, with no wait for `join_timeout`.
- `join_timeout` is `worker_timeout` (1800 s): it bounds the wait for a worker that is alive but late at a round's
  end (a slower machine, a longer save). Shorter than the spread of a round's end between healthy workers, it would
  leave a slow worker out of rounds it was about to join (it would then heal and join the next).

Start one per job, on a machine every worker reaches, before the workers:

```python
from adloco_hf.quorum import LighthouseSettings, start_lighthouse

lighthouse = start_lighthouse(LighthouseSettings(port=29510, min_workers=2))
print(lighthouse.address())  # what every worker is given as its lighthouse
```

From a shell, `adloco-hf lighthouse --port 29510 --min_workers 2` runs one until it is stopped (SIGINT or SIGTERM);
torchft's own `torchft_lighthouse --bind [::]:29510 --min_replicas 2` is the same server.
"""

import signal
import threading
from dataclasses import dataclass

from .requirement import import_torchft


__all__ = ["LighthouseSettings", "serve_lighthouse", "start_lighthouse"]


@dataclass(frozen=True)
class LighthouseSettings:
    """When the lighthouse forms a quorum, and when it gives up on a worker (seconds).

    Attributes:
        port: the port it listens on, on every interface (0: a free one; `address()` names it).
        min_workers: the fewest workers a round may have: with fewer alive the workers wait for more.
        join_timeout: how long a quorum waits for a live worker that has not asked yet (`worker_timeout`).
        heartbeat_timeout: silence after which a worker counts as dead (`peer_timeout`).
        quorum_tick: how often the lighthouse checks whether a quorum can form.
    """

    port: int = 0
    min_workers: int = 1
    join_timeout: float = 1800.0  # worker_timeout's default
    heartbeat_timeout: float = 45.0  # peer_timeout's default
    quorum_tick: float = 0.1

    def __post_init__(self):
        if not 0 <= self.port <= 65535:
            raise ValueError(f"port={self.port}: set a port from 0 (a free one) to 65535")
        if self.min_workers < 1:
            raise ValueError(f"min_workers={self.min_workers}: a round needs at least one worker; set it >= 1")
        for name in ("join_timeout", "heartbeat_timeout", "quorum_tick"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name}={getattr(self, name)}: set a number of seconds > 0")


def start_lighthouse(settings: LighthouseSettings):
    """A running lighthouse (torchft's `LighthouseServer`): `address()` is what the workers connect to, `shutdown()`
    stops it."""
    import_torchft()  # the error that names the extra
    from torchft.coordination import LighthouseServer

    return LighthouseServer(
        bind=f"[::]:{settings.port}",
        min_replicas=settings.min_workers,
        join_timeout_ms=round(1000 * settings.join_timeout),
        quorum_tick_ms=round(1000 * settings.quorum_tick),
        heartbeat_timeout_ms=round(1000 * settings.heartbeat_timeout),
    )


def serve_lighthouse(settings: LighthouseSettings) -> None:
    """`adloco-hf lighthouse`: run a lighthouse until SIGINT or SIGTERM, its address on the first line of stdout."""
    stop = threading.Event()
    handlers = {sig: signal.signal(sig, lambda *_: stop.set()) for sig in (signal.SIGINT, signal.SIGTERM)}
    lighthouse = start_lighthouse(settings)
    try:
        print(f"lighthouse: {lighthouse.address()} (min_workers={settings.min_workers})", flush=True)
        stop.wait()
    finally:
        lighthouse.shutdown()
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
