"""Shared pieces of the test suite: tiny models built from configs, learnable synthetic data, launching workers."""

import os
import socket
import subprocess
import sys

import datasets
import torch
from transformers import LlamaConfig, LlamaForCausalLM


# DESIGN §4's keys of adloco_rounds.jsonl, written out here on purpose: a contract test must not read the list it checks.
CONTRACT_ROUND_KEYS = frozenset(
    {
        "outer_step", "global_step", "instance", "workers", "num_instances", "batch_size", "next_batch_size",
        "micro_batch_size", "accumulation_steps", "samples", "train_loss", "grad_variance", "grad_sq_norm",
        "pseudo_grad_norm", "comm_bytes", "comm_seconds", "merged_from",
    }
)  # fmt: skip

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPTS = os.path.join(REPO, "tests", "scripts")


def tiny_config(vocab_size: int = 64, hidden_size: int = 32, layers: int = 2) -> LlamaConfig:
    return LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
    )


def tiny_model(seed: int = 0, **kwargs) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    return LlamaForCausalLM(tiny_config(**kwargs))


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


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(script: str, *args: str, num_processes: int, timeout: int = 300, env: dict | None = None):
    """`accelerate launch --multi_gpu` with gloo on CPU (DESIGN §6); fails the test with the workers' output."""
    command = [
        sys.executable,
        "-m",
        "accelerate.commands.launch",
        "--multi_gpu",
        "--num_processes",
        str(num_processes),
        "--num_machines",
        "1",
        "--mixed_precision",
        "no",
        "--dynamo_backend",
        "no",
        "--main_process_port",
        str(free_port()),
        script,
        *args,
    ]
    full_env = {
        **os.environ,
        "PYTHONPATH": REPO + os.pathsep + os.environ.get("PYTHONPATH", ""),
        "OMP_NUM_THREADS": "1",
    }
    full_env.update(env or {})
    try:
        result = subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=full_env, cwd=REPO)
    except subprocess.TimeoutExpired as error:
        raise AssertionError(f"workers did not finish in {timeout}s:\n{error.stdout}\n{error.stderr}") from error
    if result.returncode != 0:
        raise AssertionError(
            f"workers failed (exit {result.returncode}):\n{result.stdout[-8000:]}\n{result.stderr[-8000:]}"
        )
    return result
