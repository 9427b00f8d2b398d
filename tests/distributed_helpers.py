"""Real gloo process groups for tests, started with `torch.multiprocessing` (the pattern of torchft's integration tests).

`run_workers(fn, world_size, out_dir)` spawns `world_size` processes; each joins a gloo group on a free TCP port of
127.0.0.1, checks its rank and the world size, runs `fn(rank, world_size)`, saves what it returns to
`out_dir/rank{r}.pt`, and destroys its process groups. The parent loads the files in rank order and makes the
assertions, so a failed expectation names the test, not a worker.

Start-up cost: `import adloco_hf` imports transformers (about 5 s a process, far more on a busy 2-core machine), and
none of the modules under test needs it. Children therefore register a bare `adloco_hf` package (its `__path__`,
not its `__init__.py`) before importing anything else, and `fn` is passed by name so that unpickling the arguments
cannot import the test module (and with it the package) first. The modules themselves are the ones in the repository.
"""

import datetime
import gc
import importlib
import importlib.machinery
import os
import sys
import time
import types

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# A blocking send or collective that never completes fails the worker after this long (a hang, not a slow run).
GROUP_TIMEOUT_S = 60


def _bare_package() -> None:
    """Make `adloco_hf.<module>` importable without running `adloco_hf/__init__.py`."""
    if "adloco_hf" in sys.modules:
        return
    path = os.path.join(REPO, "adloco_hf")
    spec = importlib.machinery.ModuleSpec("adloco_hf", None, is_package=True)
    spec.submodule_search_locations = [path]
    package = types.ModuleType("adloco_hf")
    package.__path__ = [path]
    package.__spec__ = spec
    package.__package__ = "adloco_hf"
    sys.modules["adloco_hf"] = package


def _entry(rank: int, world_size: int, port: int, out_dir: str, target: str) -> None:
    _bare_package()
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=world_size,
        timeout=datetime.timedelta(seconds=GROUP_TIMEOUT_S),
    )
    try:
        assert dist.get_world_size() == world_size, (dist.get_world_size(), world_size)
        assert dist.get_rank() == rank, (dist.get_rank(), rank)
        module, name = target.split(":")
        fn = getattr(importlib.import_module(module), name)
        result = fn(rank, world_size)
        torch.save(result, os.path.join(out_dir, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()
        # Groups that `fn` created (a ProcessGroupCache, a reference cycle) must be freed now: a gloo group still
        # alive at interpreter finalization aborts the process ("terminate called without an active exception",
        # SIGABRT after the results were saved; 4 of 32 runs of test_outer.py before this).
        gc.collect()


def run_workers(fn, world_size: int, out_dir, *, timeout: float = 120.0) -> list:
    """Run `fn(rank, world_size)` in `world_size` gloo workers; returns what each returned, in rank order.

    `fn` must be a module-level function of an importable module (a test module is: pytest puts `tests/` on
    `sys.path`, and spawned children inherit it). A worker that raises fails the call with its traceback; workers
    still running after `timeout` seconds are killed and the call fails.
    """
    from adloco_hf.testing import free_port  # here, in the parent only: the children never import the package

    out_dir = str(out_dir)
    os.makedirs(out_dir, exist_ok=True)
    target = f"{fn.__module__}:{fn.__qualname__}"
    context = mp.start_processes(
        _entry,
        args=(world_size, free_port(), out_dir, target),
        nprocs=world_size,
        join=False,
        start_method="spawn",
    )
    deadline = time.monotonic() + timeout
    try:
        while not context.join(timeout=max(0.1, deadline - time.monotonic())):
            if time.monotonic() >= deadline:
                raise AssertionError(f"{world_size} workers running {target} did not finish within {timeout:g} s")
    finally:
        for process in context.processes:
            if process.is_alive():
                process.kill()
                process.join()
    return [torch.load(os.path.join(out_dir, f"rank{r}.pt"), weights_only=False) for r in range(world_size)]


def cached_runs(fn, tmp_path_factory, name: str):
    """`get(world_size)`: [`run_workers`] of `fn`, spawned once per world size and shared by a module's tests (a
    failed spawn is kept too, so every test of that world size reports the same failure)."""
    cache = {}

    def get(world_size: int) -> list:
        if world_size not in cache:
            try:
                cache[world_size] = run_workers(fn, world_size, tmp_path_factory.mktemp(f"{name}{world_size}"))
            except Exception as error:
                cache[world_size] = error
        if isinstance(cache[world_size], Exception):
            raise cache[world_size]
        return cache[world_size]

    return get


def flat(params) -> torch.Tensor:
    """The parameters as one float32 vector (a copy)."""
    return torch.cat([p.detach().float().reshape(-1) for p in params]).clone()


@torch.no_grad()
def drift(params, rank: int, round_: int, scale: float = 0.1) -> None:
    """A local update that differs per worker and per round (what the inner steps do), the same on every run."""
    generator = torch.Generator().manual_seed(1000 * rank + round_)
    for p in params:
        p.add_(torch.randn(p.shape, generator=generator) * scale)
