"""Launching real AdLoCo workers from a test or a benchmark, and tiny models to train in them.

What the test suite and the benchmarks share, so the launch command is written once:

| function | what it does |
|---|---|
| [`free_port`] | a free TCP port on 127.0.0.1 for the rendezvous of one launch |
| [`launch_command`] | the `accelerate launch --multi_gpu` command line of N worker processes (a script or a module) |
| [`run_workers`] | runs such a command with a timeout, kills every worker when it expires, returns or raises with their output |
| [`tiny_llama_config`], [`tiny_llama`] | a Llama small enough to train in seconds on a CPU, built from a seed |
| [`sequence_dataset`] | learnable data for it: arithmetic sequences modulo its vocabulary, the same for a seed |

**CPU workers.** On a machine without a GPU, `accelerate launch --multi_gpu --num_processes N` plus
`TrainingArguments(use_cpu=True)` (or `AdLoCoConfig(use_cpu=True)`) in the worker gives N processes in one gloo
group. `--cpu` alone or `distributed_type: MULTI_CPU` silently runs one process, and without `use_cpu` each process
sees a world size of 1: a worker should assert `dist.get_world_size()`.

Example:
```python
>>> from adloco_hf.testing import launch_command, run_workers
>>> command = launch_command("recipes.benchmarks.toolkit.worker", "spec.json", num_processes=2, module=True)
>>> command[1:5]
['-m', 'accelerate.commands.launch', '--multi_gpu', '--num_processes']
>>> result = run_workers(command, timeout=300, cwd=".", pythonpath=["."])  # doctest: +SKIP
```

Nothing here imports the trainer: a launcher process stays light, and the model and data builders import
transformers, torch and datasets only when called.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any


if TYPE_CHECKING:
    from datasets import Dataset
    from transformers import LlamaConfig, LlamaForCausalLM


__all__ = [
    "WorkersFailed",
    "WorkersResult",
    "free_port",
    "launch_command",
    "run_workers",
    "sequence_dataset",
    "tiny_llama",
    "tiny_llama_config",
]

# Seconds the workers get to exit after SIGTERM, once the timeout has expired, before SIGKILL.
KILL_GRACE_SECONDS = 30.0
# Exit code reported for a launch killed at its timeout (what `timeout(1)` returns).
TIMEOUT_EXIT_CODE = 124
# Characters of each output stream kept in a WorkersFailed message.
_TAIL = 8000


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that is free on `host` right now: the rendezvous port of one launch.

    The port is released before returning, so another process could take it in between; with the ephemeral range
    the kernel hands out, two launches of one test session do not collide in practice.
    """
    with socket.socket() as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def launch_command(
    target: str,
    *args: str,
    num_processes: int,
    module: bool = False,
    main_process_port: int | None = None,
    mixed_precision: str = "no",
    python: str | None = None,
    num_machines: int = 1,
    machine_rank: int = 0,
    main_process_ip: str | None = None,
    max_restarts: int = 0,
) -> list[str]:
    """The command line that starts `num_processes` workers on this machine with `accelerate launch --multi_gpu`.

    One process (`num_processes=1`) is started with `torch.distributed.run` instead, which `--multi_gpu` refuses:
    still a real process group, of one rank (`mixed_precision` is then left to the worker's TrainingArguments).

    With `num_machines > 1` it is the command of one machine of a multi-machine launch: run it once per machine
    (`machine_rank` 0 to `num_machines - 1`), each starting `num_processes / num_machines` workers, all meeting at
    `main_process_ip:main_process_port` (machine 0's address; `recipes/benchmarks/links/` runs each machine in
    its own network namespace).

    Each worker runs `target` with `args`. On a CPU-only machine the workers form a gloo group only if they build
    their `TrainingArguments` with `use_cpu=True` (see the module docstring).

    Args:
        target: a script path, or with `module=True` a module name (`"recipes.benchmarks.toolkit.worker"`),
            run like `python -m`: it must be importable in the workers (see `run_workers`'s `cwd` and `pythonpath`).
        *args: the workers' own command-line arguments.
        num_processes: how many workers (the world size, over all machines).
        module: run `target` as a module (`accelerate launch --module`).
        main_process_port: the rendezvous port; a fresh [`free_port`] when None.
        mixed_precision: accelerate's `--mixed_precision` (`"no"`: the worker's TrainingArguments decide).
        python: the interpreter that runs `accelerate.commands.launch` (default: this one).
        num_machines: machines in the launch; above 1, `main_process_ip` and an explicit `main_process_port` are
            required (every machine must name the same port) and `num_processes` must be a multiple of it.
        machine_rank: this machine's rank (0: the one at `main_process_ip`).
        main_process_ip: machine 0's address (multi-machine launches only).
        max_restarts: how many times the launcher restarts the workers after one fails (`--max_restarts`, with the
            workers' health checked every second); each attempt resumes as the script says (e.g.
            `train(resume_from_checkpoint="auto")`).

    Returns:
        The argument list for `subprocess` (no shell).
    """
    if num_processes < 1:
        raise ValueError(f"num_processes must be at least 1, got {num_processes}")
    machines: list[str] = []
    if num_machines > 1:
        if main_process_ip is None or main_process_port is None:
            raise ValueError("a multi-machine launch needs main_process_ip and main_process_port")
        if num_processes % num_machines or not 0 <= machine_rank < num_machines:
            raise ValueError(
                f"num_processes={num_processes} over num_machines={num_machines} (machine_rank={machine_rank})"
            )
        machines = ["--machine_rank", str(machine_rank), "--main_process_ip", main_process_ip]
    elif num_machines != 1 or machine_rank != 0 or main_process_ip is not None:
        raise ValueError("machine_rank and main_process_ip need num_machines > 1")
    port = free_port() if main_process_port is None else main_process_port
    restarts = ["--max_restarts", str(max_restarts), "--monitor_interval", "1"] if max_restarts else []
    if num_processes == 1:
        if mixed_precision != "no":
            raise ValueError("one process is started without accelerate: set fp16/bf16 in its TrainingArguments")
        # `accelerate launch --multi_gpu` refuses one process, and without it the worker would get no process
        # group (nothing to exercise the backend with): torchrun starts one rank of a real group of one.
        return [
            python or sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc_per_node",
            "1",
            "--master_port",
            str(port),
            *(["--max-restarts", str(max_restarts), "--monitor-interval", "1"] if max_restarts else []),
            *(["--module"] if module else []),
            target,
            *args,
        ]
    return [
        python or sys.executable,
        "-m",
        "accelerate.commands.launch",
        "--multi_gpu",
        "--num_processes",
        str(num_processes),
        "--num_machines",
        str(num_machines),
        *machines,
        *restarts,
        "--mixed_precision",
        mixed_precision,
        "--dynamo_backend",
        "no",
        "--main_process_port",
        str(port),
        *(["--module"] if module else []),
        target,
        *args,
    ]


