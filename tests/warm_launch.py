"""Launches whose processes start with the library already imported: the test suite's ~100 launches, made cheap.

On 2 CPU cores a launch of a tiny model is mostly start-up: `accelerate launch` imports accelerate and torch (about
1 s), and every worker imports torch, transformers' `Trainer`, accelerate, datasets and the library (about 3.5 s of
CPU each), where the run itself takes a second or two. Here a server process (the zygote) imports all of it once per
test session; a launch is then:

1. the zygote forks a child, which runs `accelerate launch` (or `torchrun` for one process) on the test's command
   line: the real argument parsing, environment, `torch.distributed.run` and elastic agent, rendezvous, signal
   forwarding and exit summary;
2. the elastic agent starts each worker as it always does, through `SubprocessHandler`, whose `Popen` of
   `python -u script.py ...` is replaced by [`ForkedWorker`]: a process forked with the imports done
   ([`WorkerForks`]: from a single-threaded copy of the launcher made before its agent started, and adopted by the
   launcher, so the agent waits for it, signals its session and reads its exit code as for a `Popen`) that runs the
   script as the interpreter would: `runpy` as `__main__`, `sys.argv`, `sys.path[0]` the script's folder,
   line-buffered output, its own session as `start_new_session=True` gives, the atexit hooks at its end, the exit
   code of its `SystemExit`, or 1 after a traceback.

A fork keeps its parent's signal handlers where `exec` resets them, so each forked process sets its own as an executed
one would find them ([`as_executed`]): a signal its parent ignored stays ignored (as under `nohup`, or in a background
job, which ignores SIGINT), every other one is back to its default, then Python's own start-up (SIGINT raises
`KeyboardInterrupt`, SIGPIPE and SIGXFSZ ignored). The launcher's parent is the test process (its dispositions travel
with the request), a worker's is the elastic agent.

`tests/test_warm_launch.py` checks a warm worker against a fresh one, for each way a worker can end.

What is not the same as a fresh interpreter, and so where a test launches the command itself (`warm=False` in
`helpers.launch`): start-up is not exercised (import errors, the version check, warnings given at import), and the
launchers' own behaviour is the subject of the README's commands, the recipes, the accelerate config files and the
restart tests, which keep running the commands a user types. `ADLOCO_TEST_LAUNCH=cold make test` runs every launch
from scratch.

    python -m warm_launch --serve /tmp/zygote.sock   # the server; `Zygote` below starts it and talks to it
"""

import atexit
import ctypes
import json
import os
import runpy
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback


__all__ = ["PRELOAD", "ForkedWorker", "Zygote", "as_executed", "ignored_signals"]

# What the zygote imports before it forks (a module that fails to import is left to the worker, which then imports
# it itself). `helpers` is the test suite's module (tests/ is on PYTHONPATH).
PRELOAD = [
    "torch",
    "torch.distributed.run",
    "transformers",
    "transformers.trainer",
    "accelerate",
    "accelerate.commands.launch",
    "datasets",
    "safetensors.torch",
    "adloco_hf",
    "adloco_hf.trainer.trainer",
    "adloco_hf.worker.core",
    "helpers",
]
# The launchers a command may name (`python -m <launcher> ...`), as `adloco_hf.testing.launch_command` writes them.
LAUNCHERS = ("accelerate.commands.launch", "torch.distributed.run")


# What `exec` does to signal dispositions, for each signal a process may handle (SIGKILL and SIGSTOP cannot be).
_SIGNALS = sorted(signal.valid_signals() - {signal.SIGKILL, signal.SIGSTOP})
# `Popen(restore_signals=True)` resets these to their defaults before `exec`, and Python's start-up ignores them again.
_PYTHON_IGNORES = (signal.SIGPIPE, signal.SIGXFSZ)


def ignored_signals() -> list[int]:
    """The signals this process ignores (`SIG_IGN`), which a program it executes would find ignored too."""
    return [int(sig) for sig in _SIGNALS if sig not in _PYTHON_IGNORES and signal.getsignal(sig) == signal.SIG_IGN]


