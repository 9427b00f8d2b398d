"""A run's machines on the links testbed (`testbed.py`): one `accelerate launch` per namespace, as machine K of M,
each with its worker's traffic on its own rate-limited link; and the facts of the machine they all run on.

    with Testbed(LinkPlan(workers=4)) as testbed:
        testbed.limit(parse_rate("100mbit"), default_burst(parse_rate("100mbit")))
        codes, seconds = launch_machines(testbed, spec, spec_path, timeout=600)

Each machine runs `runs.WORKER_MODULE` with `GLOO_SOCKET_IFNAME` set to its end of the link, so torchrun's rendezvous
and the whole gloo world run over the limited links.
"""

import os
import platform
import threading
import time

from adloco_hf.testing import free_port, launch_command, run_workers
from recipes.benchmarks.toolkit.paths import OFFLINE, REPO
from recipes.benchmarks.toolkit.runs import WORKER_MODULE, slow_group
from recipes.benchmarks.toolkit.testbeds.testbed import LinkPlan, Testbed, kill_namespace_processes


__all__ = ["FAILURE_GRACE_SECONDS", "launch_machines", "machine_command", "machine_info"]

# After one machine's launch failed, the others get this long to notice before their processes are killed.
FAILURE_GRACE_SECONDS = 30.0


def machine_command(plan: LinkPlan, k: int, spec_path: str, port: int, processes_per_machine: int = 1) -> list[str]:
    """Machine K's launch: `accelerate launch` as machine K of `plan.workers`, one worker each, in K's namespace
    (a worker of `processes_per_machine` processes: `processes_per_worker`, its DDP traffic on the machine)."""
    return [
        "ip", "netns", "exec", plan.namespace(k),
        *launch_command(
            WORKER_MODULE, spec_path, num_processes=plan.workers * processes_per_machine, module=True,
            num_machines=plan.workers, machine_rank=k, main_process_ip=plan.address(0), main_process_port=port,
        ),
    ]  # fmt: skip


def launch_machines(testbed: Testbed, spec: dict, spec_path: str, timeout: float) -> tuple[list[int], float]:
    """Launch machine K in namespace K for every K and wait for all; returns their exit codes and the seconds."""
    plan = testbed.plan
    port = free_port()
    codes: list[int | None] = [None] * plan.workers
    failed = threading.Event()

    env = dict(OFFLINE)

    def machine(k: int) -> None:
        try:
            result = run_workers(
                machine_command(plan, k, spec_path, port, spec.get("processes_per_worker", 1)),
                timeout=timeout,
                # GLOO_SOCKET_IFNAME: the host name resolves to 127.0.0.1 in a namespace.
                env={**env, "GLOO_SOCKET_IFNAME": plan.veth(k)},
                cwd=REPO,
                pythonpath=[REPO],
                threads=spec["threads_per_worker"],
                log_path=os.path.join(spec["output_dir"], f"launch-machine{k}.log"),
                check=False,
            )
            codes[k] = result.returncode
        except BaseException:
            codes[k] = -1
            raise
        finally:
            if codes[k] != 0:
                failed.set()

    start = time.perf_counter()
    with slow_group(spec) as slow_env:  # `*_slow1` / `*_balanced`: machine K's processes join its quota
        env.update(slow_env)
        threads = [threading.Thread(target=machine, args=(k,), daemon=True) for k in range(plan.workers)]
        for thread in threads:
            thread.start()
        failed_since = None
        while any(thread.is_alive() for thread in threads):
            for thread in threads:
                thread.join(timeout=0.5)
            if failed.is_set():
                failed_since = failed_since or time.monotonic()
                if time.monotonic() - failed_since > FAILURE_GRACE_SECONDS:
                    for k, thread in enumerate(threads):
                        if thread.is_alive():
                            kill_namespace_processes(plan.namespace(k))
    return [-1 if c is None else c for c in codes], time.perf_counter() - start


def machine_info() -> dict:
    """The machine every run shares: platform, Python, CPUs and their model, the load at the start, torch."""
    info = {
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "loadavg_at_start": os.getloadavg() if hasattr(os, "getloadavg") else None,
    }
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            names = [line.split(":", 1)[1].strip() for line in f if line.startswith("model name")]
        info["cpu"] = names[0] if names else None
    except OSError:
        pass
    try:
        import torch

        info["torch"] = torch.__version__
    except ImportError:
        pass
    return info
