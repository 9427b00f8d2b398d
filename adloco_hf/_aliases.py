"""The module paths of the flat layout before 0.2 (`adloco_hf.batch_size`, `adloco_hf.switch_mode`, ...), still importable.

`import adloco_hf.batch_size` returns the very module `adloco_hf.batch.size_tests` (the same object, so a patch on
one is a patch on the other); `adloco_hf.worker.ddp` and the other modules of a worker's replica (moved since) read
`adloco_hf.worker.replicas`'s. DESIGN.md's contract names two of these paths; the rest are kept for scripts written
against the old layout. Old paths that are now packages (`adloco_hf.config`, `adloco_hf.worker`, `adloco_hf.trainer`)
re-export their main class instead.
"""

import importlib
import importlib.abc
import importlib.util
import sys


OLD_PATHS = {
    "batch_size": "batch.size_tests",  # (contract) DESIGN §3.2
    "switch_mode": "batch.switch_mode",  # (contract) DESIGN §3.3
    "batch_controller": "batch.controller",
    "grad_stats": "batch.grad_stats",
    "lr_scaling": "batch.lr_scaling",
    "max_batch": "batch.max_batch",
    "batches": "common.inputs",
    "console": "common.logs",
    "distributed": "common.distributed",
    "rng": "common.rng",
    "worker_layout": "common.layout",
    "compat": "config.compat",
    "compression": "outer.compression",
    "compressed_ring": "outer.ring",
    "eager": "outer.eager",
    "outer_reduce": "outer.reduce",
    "reshard": "sampling.reshard",
    "sampler": "sampling.sampler",
    "stream": "sampling.stream_parts",
    "stream_sampler": "sampling.stream_sampler",
    "merging": "instances.merges",
    "health": "instances.health",
    "manifest": "checkpoint.manifest",
    "run_settings": "checkpoint.run_settings",
    "elastic": "checkpoint.elastic",
    "round_tally": "rounds.tally",
    "run_log": "reporting.run_log",
    "report": "reporting.report",
    "plotting": "reporting.plotting",
    "model_card": "reporting.model_card",
    "hub": "reporting.hub",
    "worker_fsdp": "worker.replicas.fsdp",
    "initialise": "worker.initialise",
    "preemption": "worker.preemption",
    "predictions": "evaluation.predictions",
    "staged_save": "trainer.staged_save",
    "callback": "trainer.callback",
    # Moved since: a worker's replica into worker/replicas/ (a folder holds at most 15 modules).
    "worker.replica": "worker.replicas.replica",
    "worker.ddp": "worker.replicas.ddp",
    "worker.fsdp": "worker.replicas.fsdp",
    "common.restart": "config.restart",  # the default group of a launch's attempt, formed by the config
}


class _OldPathLoader(importlib.abc.Loader):
    def __init__(self, target: str):
        self.target = target

    def create_module(self, spec):
        return importlib.import_module(self.target)

    def exec_module(self, module):
        pass  # already executed under its own name


class _OldPathFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path=None, target=None):
        prefix = f"{__package__}."
        old = fullname[len(prefix) :] if fullname.startswith(prefix) else None
        if old not in OLD_PATHS:
            return None
        return importlib.util.spec_from_loader(fullname, _OldPathLoader(f"{prefix}{OLD_PATHS[old]}"))


def install() -> None:
    if not any(isinstance(finder, _OldPathFinder) for finder in sys.meta_path):
        sys.meta_path.append(_OldPathFinder())