def as_executed(ignored: list[int]) -> None:
    """Set this forked process's signal dispositions to those of a Python program executed by a parent that ignored
    `ignored` (`ignored_signals()` of the parent): those stay ignored, every other signal is back to its default, then
    what Python's start-up sets (SIGINT raises `KeyboardInterrupt` unless ignored; SIGPIPE, SIGXFSZ ignored)."""
    for sig in _SIGNALS:
        try:
            signal.signal(sig, signal.SIG_IGN if sig in ignored else signal.SIG_DFL)
        except OSError:  # a signal the C library keeps for itself (the real-time ones a thread library uses)
            pass
    for sig in _PYTHON_IGNORES:
        signal.signal(sig, signal.SIG_IGN)
    if signal.SIGINT not in ignored:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def _run_as_main(run) -> int:
    """`run()` as an interpreter runs a program: the exit code of its `SystemExit`, or 1 after printing the traceback
    of another exception; then the atexit hooks it registered, and the output flushed."""
    for stream in (sys.stdout, sys.stderr):
        stream.reconfigure(line_buffering=True)  # `python -u`: a line written is a line seen, even before a SIGKILL
    code = 0
    try:
        run()
    except SystemExit as exit_:
        if exit_.code is None or isinstance(exit_.code, int):
            code = exit_.code or 0
        else:
            print(exit_.code, file=sys.stderr)
            code = 1
    except BaseException:
        traceback.print_exc()
        code = 1
    finally:
        atexit._run_exitfuncs()
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
    return code


def _run_worker(args: tuple, env: dict[str, str], stdout: str | None, stderr: str | None, ignored: list[int]) -> int:
    """In a forked process: what `python -u [-m] target args...` (`args`, from the agent, which ignored the signals
    `ignored`) would do, with `env`."""
    argv = [a for a in args[1:] if a != "-u"]
    module = argv[0] == "-m"
    if module:
        argv = argv[1:]
    os.setsid()  # as Popen(start_new_session=True): the agent signals the worker's group
    as_executed(ignored)
    for target, path in ((1, stdout), (2, stderr)):
        if path is not None:  # the agent's --redirects / --log-dir files
            fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            os.dup2(fd, target)
            os.close(fd)
    os.environ.clear()
    os.environ.update(env)
    sys.argv = list(argv)
    if module:  # `python -m`: sys.path[0] is the working directory, as in the zygote
        return _run_as_main(lambda: runpy.run_module(argv[0], run_name="__main__", alter_sys=True))
    sys.path[0] = os.path.dirname(os.path.abspath(argv[0]))  # `python script.py`: the script's folder
    return _run_as_main(lambda: runpy.run_path(argv[0], run_name="__main__"))


