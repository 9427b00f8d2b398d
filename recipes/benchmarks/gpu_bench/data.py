"""The GPU benchmark's data and figures: packed blocks of `builtin:python-source` (a small local corpus with
`--tiny`), and one PNG per step.

On a machine whose torch is not the pinned one (the CUDA images), `builtin:python-source` comes from its export:
set `ADLOCO_SOURCE_CORPUS` (see `adloco_hf/data/corpus_export.py`). The tokenizer and the packed blocks are cached
in `cache_dir`. A GPU machine holds its stay for minutes, so the blocks are built there by one process a core
(`num_proc`): tokenising the corpus in one process took 83 s on the H200 machine's 16 cores, a step's whole budget
for data is 20 s. The steps record how long their data took (`data_seconds`).
"""

import os
import time

from recipes.benchmarks.gpu_bench.device import tiny_corpus
from recipes.benchmarks.toolkit.data import load_data
from recipes.benchmarks.toolkit.figures import pyplot, save_figure


__all__ = ["data_spec", "load_blocks", "plot_rows", "timed_data"]

FULL_DATA = {"corpus": "builtin:python-source", "vocab_size": 4096, "eval_blocks": 512}
TINY_DATA = {"vocab_size": 512, "eval_blocks": 32}


def data_spec(tiny: bool, cache_dir: str) -> dict:
    """The `data` entry of a benchmark spec (`toolkit.data.load_data` reads it): on a GPU machine the corpus is
    tokenised and packed by one process a core; the tiny corpus (a second's work) in this process."""
    if tiny:
        return {**TINY_DATA, "corpus": tiny_corpus(cache_dir)}
    return {**FULL_DATA, "num_proc": os.cpu_count() or 1}


def timed_data(spec: dict) -> float:
    """Build (or load) a spec's tokenizer and packed blocks into its cache; the seconds it took."""
    start = time.perf_counter()
    load_data(spec)
    return time.perf_counter() - start


def load_blocks(settings: dict):
    """(tokenizer, {"train", "eval"} packed blocks of `settings["block_size"]` tokens, the seconds they took)."""
    spec = {"data": data_spec(settings["tiny"], settings["cache_dir"]), "cache_dir": settings["cache_dir"],
            "block_size": settings["block_size"]}  # fmt: skip
    start = time.perf_counter()
    tokenizer, lm = load_data(spec)
    return tokenizer, lm, time.perf_counter() - start


def _bars(ax, labels: list[str], values: list[float], title: str, ylabel: str) -> None:
    ax.bar(range(len(values)), [v or 0 for v in values], color="tab:blue")
    ax.set_xticks(range(len(values)), labels, rotation=30, ha="right", fontsize=8)
    ax.set_title(title, fontsize=9)
    ax.set_ylabel(ylabel)


def plot_rows(step: str, result: dict, path: str) -> str:
    """The step's figure: tokens/s by variant (throughput, workers, communication), the grown run against the fixed
    one (growing-batch), or every method's eval perplexity against training seconds (headline), DiLoCo's final
    perplexity dotted."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6.4, 3.6))
    if step.startswith("throughput"):
        rows = [r for r in result["rows"] if r.get("tokens_per_second") is not None]
        labels = [f"{r['variant']}{' (compiled)' if r['compiled'] else ''}, {r['loader_workers']} loader workers"
                  for r in rows]  # fmt: skip
        _bars(ax, labels, [r["tokens_per_second"] for r in rows], step, "tokens/s")
    elif step == "growing-batch":
        grown, fixed = result["grown"], result["fixed"]
        labels = [f"grown to {grown['final_batch']} ({grown['graphs']} graphs)", f"fixed {grown['final_batch']}"]
        _bars(ax, labels, [grown.get("tokens_per_second"), fixed["tokens_per_second"]], step, "tokens/s")
    elif step.startswith("headline"):
        for method, run in result["runs"].items():
            points = [p for p in run["evals"] if p.get("seconds") is not None]
            ax.plot([p["seconds"] for p in points], [p["eval_ppl"] for p in points], marker="o", markersize=3,
                    label=method)  # fmt: skip
        ax.axhline(result["time_to_target"]["target_ppl"], color="grey", linestyle=":", linewidth=1)
        ax.set_yscale("log")
        ax.set_xlabel("training seconds (evaluations excluded)")
        ax.set_ylabel("eval perplexity")
        ax.set_title(f"{step}: workers sharing the device", fontsize=9)
        ax.legend(fontsize=8)
    else:
        runs = result["runs"]
        _bars(ax, [r["name"] for r in runs], [r.get("tokens_per_second") for r in runs], step, "tokens/s")
    return save_figure(fig, path, dpi=80)