@dataclass(frozen=True)
class WorkersResult:
    """What a launch left: its exit code, its output and how long it ran.

    `stdout` and `stderr` are the launch's (accelerate's and every worker's) output. When `run_workers` wrote the
    output to a log file, `stdout` is that file's content and `stderr` is empty.
    """

    command: tuple[str, ...]
    returncode: int
    stdout: str
    stderr: str
    seconds: float
    timed_out: bool

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.timed_out


class WorkersFailed(AssertionError):
    """A launch exited with an error or ran past its timeout. `result` holds its exit code and full output.

    An `AssertionError`, so that a test that launches workers fails (rather than errors) with their output.
    """

    def __init__(self, result: WorkersResult):
        self.result = result
        if result.timed_out:
            head = f"workers did not finish in {result.seconds:.0f}s (killed)"
        else:
            head = f"workers failed (exit {result.returncode})"
        super().__init__(f"{head}:\n{result.stdout[-_TAIL:]}\n{result.stderr[-_TAIL:]}")


def _worker_env(
    env: Mapping[str, str] | None = None, *, pythonpath: Sequence[str] = (), threads: int | None = 1
) -> dict[str, str]:
    """This process's environment, with `pythonpath` in front of `PYTHONPATH`, `OMP_NUM_THREADS=threads`, then `env`."""
    full = dict(os.environ)
    paths = [os.fspath(p) for p in pythonpath]
    if full.get("PYTHONPATH"):
        paths.append(full["PYTHONPATH"])
    if paths:
        full["PYTHONPATH"] = os.pathsep.join(paths)
    if threads is not None:
        full["OMP_NUM_THREADS"] = str(threads)
    full.update(env or {})
    return full