class WorkerForks:
    """The workers of one launch, forked from a process that is single-threaded, and adopted by the launcher.

    The elastic agent runs threads (its store's server among them); a process forked from it could inherit a lock
    another thread held at that moment and hang. So before the agent starts, the launcher forks this server, which
    stays single-threaded; for each worker it forks a short-lived process that forks the worker and exits at once.
    The launcher is a child subreaper (`PR_SET_CHILD_SUBREAPER`), so the orphaned worker becomes its child: the agent
    waits for it, reads its exit code and signals it as it would a `Popen`.
    """

    def __init__(self):
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER)")
        self._conn, server = socket.socketpair()
        self._lock = threading.Lock()
        if os.fork() == 0:
            code = 1
            try:
                self._conn.close()
                self._serve(server)
                code = 0
            finally:
                os._exit(code)
        server.close()

    @staticmethod
    def _serve(conn: socket.socket) -> None:
        buffer = bytearray()
        while True:
            try:
                request = json.loads(_read_line(conn, buffer))
            except ConnectionError:  # the launcher is gone
                return
            read, write = os.pipe()
            middle = os.fork()
            if middle == 0:
                code = 1
                try:
                    os.close(read)
                    worker = os.fork()
                    if worker == 0:
                        os.close(write)
                        conn.close()
                        code = _run_worker(
                            tuple(request["args"]), request["env"], request["stdout"], request["stderr"],
                            request["ignored"],
                        )  # fmt: skip
                    else:
                        os.write(write, f"{worker}\n".encode())
                        code = 0
                finally:
                    os._exit(code)
            os.close(write)
            with os.fdopen(read) as pipe:
                pid = pipe.readline().strip()
            os.waitpid(middle, 0)  # the worker is an orphan now, adopted by the launcher
            conn.sendall(f"{pid}\n".encode())

    def spawn(self, args: tuple, env: dict[str, str], stdout: str | None, stderr: str | None) -> int:
        with self._lock:
            message = {
                "args": [str(a) for a in args], "env": env, "stdout": stdout, "stderr": stderr,
                "ignored": ignored_signals(),  # the agent's, in the agent's process: what its `Popen` would pass on
            }  # fmt: skip
            self._conn.sendall((json.dumps(message) + "\n").encode())
            return int(_read_line(self._conn))


_PR_SET_CHILD_SUBREAPER = 36
_FORKS: list[WorkerForks] = []


class ForkedWorker:
    """What the elastic agent uses of `subprocess.Popen` (`pid`, `returncode`, `poll`, `wait`, `send_signal`), for a
    worker forked (`WorkerForks`) instead of `python -u [-m] target args` executed."""

    def __init__(self, args: tuple, env: dict[str, str], stdout, stderr):
        self.args = args
        self.returncode: int | None = None
        paths = [None if stream is None else stream.name for stream in (stdout, stderr)]
        self.pid = _FORKS[0].spawn(args, env, *paths)

    def poll(self) -> int | None:
        if self.returncode is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if timeout is None:
            if self.returncode is None:
                self.returncode = os.waitstatus_to_exitcode(os.waitpid(self.pid, 0)[1])
            return self.returncode
        deadline = time.monotonic() + timeout
        while self.poll() is None:
            if time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(list(self.args), timeout)
            time.sleep(0.01)
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.returncode is None:
            os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


def _fork_workers() -> None:
    from torch.distributed.elastic.multiprocessing.subprocess_handler import subprocess_handler

    def _popen(self, args, env):
        return ForkedWorker(args, env, self._stdout, self._stderr)

    subprocess_handler.SubprocessHandler._popen = _popen


def _launch(argv: list[str]) -> None:
    """One launcher's main: `argv[0]` names it (`LAUNCHERS`), the rest is its command line."""
    launcher, args = argv[0], argv[1:]
    if launcher == "torch.distributed.run":
        import torch.distributed.run as distrib_run

        distrib_run.main(args)
        return
    from accelerate.commands.launch import launch_command, launch_command_parser

    launch_command(launch_command_parser().parse_args(args))


def serve(address: str) -> None:
    """The zygote: import `PRELOAD`, then for each request on `address` fork a launch and report its pid, then its
    exit code. One request at a time (a test session launches one thing at a time)."""
    for name in PRELOAD:
        try:
            __import__(name)
        except ImportError:
            pass
    _fork_workers()
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(address + ".tmp")
    listener.listen(1)
    os.rename(address + ".tmp", address)  # the client waits for this name: the server is ready
    while True:
        conn, _ = listener.accept()
        request = json.loads(_read_line(conn))
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                listener.close()
                conn.close()
                os.setsid()  # the launch's own process group, which the client signals at a timeout
                log = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
                os.dup2(log, 1)
                os.dup2(log, 2)
                os.close(log)
                os.chdir(request["cwd"])
                os.environ.clear()
                os.environ.update(request["env"])
                as_executed(request["ignored"])  # the test process's, not the zygote's from its start
                _FORKS.append(WorkerForks())  # while this process is still single-threaded
                code = _run_as_main(lambda argv=request["argv"]: _launch(argv))
            finally:
                os._exit(code)
        conn.sendall(f"{pid}\n".encode())
        status = os.waitpid(pid, 0)[1]
        try:
            conn.sendall(f"{os.waitstatus_to_exitcode(status)}\n".encode())
        except OSError:  # the client is gone (interrupted): nothing to tell
            pass
        conn.close()


