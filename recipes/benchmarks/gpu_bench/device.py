"""What the steps of `gpu_bench` share: the device and its peak, model FLOPs and MFU, the data, step timing, and
the results files. Pure Python except where a function says it imports torch.

MFU (model FLOPs utilisation) = model FLOPs per token × tokens/s ÷ the device's dense bf16 peak, with model FLOPs per
token = 6 N + 12 L d T (Kaplan et al. 2020; PaLM, Chowdhery et al. 2022, appendix B; nanoGPT's `estimate_mfu`):
N the parameters that take part in matrix products (all but the input embedding, which is a lookup), L layers,
d the hidden size, T the sequence length. 6 N counts the forward and backward of the matrix products; 12 L d T the
attention's two matrix products (scores and mixing) over the whole T × T square, as those sources count them. The
peaks are the vendors' dense (no sparsity) bf16 figures; a device not in the table gets no MFU.
"""

import glob
import json
import os
import re
import time

from recipes.benchmarks.toolkit.paths import REPO
from recipes.benchmarks.toolkit.results import write_json


__all__ = [
    "BENCH_VERSION",
    "DATA_SECONDS_BOUND",
    "RUNS_FILE",
    "MFU_FORMULA",
    "PEAK_BF16_FLOPS",
    "device_info",
    "device_slug",
    "flops_per_token",
    "finished_steps",
    "folder_versions",
    "mfu",
    "peak_flops",
    "read_runs",
    "read_step",
    "step_path",
    "tiny_corpus",
    "write_step",
]

# Written into every step's results: a folder is continued only by the same version of the benchmark (2: issue 38's
# steps, loader workers and memory per parameter; the results without a version are 1).
BENCH_VERSION = 2
RUNS_FILE = "runs.json"  # every attempt at a step: its outcome, seconds, the end of its log when it failed
LAUNCHES_SUFFIX = "-launches"  # <step>-launches.json: a step's launches packed for the clock replay, not a step
DATA_SECONDS_BOUND = 20.0  # issue 38: a step's data (tokenised, packed, loaded) ready in <= 20 s on the GPU machine
MFU_FORMULA = (
    "MFU = (6 N + 12 L d T) × tokens/s ÷ peak; N = parameters in matrix products (all but the input embedding), "
    "L layers, d hidden size, T sequence length; peak = the device's dense bf16 FLOP/s"
)
# Dense bf16 peaks (FLOP/s) by a substring of `torch.cuda.get_device_name()`, the first match wins (vendors' data
# sheets: H100 SXM 989.4 TFLOP/s, PCIe 756, NVL 835; H200 and GH200 as the H100 SXM; A100 312; L40S 362; B200 2250).
PEAK_BF16_FLOPS = (
    ("H100 PCIe", 756e12),
    ("H100 NVL", 835e12),
    ("GH200", 989.4e12),
    ("H200", 989.4e12),
    ("H100", 989.4e12),
    ("H800", 989.4e12),
    ("B200", 2250e12),
    ("A100", 312e12),
    ("L40S", 362e12),
    ("A10G", 70e12),
    ("L4", 121e12),
)


def peak_flops(name: str) -> float | None:
    """The dense bf16 peak of a device named `name`, or None when it is not in [`PEAK_BF16_FLOPS`]."""
    for key, value in PEAK_BF16_FLOPS:
        if key.lower() in name.lower():
            return value
    return None


def device_slug(name: str) -> str:
    """A folder-name form of a device name: `NVIDIA H100 80GB HBM3` -> `nvidia-h100-80gb-hbm3`."""
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-") or "device"


def device_info() -> dict:
    """The device the benchmark runs on (imports torch): name, slug, peak, memory, versions."""
    import torch
    import transformers

    cuda = torch.cuda.is_available()
    name = torch.cuda.get_device_name() if cuda else "cpu"
    return {
        "name": name,
        "slug": device_slug(name),
        "peak_bf16_flops": peak_flops(name) if cuda else None,
        "memory_bytes": torch.cuda.get_device_properties(0).total_memory if cuda else None,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "transformers": transformers.__version__,
        "device_count": torch.cuda.device_count() if cuda else 0,
    }


