"""The runs side by side and the JSON file (the benchmark is described in `__init__.py`)."""

import argparse
import json
import os
import platform
import statistics
import tempfile
import time

from recipes.benchmarks.toolkit.figures import pyplot, save_figure


os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def corpus(cache_dir: str, block_size: int):
    from adloco_hf.data import BUILTIN_CORPUS, build_lm_datasets, load_or_train_tokenizer, load_text_corpus

    texts = load_text_corpus(BUILTIN_CORPUS)
    tokenizer = load_or_train_tokenizer(None, texts, vocab_size=4096, cache_dir=cache_dir)
    lm = build_lm_datasets(texts, tokenizer, block_size=block_size, cache_dir=cache_dir)
    return texts, tokenizer, lm["train"]


def stream_of(texts, tokenizer, block_size: int, directory: str):
    """The corpus's documents as 4 JSON-lines shards, streamed and packed on the fly."""
    from adloco_hf.data import PackedStream, load_document_stream

    os.makedirs(directory, exist_ok=True)
    files = [os.path.join(directory, f"shard-{k}.jsonl") for k in range(4)]
    handles = [open(path, "w", encoding="utf-8") for path in files]
    for i, text in enumerate(texts["text"]):
        handles[i % 4].write(json.dumps({"text": text}) + "\n")
    for handle in handles:
        handle.close()
    return PackedStream(load_document_stream(directory), tokenizer, block_size=block_size)


def run_once(data, *, loader_processes: int, settings: dict, out: str) -> dict:
    import torch
    from transformers import TrainerCallback, default_data_collator

    from adloco_hf import AdLoCoConfig, AdLoCoTrainer
    from adloco_hf.testing import tiny_llama

    begin, end = {}, {}

    class Clock(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            begin[state.global_step + 1] = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            end[state.global_step] = time.perf_counter()

    loader = {"dataloader_num_workers": loader_processes}
    if loader_processes:
        loader.update(dataloader_prefetch_factor=settings["prefetch_factor"], dataloader_persistent_workers=True)
    args = AdLoCoConfig(
        output_dir=out, use_cpu=True, report_to=[], disable_tqdm=True, save_strategy="no", logging_strategy="no",
        max_steps=settings["steps"], inner_steps=settings["inner_steps"], per_device_train_batch_size=settings["batch"],
        max_batch_size=settings["batch"], batch_size_test="none", optim="adamw_torch", learning_rate=1e-3, seed=0,
        save_merges=False, plot_run=False, log_level="warning", **loader,
    )  # fmt: skip
    model = tiny_llama(vocab_size=4096, hidden_size=settings["hidden"], max_position_embeddings=settings["block"])
    trainer = AdLoCoTrainer(model=model, args=args, train_dataset=data, data_collator=default_data_collator)
    trainer.add_callback(Clock())
    trainer.train()
    first, last = settings["inner_steps"] + 1, settings["steps"]
    seconds = end[last] - begin[first]
    tokens = (last - first + 1) * settings["batch"] * settings["block"]
    del trainer
    torch.cuda.empty_cache() if torch.cuda.is_available() else None
    return {"tokens_per_second": tokens / seconds, "seconds": seconds}


def summary(values: list[float]) -> dict:
    ordered = sorted(values)
    return {"median": statistics.median(values), "min": ordered[0], "max": ordered[-1], "values": values}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Tokens/s with and without DataLoader worker processes")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--loader_processes", type=int, default=2)
    parser.add_argument("--kinds", default="map,stream")
    parser.add_argument("--out", required=True, help="The results JSON; the figure is written beside it (.png).")
    parser.add_argument("--plot_only", action="store_true", help="Draw the figure of an existing --out, run nothing.")
    parser.add_argument("--cache_dir", default="outputs/cache")
    return parser.parse_args(argv)


def plot(results: dict, path: str) -> str:
    """Tokens/s of every repeat without and with the loader processes, per kind of data: each repeat a pair."""
    plt = pyplot()
    kinds = results["kinds"]
    fig, axes = plt.subplots(1, len(kinds), figsize=(4.2 * len(kinds), 3.6), squeeze=False)
    n = results["loader_processes"]
    for ax, (kind, r) in zip(axes[0], kinds.items()):
        for without, with_ in zip(r["without"]["values"], r["with"]["values"]):
            ax.plot([0, 1], [without, with_], "o-", color="tab:gray", alpha=0.6)
        ax.plot([0, 1], [r["without"]["median"], r["with"]["median"]], "s-", color="tab:blue", lw=2, label="median")
        ax.set(xticks=[0, 1], xticklabels=["0 loader processes", f"{n} loader processes"], xlim=(-0.3, 1.3),
               ylabel="tokens/s", title=f"{kind}: with / without {r['ratio']['median']:.3f} (median)")  # fmt: skip
        ax.legend(fontsize=8)
    fig.suptitle(f"DataLoader processes, {results['machine']['cpus']} CPUs, {results['repeats']} repeats", fontsize=10)
    return save_figure(fig, path)


def main(argv: list[str] | None = None) -> None:
    options = parse_args(argv)
    figure = os.path.splitext(options.out)[0] + ".png"
    if options.plot_only:
        with open(options.out, encoding="utf-8") as f:
            print(plot(json.load(f), figure))
        return
    settings = {"steps": 60, "inner_steps": 10, "batch": 16, "block": 128, "hidden": 64, "prefetch_factor": 2}
    texts, tokenizer, train = corpus(options.cache_dir, settings["block"])
    results = {"settings": settings, "loader_processes": options.loader_processes, "repeats": options.repeats,
               "machine": {"cpus": os.cpu_count(), "python": platform.python_version()}, "kinds": {}}  # fmt: skip
    with tempfile.TemporaryDirectory() as work:
        for kind in options.kinds.split(","):
            rows = {0: [], options.loader_processes: []}
            for repeat in range(options.repeats):
                order = list(rows) if repeat % 2 == 0 else list(rows)[::-1]  # neither setting always runs first
                for processes in order:
                    data = train if kind == "map" else stream_of(texts, tokenizer, settings["block"], f"{work}/docs")
                    row = run_once(data, loader_processes=processes, settings=settings, out=f"{work}/out")
                    rows[processes].append(row["tokens_per_second"])
                    print(f"{kind} repeat {repeat}: {processes} loader processes: {row['tokens_per_second']:,.0f} "
                          "tokens/s", flush=True)  # fmt: skip
            ratios = [with_ / without for with_, without in zip(rows[options.loader_processes], rows[0])]
            results["kinds"][kind] = {
                "without": summary(rows[0]),
                "with": summary(rows[options.loader_processes]),
                "ratio": summary(ratios),
            }
            r = results["kinds"][kind]["ratio"]
            print(f"{kind}: with / without = {r['median']:.3f} (min {r['min']:.3f}, max {r['max']:.3f})", flush=True)
    os.makedirs(os.path.dirname(os.path.abspath(options.out)), exist_ok=True)
    with open(options.out, "w") as f:
        json.dump(results, f, indent=1)
    print(plot(results, figure))
