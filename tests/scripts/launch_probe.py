"""Worker side of `tests/test_warm_launch.py`: what a launched worker sees of its process, then an exit of one kind.

    accelerate launch --multi_gpu --num_processes 2 tests/scripts/launch_probe.py OUT_DIR MODE

Every worker writes `OUT_DIR/rank-<R>.json` (its argv, `__name__`, `sys.path[0]`, the launcher's variables, its
signal dispositions, whether it leads its own session) and registers an atexit hook that writes `atexit-<R>`. Then
rank 1 leaves by MODE: `return` (the script ends), `exit3` (`sys.exit(3)`), `raise` (an exception), `os_exit5`
(`os._exit(5)`, no atexit hooks) or `sigkill` (SIGKILL to itself); rank 0 always ends normally, after rank 1's end
(it waits for rank 1's file), so the launcher's summary blames rank 1.
"""

import atexit
import json
import os
import signal
import sys
import time


def main() -> None:
    out, mode = sys.argv[1], sys.argv[2]
    rank = int(os.environ["RANK"])
    keys = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_PORT", "ACCELERATE_USE_CPU", "ACCELERATE_MIXED_PRECISION")
    seen = {
        "argv": sys.argv[1:],
        "argv0": os.path.basename(sys.argv[0]),
        "name": __name__,
        "path0": sys.path[0],
        "env": {key: os.environ.get(key) for key in keys},
        "signals": {
            name: repr(signal.getsignal(getattr(signal, name))) for name in ("SIGTERM", "SIGINT", "SIGHUP", "SIGCHLD")
        },
        "session_leader": os.getsid(0) == os.getpid(),
    }
    with open(os.path.join(out, f"rank-{rank}.json"), "w") as f:
        json.dump(seen, f)
    atexit.register(lambda: open(os.path.join(out, f"atexit-{rank}"), "w").close())
    if rank == 0:
        while not os.path.exists(os.path.join(out, "rank-1.json")):
            time.sleep(0.01)
        time.sleep(1.0)  # rank 1's exit, whatever it is, is the launcher's first observed failure
        return
    if mode == "exit3":
        sys.exit(3)
    if mode == "raise":
        raise ValueError("rank 1 raises")
    if mode == "os_exit5":
        os._exit(5)
    if mode == "sigkill":
        os.kill(os.getpid(), signal.SIGKILL)


if __name__ == "__main__":
    main()
