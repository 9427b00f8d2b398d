"""A run's 4 machines on the links testbed, each its own elastic launcher in its own namespace, watched from outside.

Machine K runs, in namespace K, either `accelerate launch --num_machines 4 --machine_rank K --max_restarts N`
(static rendezvous at machine 0: a restart waits for every machine) or `torchrun --nnodes 3:4 --rdzv-backend c10d
--max-restarts N` (a restart goes on with the machines that join within the rendezvous' last call), with
`GLOO_SOCKET_IFNAME` set to its end of the link. Every machine runs the benchmark worker's fault run
(`recipes/benchmarks/toolkit/worker/fault_run.py`, one spec file for all) with `resume_from_checkpoint="auto"`,
recording its steps and the phases of its rounds. Each launch's output goes to `launch-machine{K}.log`, whose lines
this process reads as they come and stamps with the time it read them (every `POLL_SECONDS`).
"""

import os
import sys
import threading
import time

from adloco_hf.testing import launch_command
from recipes.benchmarks.faults.worker import WORKER_MODULE, run_launch, write_spec
from recipes.benchmarks.toolkit.paths import OFFLINE
from recipes.benchmarks.toolkit.testbeds.testbed import LinkPlan, kill_namespace_processes


__all__ = [
    "MAX_RESTARTS",
    "POLL_SECONDS",
    "LogLines",
    "Machines",
    "machine_command",
    "machine_env",
    "torchrun_command",
]

MAX_RESTARTS = 3
POLL_SECONDS = 0.2
# torchrun's c10d rendezvous: how long a restart waits for late machines once the minimum has joined, and how long a
# machine that cannot reach the rendezvous keeps trying before its launcher gives up (so that it ends by itself).
LAST_CALL_SECONDS = 20
JOIN_SECONDS = 240


def torchrun_command(
    plan: LinkPlan, k: int, argument: str, port: int, run_id: str, max_restarts: int, script: str | None = None
) -> list[str]:
    """Machine K's `torchrun` of an elastic run: at least `plan.workers - 1` machines, at most `plan.workers`; each
    worker runs `script` (default: the module `WORKER_MODULE`) with `argument` (the spec file's path).

    In a namespace the host name resolves to the loopback (`socket.getfqdn()` is `localhost`), which torchrun uses
    twice unless told otherwise: machine 0 hosts the rendezvous store (`is_host`: torchrun would look for the
    endpoint's address among the host names, and no machine would host it), and every machine gives its link's
    address (`--local-addr`): the rendezvous' rank 0 publishes its own as the workers' `MASTER_ADDR`, where each
    attempt's store is (`TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1`); `localhost` there left every worker dialling its own
    loopback, and the run hung before its first step."""
    conf = f"join_timeout={JOIN_SECONDS},last_call_timeout={LAST_CALL_SECONDS},is_host={str(k == 0).lower()}"
    return [
        sys.executable, "-m", "torch.distributed.run",
        "--nnodes", f"{plan.workers - 1}:{plan.workers}", "--nproc-per-node", "1",
        "--rdzv-backend", "c10d", "--rdzv-endpoint", f"{plan.address(0)}:{port}", "--rdzv-id", run_id,
        "--rdzv-conf", conf, "--local-addr", plan.address(k),
        "--max-restarts", str(max_restarts), "--monitor-interval", "1",
        *(["--module", WORKER_MODULE] if script is None else [script]), argument,
    ]  # fmt: skip


def machine_command(
    plan: LinkPlan, k: int, launcher: str, spec_path: str, port: int, run_id: str, max_restarts: int = MAX_RESTARTS
) -> list[str]:
    """Machine K's launch of `WORKER_MODULE` with the spec file `spec_path`, in its namespace."""
    if launcher == "torchrun":
        inner = torchrun_command(plan, k, spec_path, port, run_id, max_restarts)
    else:
        inner = launch_command(
            WORKER_MODULE, spec_path, num_processes=plan.workers, num_machines=plan.workers, machine_rank=k,
            main_process_ip=plan.address(0), main_process_port=port, max_restarts=max_restarts, module=True,
        )  # fmt: skip
    return ["ip", "netns", "exec", plan.namespace(k), *inner]


def machine_env(plan: LinkPlan, k: int, launcher: str) -> dict[str, str]:
    """Machine K's environment: offline, gloo on its link, and under torchrun each attempt its own store
    (docs/resuming.md, several machines under c10d)."""
    env = {**OFFLINE, "GLOO_SOCKET_IFNAME": plan.veth(k)}
    if launcher == "torchrun":
        env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"
    return env


class LogLines:
    """The launch logs' lines as they come, each stamped with the time it was read: `[(time, machine, text)]`."""

    def __init__(self, paths: list[str]):
        self.paths, self.offsets, self.lines = paths, [0] * len(paths), []
        self._partial = [""] * len(paths)

    def read(self) -> None:
        now = time.time()
        for k, path in enumerate(self.paths):
            if not os.path.exists(path):
                continue
            with open(path, encoding="utf-8", errors="replace") as f:
                f.seek(self.offsets[k])
                text = self._partial[k] + f.read()
                self.offsets[k] = f.tell()
            *complete, self._partial[k] = text.split("\n")
            self.lines += [(now, k, line) for line in complete]

    def first(self, since: float, *needles: str) -> tuple[float, int, str] | None:
        """The first line read at or after `since` that holds one of `needles`."""
        return next((line for line in self.lines if line[0] >= since and any(n in line[2] for n in needles)), None)


class Machines:
    """The machines of one run, each launch in a thread (`run_launch`: its process group is killed at `timeout`)."""

    def __init__(self, plan: LinkPlan, launcher: str, spec: dict, folder: str, timeout: float, run_id: str):
        from adloco_hf.testing import free_port

        self.plan, self.folder = plan, folder
        os.makedirs(folder, exist_ok=True)
        spec_path, port = write_spec(spec), free_port()  # one spec file, read by every machine
        self.logs = LogLines([os.path.join(folder, f"launch-machine{k}.log") for k in range(plan.workers)])
        self.codes: list[int | None] = [None] * plan.workers
        self.started = time.time()
        self.threads = []
        for k in range(plan.workers):
            command = machine_command(plan, k, launcher, spec_path, port, run_id)
            env = machine_env(plan, k, launcher)
            thread = threading.Thread(target=self._run, args=(k, command, env, timeout), daemon=True)
            thread.start()
            self.threads.append(thread)

    def _run(self, k: int, command: list[str], env: dict, timeout: float) -> None:
        try:
            result = run_launch(command, timeout=timeout, env=env, log_path=self.logs.paths[k], check=False)
            self.codes[k] = result.returncode
        except BaseException:
            self.codes[k] = -1
            raise

    def running(self) -> bool:
        return any(thread.is_alive() for thread in self.threads)

    def stop(self) -> None:
        """Every process of the run's namespaces killed (SIGTERM, then SIGKILL), and the launches' threads joined."""
        for k in range(self.plan.workers):
            kill_namespace_processes(self.plan.namespace(k))
        for thread in self.threads:
            thread.join(timeout=30)