def _read_line(conn: socket.socket, buffer: bytearray | None = None) -> str:
    buffer = bytearray() if buffer is None else buffer
    while b"\n" not in buffer:
        chunk = conn.recv(65536)
        if not chunk:
            raise ConnectionError("the zygote closed the connection")
        buffer += chunk
    line, _, rest = bytes(buffer).partition(b"\n")
    buffer[:] = rest
    return line.decode()


class Zygote:
    """The client side: starts the server (`env` and `cwd` are its own; each launch brings its own too) and runs
    launches through it."""

    def __init__(self, env: dict[str, str], cwd: str, start_timeout: float = 300.0):
        self._dir = tempfile.mkdtemp(prefix="adloco-zygote-")
        self.address = os.path.join(self._dir, "zygote.sock")
        self._log = open(os.path.join(self._dir, "zygote.log"), "w")  # noqa: SIM115 (open as long as the server)
        self.process = subprocess.Popen(
            [sys.executable, "-m", "warm_launch", "--serve", self.address],
            env=env,
            cwd=cwd,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        deadline = time.monotonic() + start_timeout
        while not os.path.exists(self.address):
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.close()
                with open(os.path.join(self._dir, "zygote.log")) as f:
                    raise RuntimeError(f"the launch server did not start:\n{f.read()[-4000:]}")
            time.sleep(0.05)

    def alive(self) -> bool:
        return self.process.poll() is None

    def launch(
        self, argv: list[str], *, env: dict[str, str], cwd: str, log: str, timeout: float, kill_grace: float
    ) -> tuple[int, bool]:
        """Run one launch (`argv[0]` in `LAUNCHERS`, its output into `log`) to its end or `timeout`; returns (exit
        code, timed out). At the timeout, or if this process is interrupted, the launch's process group gets SIGTERM,
        then SIGKILL `kill_grace` seconds later (as `adloco_hf.testing.run_workers` does)."""
        with socket.socket(socket.AF_UNIX) as conn:
            conn.connect(self.address)
            request = {"argv": argv, "env": env, "cwd": cwd, "log": log, "ignored": ignored_signals()}
            conn.sendall((json.dumps(request) + "\n").encode())
            buffer = bytearray()
            pid = int(_read_line(conn, buffer))
            deadline = time.monotonic() + timeout
            timed_out = False
            try:
                for sig, wait in ((None, None), (signal.SIGTERM, kill_grace), (signal.SIGKILL, None)):
                    if sig is not None:
                        timed_out = True
                        try:
                            os.killpg(pid, sig)
                        except ProcessLookupError:
                            pass
                    conn.settimeout(max(0.01, deadline - time.monotonic()) if sig is None else wait)
                    try:
                        return int(_read_line(conn, buffer)), timed_out
                    except TimeoutError:
                        continue
            except BaseException:  # KeyboardInterrupt, a test's timeout: leave no launch behind
                for sig in (signal.SIGTERM, signal.SIGKILL):
                    try:
                        os.killpg(pid, sig)
                    except ProcessLookupError:
                        break
                    time.sleep(kill_grace if sig == signal.SIGTERM else 0)
                raise
        raise AssertionError("unreachable: SIGKILL ends every launch")

    def close(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()
        self._log.close()


if __name__ == "__main__":
    if sys.argv[1:2] != ["--serve"] or len(sys.argv) != 3:
        sys.exit("usage: python -m warm_launch --serve ADDRESS")
    serve(sys.argv[2])