def _kill_group(process: subprocess.Popen, grace: float) -> None:
    """SIGTERM to the launch's whole process group (accelerate and every worker), SIGKILL after `grace` seconds."""
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, None)):
        try:
            os.killpg(process.pid, sig)
        except ProcessLookupError:
            return
        try:
            process.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def run_workers(
    command: Sequence[str],
    *,
    timeout: float = 300,
    env: Mapping[str, str] | None = None,
    cwd: str | os.PathLike | None = None,
    pythonpath: Sequence[str | os.PathLike] = (),
    threads: int | None = 1,
    log_path: str | os.PathLike | None = None,
    check: bool = True,
    kill_grace: float = KILL_GRACE_SECONDS,
) -> WorkersResult:
    """Run a launch command (from [`launch_command`]) to its end or its timeout, and collect the workers' output.

    The launch runs in its own process group: at the timeout (or if this process is interrupted) every worker gets
    SIGTERM, then SIGKILL `kill_grace` seconds later, so none is left behind holding the port or the output pipes.

    Args:
        command: the argument list.
        timeout: seconds before the launch is killed; the result then has `timed_out=True` and exit code 124.
        env: variables set in the workers, over this process's environment.
        cwd: the launch's working directory (default: this one's). A module target is found from there.
        pythonpath: folders put in front of `PYTHONPATH` (e.g. the repository root, for a module target or for
            scripts that import the repository's own packages).
        threads: `OMP_NUM_THREADS` of each worker (None: inherited). Several workers on a few cores need 1.
        log_path: write stdout and stderr, interleaved, to this file instead of keeping them in memory pipes; the
            result's `stdout` is then read back from it.
        check: raise [`WorkersFailed`] when the launch exits with an error or times out.
        kill_grace: seconds between SIGTERM and SIGKILL at the timeout.

    Returns:
        A [`WorkersResult`].

    Raises:
        WorkersFailed: with `check=True`, a non-zero exit or the timeout; the message ends with the output.
    """
    command = [os.fspath(part) for part in command]
    full_env = _worker_env(env, pythonpath=[os.fspath(p) for p in pythonpath], threads=threads)
    log: Any = open(log_path, "w", encoding="utf-8") if log_path is not None else None
    start = time.perf_counter()
    timed_out = False
    try:
        process = subprocess.Popen(
            command,
            stdout=log if log is not None else subprocess.PIPE,
            stderr=subprocess.STDOUT if log is not None else subprocess.PIPE,
            text=True,
            env=full_env,
            cwd=cwd,
            start_new_session=True,
        )
        try:
            stdout, stderr = process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
            _kill_group(process, kill_grace)
            stdout, stderr = process.communicate()
        except BaseException:  # KeyboardInterrupt, a test's timeout: leave no worker behind
            _kill_group(process, kill_grace)
            raise
    finally:
        if log is not None:
            log.close()
    seconds = time.perf_counter() - start
    if log_path is not None:
        with open(log_path, encoding="utf-8", errors="replace") as f:
            stdout, stderr = f.read(), ""
    result = WorkersResult(
        command=tuple(command),
        returncode=TIMEOUT_EXIT_CODE if timed_out else process.returncode,
        stdout=stdout or "",
        stderr=stderr or "",
        seconds=seconds,
        timed_out=timed_out,
    )
    if check and not result.ok:
        raise WorkersFailed(result)
    return result


def tiny_llama_config(
    vocab_size: int = 64,
    hidden_size: int = 32,
    layers: int = 2,
    *,
    intermediate_size: int | None = None,
    num_attention_heads: int = 4,
    num_key_value_heads: int = 2,
    max_position_embeddings: int = 64,
    **overrides: Any,
) -> LlamaConfig:
    """A `LlamaConfig` small enough to train in seconds on a CPU (defaults: vocabulary 64, hidden 32, 2 layers).

    `intermediate_size` defaults to twice `hidden_size`; `overrides` are further `LlamaConfig` fields.
    """
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size if intermediate_size is None else intermediate_size,
        num_hidden_layers=layers,
        num_attention_heads=num_attention_heads,
        num_key_value_heads=num_key_value_heads,
        max_position_embeddings=max_position_embeddings,
        **overrides,
    )


def tiny_llama(seed: int = 0, **config: Any) -> LlamaForCausalLM:
    """A freshly initialised `LlamaForCausalLM` of [`tiny_llama_config`]`(**config)`: the same weights for a seed.

    Seeds torch's global generator (`torch.manual_seed(seed)`) before building, so every worker that calls it with
    the same arguments holds the same weights.
    """
    import torch
    from transformers import LlamaForCausalLM

    torch.manual_seed(seed)
    return LlamaForCausalLM(tiny_llama_config(**config))


def sequence_dataset(n: int = 512, length: int = 32, vocab_size: int = 64, seed: int = 1) -> Dataset:
    """`n` arithmetic sequences of `length` tokens modulo `vocab_size` (`input_ids` and `labels` alike): easy to
    learn, so a [`tiny_llama`]'s loss falls within a few dozen steps. The same rows for a seed (drawn from a generator
    of their own: torch's global one is left as it was)."""
    import datasets
    import torch

    generator = torch.Generator().manual_seed(seed)
    rows = []
    for _ in range(n):
        start = int(torch.randint(0, vocab_size, (1,), generator=generator))
        step = int(torch.randint(1, 4, (1,), generator=generator))
        ids = [(start + step * k) % vocab_size for k in range(length)]
        rows.append({"input_ids": ids, "labels": ids})
    return datasets.Dataset.from_list(rows)
