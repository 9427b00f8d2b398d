"""A launch watched from outside as a real preemption would be: its workers found through the launcher's process
tree, one SIGKILLed at a random time of each attempt, the launcher left to restart them."""

import os
import random
import shutil
import signal
import threading
import time

import psutil

from adloco_hf.testing import launch_command
from recipes.benchmarks.faults.progress import Progress
from recipes.benchmarks.faults.soak.config import WORLD_SIZE, spec
from recipes.benchmarks.faults.worker import WORKER_MODULE, run_launch, write_spec


__all__ = ["Launch", "soak"]


class Launch:
    """One launch in a thread (`run_launch`: its timeout kills every worker), so that this process can watch it."""

    def __init__(self, name: str, root: str, config: dict, *, max_restarts: int, timeout: float):
        self.out, self.probe = os.path.join(root, name), os.path.join(root, f"{name}-probe")
        for folder in (self.out, self.probe):
            shutil.rmtree(folder, ignore_errors=True)
        spec_path = write_spec(spec(self.out, self.probe, config))
        command = launch_command(
            WORKER_MODULE, spec_path, num_processes=WORLD_SIZE, max_restarts=max_restarts, module=True
        )
        self.progress, self.result, self.log = (
            Progress(self.probe, WORLD_SIZE),
            None,
            os.path.join(root, f"{name}.log"),
        )
        self.started = time.time()
        self.thread = threading.Thread(target=self._run, args=(command, timeout), daemon=True)
        self.thread.start()

    def _run(self, command, timeout):
        self.result = run_launch(command, timeout=timeout, log_path=self.log, check=False)

    def running(self) -> bool:
        return self.thread.is_alive()

    def launcher(self) -> psutil.Process | None:
        for child in psutil.Process().children():
            try:
                if "accelerate.commands.launch" in child.cmdline() and self.running():
                    return child
            except psutil.NoSuchProcess:
                continue
        return None

    def worker_pid(self, rank: int, attempt: int) -> int | None:
        """The pid of worker `rank` of launch attempt `attempt`: a child of the launcher (its elastic agent)."""
        launcher = self.launcher()
        for child in launcher.children() if launcher else []:
            try:
                env = child.environ()
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
            if env.get("RANK") == str(rank) and env.get("TORCHELASTIC_RESTART_COUNT", "0") == str(attempt):
                return child.pid
        return None

    def stop(self) -> None:
        """SIGKILL the workers, then the launcher's process group (the workers run in sessions of their own, so a
        dead launcher would leave them behind), and wait for the launch's thread."""
        launcher = self.launcher()
        if launcher is None:
            return
        for process in [*launcher.children(recursive=True), launcher]:
            try:
                process.kill()
            except psutil.NoSuchProcess:
                pass
        try:
            os.killpg(launcher.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.thread.join(timeout=60)

    def finished(self) -> bool:
        return (
            self.result is not None and self.result.returncode == 0 and os.path.isdir(os.path.join(self.out, "merged"))
        )


def soak(
    launch: Launch, *, kills: int, kill_every: float, max_steps: int, rng: random.Random, restart_timeout: float
) -> list[dict]:
    """Kill a random worker `kill_every` × U(0.5, 1.5) seconds after each attempt's first step, `kills` times while
    training is left (never while the workers start, nor after the last step); print a line per kill and restart.
    A run with no new step `restart_timeout` seconds after a kill is stopped: it did not come back by itself."""
    plan = [(kill_every * rng.uniform(0.5, 1.5), rng.randrange(WORLD_SIZE)) for _ in range(kills)]
    done, announced = [], set()
    try:
        while launch.running():
            time.sleep(0.25)
            launch.progress.read()
            attempt = launch.progress.attempt()
            first = launch.progress.first_step_time(attempt)
            back = attempt > done[-1]["attempt"] and first is not None if done else True
            if not back and time.time() - done[-1]["time"] > restart_timeout:
                print(f"    no step {restart_timeout:g} s after kill {len(done)}: stopping the run", flush=True)
                launch.stop()
                break
            if attempt > 0 and first is not None and attempt not in announced:
                announced.add(attempt)
                kill = next((k for k in done if k["attempt"] == attempt - 1), None)
                since = f"; its first step {first - kill['time']:.1f} s after the kill" if kill else ""
                starts = launch.progress.starts[attempt].values()
                print(f"    restart {attempt}: resumed from step {min(starts)}{since}", flush=True)
            if len(done) >= kills or first is None or any(k["attempt"] == attempt for k in done):
                continue
            wait, rank = plan[len(done)]
            reached = launch.progress.reached(attempt) or 0
            if time.time() - first < wait or reached >= max_steps - 1:
                continue
            pid = launch.worker_pid(rank, attempt)
            if pid is None:
                continue
            os.kill(pid, signal.SIGKILL)
            now = time.time()
            done.append({"kill": len(done) + 1, "time": now, "rank": rank, "pid": pid, "attempt": attempt})
            print(f"  kill {len(done)}: SIGKILL to rank {rank} (pid {pid}) of attempt {attempt} at step ~{reached}, "
                  f"{now - launch.started:.0f} s into the run", flush=True)  # fmt: skip
        launch.thread.join()
    except BaseException:
        launch.stop()
        raise
    launch.progress.read()
    return done
