"""The lighthouse: the one service every worker asks, each round, which workers are alive (torchft's
`LighthouseServer`, a Rust gRPC server). It forms a quorum once `min_workers` workers have asked and either every
worker of the last quorum has asked again or `join_timeout` has passed; a worker whose heartbeats stop for
`heartbeat_timeout` is left out of the next quorum.

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
        join_timeout: how long a quorum waits for the workers of the last one that have not asked yet.
        heartbeat_timeout: silence after which a worker counts as dead.
        quorum_tick: how often the lighthouse checks whether a quorum can form.
    """

    port: int = 0
    min_workers: int = 1
    join_timeout: float = 1.0
    heartbeat_timeout: float = 5.0
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