def flops_per_token(config, seq_len: int) -> dict:
    """Model FLOPs per trained token of a Llama-like `config` ([`MFU_FORMULA`]): the total and its parts."""
    d, layers = config.hidden_size, config.num_hidden_layers
    heads, kv_heads = (
        config.num_attention_heads,
        getattr(config, "num_key_value_heads", None) or config.num_attention_heads,
    )
    head_dim = getattr(config, "head_dim", None) or d // heads
    attention = d * heads * head_dim * 2 + d * kv_heads * head_dim * 2  # q, o; k, v
    mlp = 3 * d * config.intermediate_size
    lm_head = d * config.vocab_size
    n = layers * (attention + mlp) + lm_head
    return {"flops": 6 * n + 12 * layers * d * seq_len, "matmul_parameters": n, "layers": layers, "hidden": d,
            "seq_len": seq_len}  # fmt: skip


def mfu(tokens_per_second: float | None, flops: float, peak: float | None) -> float | None:
    """Model FLOPs utilisation, or None without a peak or a throughput."""
    if not tokens_per_second or not peak:
        return None
    return tokens_per_second * flops / peak


def step_path(results_dir: str, step: str, suffix: str = "json") -> str:
    return os.path.join(results_dir, f"{step}.{suffix}")


def read_step(results_dir: str, step: str) -> dict | None:
    """A step's results, or None when it has not finished (its JSON is written last, atomically)."""
    path = step_path(results_dir, step)
    if not os.path.exists(path):
        return None
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def finished_steps(results_dir: str) -> list[str]:
    """The steps whose results are in `results_dir`, by name (not `runs.json`, not a step's packed launches)."""
    names = (os.path.basename(p)[: -len(".json")] for p in glob.glob(os.path.join(results_dir, "*.json")))
    return sorted(n for n in names if n != RUNS_FILE[: -len(".json")] and not n.endswith(LAUNCHES_SUFFIX))


def folder_versions(results_dir: str) -> set[int]:
    """The benchmark versions of a folder's finished steps (1 for those written before versions were recorded)."""
    return {read_step(results_dir, step).get("bench_version", 1) for step in finished_steps(results_dir)}


def read_runs(results_dir: str) -> list[dict]:
    """Every attempt at a step recorded in the folder's `runs.json` ([] without one)."""
    path = os.path.join(results_dir, RUNS_FILE)
    if not os.path.exists(path):
        return []
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def write_step(results_dir: str, step: str, result: dict, started: float) -> str:
    """Write a finished step's JSON (after its PNG): the step counts as done once this file exists."""
    result = {"step": step, "bench_version": BENCH_VERSION, **result, "seconds": time.perf_counter() - started,
              "finished_at": time.time()}  # fmt: skip
    path = step_path(results_dir, step)
    write_json(path, result)
    return path


def tiny_corpus(cache_dir: str) -> str:
    """A small corpus for `--tiny` runs: the repository's Markdown pages, one paragraph per document (JSON lines
    in `cache_dir`, rewritten only when missing). A byte-level BPE trains on it in about a second."""
    path = os.path.join(cache_dir, "tiny-corpus.jsonl")
    if os.path.exists(path):
        return path
    paragraphs = []
    for folder, names in (
        (REPO, ["README.md"]),
        (os.path.join(REPO, "docs"), sorted(os.listdir(os.path.join(REPO, "docs")))),
    ):
        for name in names:
            if name.endswith(".md"):
                with open(os.path.join(folder, name), encoding="utf-8") as f:
                    paragraphs += [p.strip() for p in f.read().split("\n\n") if len(p.strip()) > 80]
    os.makedirs(cache_dir, exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        for text in paragraphs:
            f.write(json.dumps({"text": text}) + "\n")
    os.replace(tmp, path)
    return path
