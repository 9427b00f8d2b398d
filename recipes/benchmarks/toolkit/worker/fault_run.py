"""One process of a fault benchmark's run (`faults process`, `soak`, `network`): a spec of kind "faults".

    accelerate launch ... --module recipes.benchmarks.toolkit.worker {probe_dir}/spec.json

The spec (`recipes/benchmarks/faults/worker.py` writes it) holds `output_dir`, `world_size` (every process asserts
it; a list: any of them, for an elastic launcher that may restart with fewer machines), `probe_dir` (where the
records go), `config` (`AdLoCoConfig` overrides of `fault_config`'s), and optionally `model` (`tiny_llama` overrides),
`dropout` (its attention dropout: a resumed run then depends on every worker's random generators too),
`num_samples` (512), `resume` (`train(resume_from_checkpoint=...)`), the faults (`faults.py`'s `FAULT_KEYS`), and
`kills.py`'s `kills`, `hold_for_signal`, `progress` and `phases`. Each process trains a tiny Llama on arithmetic
sequences (`adloco_hf.testing`) with AdLoCo: what a benchmark reads afterwards is the run's own files (checkpoints,
`merged/`, the rounds file), the launch's output, and the probe folder's `progress-rank{R}.jsonl` and
`phases-rank{R}.jsonl`.
"""

import os

import torch.distributed as dist

from adloco_hf import AdLoCoConfig
from adloco_hf.testing import sequence_dataset, tiny_llama
from recipes.benchmarks.toolkit.worker.faults import FAULT_KEYS, FaultyTrainer, arm_faults
from recipes.benchmarks.toolkit.worker.kills import arm_kills, record_phases, record_progress


__all__ = ["DEFAULTS", "SPEC_KEYS", "fault_config", "fault_data", "fault_model", "run_faults"]

SPEC_KEYS = frozenset(
    {"kind", "output_dir", "world_size", "probe_dir", "config", "model", "dropout", "num_samples", "resume"}
    | {"kills", "hold_for_signal", "progress", "phases"}
    | set(FAULT_KEYS)
)
# A worker on the CPU, quiet, with the norm test's own requests (`batch_size_target="test"`): they repeat exactly,
# where the goodput rule's follow the step times a loaded machine measures, so that a resumed run can be compared
# with an uninterrupted one number for number. `config` overrides any of them.
DEFAULTS = {
    "use_cpu": True,
    "report_to": [],
    "disable_tqdm": True,
    "log_level": "warning",
    "plot_run": False,
    "batch_size_target": "test",
}


def fault_config(spec: dict) -> AdLoCoConfig:
    """The run's `AdLoCoConfig`: `DEFAULTS`, its `output_dir`, then the spec's `config` (with several processes it
    forms their process group)."""
    return AdLoCoConfig(**{**DEFAULTS, "output_dir": spec["output_dir"], **spec["config"]})


def fault_model(spec: dict):
    """The tiny Llama every process starts from (`adloco_hf.testing.tiny_llama`, seed 0), shaped by `model`, with
    the spec's attention dropout."""
    dropout = {"attention_dropout": spec["dropout"]} if spec.get("dropout") else {}
    return tiny_llama(**spec.get("model", {}), **dropout)


def fault_data(spec: dict):
    """`num_samples` arithmetic sequences (`adloco_hf.testing.sequence_dataset`; 512 by default)."""
    return sequence_dataset(spec.get("num_samples", 512))


def run_faults(spec: dict) -> None:
    unknown = sorted(set(spec) - SPEC_KEYS)
    if unknown:
        raise ValueError(f"a fault run's spec has no keys {unknown}: it takes {sorted(SPEC_KEYS)}")
    args = fault_config(spec)
    sizes = spec["world_size"] if isinstance(spec["world_size"], list) else [spec["world_size"]]
    world = dist.get_world_size() if dist.is_initialized() else None
    if world not in sizes:
        raise RuntimeError(
            f"expected a world of {sizes} processes, this one sees {world}: launch with `accelerate launch "
            "--multi_gpu --num_processes N` (use_cpu=True on a machine without a GPU)"
        )
    rank, probe_dir = dist.get_rank(), spec["probe_dir"]
    os.makedirs(probe_dir, exist_ok=True)
    data = fault_data(spec)
    model = fault_model(spec)
    trainer = FaultyTrainer(model=model, args=args, train_dataset=data)
    arm_faults(trainer, model, spec, rank)
    if spec.get("kills") is not None:
        arm_kills(trainer, spec["kills"], rank, spec.get("hold_for_signal"))
    if spec.get("progress"):  # after the trainer's own callbacks: a step is recorded once its round's end has run
        record_progress(trainer, rank, probe_dir)
    if spec.get("phases"):  # when each outer step and merge begin and end (the network family's triggers)
        record_phases(trainer, rank, probe_dir)
    trainer.train(resume_from_checkpoint=spec.get("resume"))
