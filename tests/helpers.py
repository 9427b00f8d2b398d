"""Shared pieces of the test suite: tiny models built from configs, learnable synthetic data, launching workers.

Launching and the tiny models come from `adloco_hf.testing` (shared with the benchmarks); what is only the tests'
(the contract keys, the synthetic data) lives here.
"""

import os

import datasets
import torch

from adloco_hf.testing import WorkersResult, free_port, launch_command, run_workers
from adloco_hf.testing import tiny_llama as tiny_model
from adloco_hf.testing import tiny_llama_config as tiny_config


__all__ = [
    "CONTRACT_ROUND_KEYS",
    "REPO",
    "SCRIPTS",
    "TESTS",
    "flat_params",
    "free_port",
    "launch",
    "sequence_dataset",
    "tiny_config",
    "tiny_model",
]


# DESIGN §4's keys of adloco_rounds.jsonl, written out here on purpose: a contract test must not read the list it checks.
CONTRACT_ROUND_KEYS = frozenset(
    {
        "outer_step", "global_step", "instance", "workers", "num_instances", "batch_size", "next_batch_size",
        "micro_batch_size", "accumulation_steps", "samples", "train_loss", "grad_variance", "grad_sq_norm",
        "pseudo_grad_norm", "comm_bytes", "comm_seconds", "merged_from",
    }
)  # fmt: skip

TESTS = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(TESTS)
SCRIPTS = os.path.join(TESTS, "scripts")


def sequence_dataset(n: int = 512, length: int = 32, vocab_size: int = 64, seed: int = 1) -> datasets.Dataset:
    """Arithmetic sequences modulo the vocabulary: easy to learn, so losses fall within a few dozen steps."""
    generator = torch.Generator().manual_seed(seed)
    rows = []
    for _ in range(n):
        start = int(torch.randint(0, vocab_size, (1,), generator=generator))
        step = int(torch.randint(1, 4, (1,), generator=generator))
        ids = [(start + step * k) % vocab_size for k in range(length)]
        rows.append({"input_ids": ids, "labels": ids})
    return datasets.Dataset.from_list(rows)


def flat_params(model: torch.nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().float().reshape(-1) for p in model.parameters() if p.requires_grad])


def launch(script: str, *args: str, num_processes: int, timeout: int = 300, env: dict | None = None) -> WorkersResult:
    """`accelerate launch --multi_gpu` with gloo on CPU (DESIGN §6); fails the test with the workers' output.

    The workers run from the repository root with it and `tests/` on `PYTHONPATH` (worker scripts import
    `helpers`), one OpenMP thread each.
    """
    command = launch_command(script, *args, num_processes=num_processes)
    return run_workers(command, timeout=timeout, env=env, cwd=REPO, pythonpath=[REPO, TESTS], threads=1)
