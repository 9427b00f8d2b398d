r"""Fine-tune a saved causal LM with AdLoCo on your own text, and report its perplexity before and after.

The model folder gives the weights and the tokenizer (e.g. the demo's `outputs/demo/merged`); the text comes from
local files (`--dataset_files`: `.jsonl`/`.json` with a `text` column, `.txt` with one document per line, `.csv`,
`.parquet`, also compressed; glob patterns are expanded) or from `--dataset_name`: a local file or folder, or a Hub
dataset. Arguments come from `--config file.yaml` and the command line (which wins), as in `pretrain_c4.py`; `--help`
lists them all.

    # One process (CPU or one GPU), after `make demo`:
    python recipes/finetune_clm.py --model_name_or_path outputs/demo/merged --dataset_files my_notes.jsonl \
        --output_dir outputs/finetune --max_steps 200 --inner_steps 50 --learning_rate 1e-3

    # 4 CPU workers, 2 instances that merge once:
    accelerate launch --config_file accelerate_configs/cpu_4_workers.yaml recipes/finetune_clm.py \
        --model_name_or_path outputs/demo/merged --dataset_files my_notes.jsonl --output_dir outputs/finetune \
        --max_steps 200 --inner_steps 50 --num_instances 2 --merge_every 2

    # A Hub dataset and its column (needs the network the first time):
    python recipes/finetune_clm.py --model_name_or_path outputs/demo/merged --dataset_name roneneldan/TinyStories \
        --num_documents 20000 --text_column text --output_dir outputs/finetune --max_steps 400 --inner_steps 100

The eval perplexity is computed with the `evaluate` metric shipped in `adloco_hf/metrics/perplexity.py` (loaded by
path, offline) from each eval batch's mean loss and token count. Outputs in `output_dir`: `finetune_results.json`
(`perplexity_before`, `perplexity_after`, and the losses), the fine-tuned model in `merged/` (safetensors, tokenizer,
model card) and AdLoCo's logs (`adloco_rounds.jsonl`, `adloco_eval.jsonl`: an evaluation at every round's end, unless
`--eval_strategy no`, and the merged model's at the end).
"""

import glob
import json
import logging
import math
import os
from dataclasses import dataclass, field

import datasets
import evaluate
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader
from transformers import AutoTokenizer, HfArgumentParser, default_data_collator

import adloco_hf
from adloco_hf import AdLoCoConfig, AdLoCoTrainer
from adloco_hf.cli import parse_args_with_yaml, recipe_parser, setup_logging
from adloco_hf.data import build_lm_datasets, lm_dataset_stats, load_text_corpus
from adloco_hf.inspection import check_checkpoint_path
from adloco_hf.presets import build_model


logger = logging.getLogger("finetune_clm")

PERPLEXITY_METRIC = os.path.join(os.path.dirname(adloco_hf.__file__), "metrics", "perplexity.py")
RESULTS_FILE = "finetune_results.json"


@dataclass
class ScriptArguments:
    """The model to start from and the text to fine-tune on; everything about training is in `AdLoCoConfig`."""

    model_name_or_path: str = field(
        metadata={
            "help": "Folder (or Hub id) of the model to fine-tune, with its tokenizer (e.g. outputs/demo/merged)."
        }
    )
    dataset_name: str | None = field(
        default=None,
        metadata={
            "help": "A local .jsonl/.json/.txt/.csv/.parquet file or folder, or a Hub dataset id (or give "
            "--dataset_files alone)."
        },
    )
    dataset_files: list[str] | None = field(
        default=None,
        metadata={
            "help": "Local files to fine-tune on (glob patterns allowed), read in order; with --dataset_name, the "
            "data files of that Hub dataset."
        },
    )
    text_column: str = field(default="text", metadata={"help": "Column holding the documents."})
    num_documents: int | None = field(default=None, metadata={"help": "Take the first N documents (default: all)."})
    block_size: int | None = field(
        default=None,
        metadata={"help": "Tokens per sequence (default: min(128, the model's max_position_embeddings))."},
    )
    eval_fraction: float = field(default=0.1, metadata={"help": "Share of the documents held out for evaluation."})
    max_eval_documents: int | None = field(default=None, metadata={"help": "Upper bound on the eval documents."})
    cache_dir: str | None = field(
        default=None, metadata={"help": "Where packed datasets are cached (default: none, kept in memory)."}
    )


def local_files(patterns: list[str]) -> list[str]:
    """`--dataset_files` without `--dataset_name`: every pattern expanded (in sorted order), each file checked."""
    files = []
    for pattern in patterns:
        matches = sorted(glob.glob(pattern)) if glob.has_magic(pattern) else [pattern]
        missing = [path for path in matches if not os.path.isfile(path)]
        if not matches or missing:
            raise FileNotFoundError(
                f"--dataset_files {pattern}: no such file. Pass local files (JSON lines with a 'text' field, .txt, "
                ".csv, .parquet), or a Hub dataset with --dataset_name and its files with --dataset_files."
            )
        files.extend(matches)
    return files


def load_documents(script_args: ScriptArguments) -> datasets.Dataset:
    """The documents to fine-tune on: `--dataset_name` (with its `--dataset_files`, if any), or the local files of
    `--dataset_files` alone, concatenated in order (`--num_documents` takes the first N over all of them)."""
    if script_args.dataset_name is not None:
        return load_text_corpus(
            script_args.dataset_name,
            num_documents=script_args.num_documents,
            data_files=script_args.dataset_files,
            text_column=script_args.text_column,
        )
    parts, remaining = [], script_args.num_documents
    for path in local_files(script_args.dataset_files):
        part = load_text_corpus(path, num_documents=remaining, text_column=script_args.text_column)
        parts.append(part)
        if remaining is not None:
            remaining -= len(part)
            if remaining <= 0:
                break
    return parts[0] if len(parts) == 1 else datasets.concatenate_datasets(parts)


def data_label(script_args: ScriptArguments) -> str:
    """The data as the user named it: the dataset (a Hub id, a local file or folder), else the local files."""
    return script_args.dataset_name or ", ".join(script_args.dataset_files or [])


def build_parser() -> HfArgumentParser:
    """The recipe's command line: `ScriptArguments` and every field of `AdLoCoConfig` (and `--config FILE.yaml`, added
    by `parse_args_with_yaml`); `--help` starts with this module's docstring, then AdLoCo's options."""
    return recipe_parser(ScriptArguments, __doc__)


def parse_args(argv: list[str] | None = None) -> tuple[ScriptArguments, AdLoCoConfig]:
    """The command line (`None`: `sys.argv[1:]`) as the script's dataclasses, with defaults from `--config`."""
    # Without a GPU the workers need use_cpu=True for a gloo group (else each one sees a world of 1). The eval set is
    # evaluated at every round's end (eval_steps defaults to inner_steps), so that adloco_eval.jsonl and the run's
    # plot show the fine-tuning's course, not only its start and end (--eval_strategy no turns it off).
    defaults = {"eval_strategy": "steps"} | ({} if torch.cuda.is_available() else {"use_cpu": True})
    parser = build_parser()
    script_args, training_args = parse_args_with_yaml(parser, argv, defaults=defaults)
    if script_args.dataset_name is None and not script_args.dataset_files:
        parser.error(
            "no text to fine-tune on: pass --dataset_files my.jsonl (local files) or --dataset_name (a local file or "
            "folder, or a Hub dataset id)"
        )
    return script_args, training_args


@torch.no_grad()
def batch_losses(trainer: AdLoCoTrainer, dataset: datasets.Dataset) -> tuple[list[float], list[int]]:
    """Mean loss and number of predicted tokens of every eval batch, over all workers (each takes a strided shard).

    The model is the trainer's current one: the starting weights before training, the merged ones after it.
    """
    args = trainer.args
    shard = dataset.select(range(args.process_index, len(dataset), args.world_size))
    loader = DataLoader(shard, batch_size=args.per_device_eval_batch_size, collate_fn=trainer.data_collator)
    model = trainer.model
    model.eval()
    losses, counts = [], []
    for inputs in loader:
        inputs = {key: value.to(args.device) for key, value in inputs.items()}
        with trainer.autocast_smart_context_manager():
            loss = model(**inputs).loss
        # Causal LM: every position but the first of each sequence is predicted (labels are shifted inside).
        counts.append(int((inputs["labels"][:, 1:] != -100).sum()))
        losses.append(float(loss))
    if dist.is_available() and dist.is_initialized():
        gathered = [None] * dist.get_world_size()
        dist.all_gather_object(gathered, (losses, counts))
        losses = [value for part, _ in gathered for value in part]
        counts = [value for _, part in gathered for value in part]
    return losses, counts


def eval_perplexity(
    trainer: AdLoCoTrainer, dataset: datasets.Dataset, metric: evaluate.EvaluationModule | None
) -> dict[str, float] | None:
    """Token-weighted perplexity through the `evaluate` metric. Collective: every worker calls it, and those given a
    metric (the main process) get `{"perplexity", "loss"}`."""
    losses, counts = batch_losses(trainer, dataset)
    return None if metric is None else metric.compute(losses=losses, num_tokens=counts)


def main(argv: list[str] | None = None) -> None:
    script_args, training_args = parse_args(argv)
    # Building AdLoCoConfig initialised the process group, so the data below is prepared by rank 0 first.
    setup_logging(training_args)
    checkpoint = training_args.resume_from_checkpoint
    if checkpoint is not None and checkpoint.lower() != "auto":
        check_checkpoint_path(checkpoint, training_args.output_dir)  # before the data: a wrong path fails in seconds
    is_main = training_args.process_index == 0

    # ---- model & tokenizer ----
    tokenizer = AutoTokenizer.from_pretrained(script_args.model_name_or_path)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    model = build_model(script_args.model_name_or_path, vocab_size=len(tokenizer), seed=training_args.seed)
    max_positions = getattr(model.config, "max_position_embeddings", None) or 128
    block_size = script_args.block_size or min(128, max_positions)
    if block_size > max_positions:
        raise ValueError(f"block_size={block_size} exceeds the model's max_position_embeddings={max_positions}")

    # ---- dataset ----
    # The main process reads (or streams) the documents into the datasets cache and tokenises them first (the
    # tokenisation's cache files sit beside the documents'); the others then reuse both.
    with training_args.main_process_first(desc="loading and tokenising the corpus"):
        texts = load_documents(script_args)
        lm_datasets = build_lm_datasets(
            texts,
            tokenizer,
            block_size=block_size,
            eval_fraction=script_args.eval_fraction,
            max_eval_documents=script_args.max_eval_documents,
            cache_dir=script_args.cache_dir,
        )
    logger.info("data %s: %s", data_label(script_args), lm_dataset_stats(lm_datasets))

    # ---- training ----
    trainer = AdLoCoTrainer(
        model=model,
        args=training_args,
        train_dataset=lm_datasets["train"],
        eval_dataset=lm_datasets["eval"] if training_args.eval_strategy != "no" else None,
        processing_class=tokenizer,
        data_collator=default_data_collator,
    )
    metric = evaluate.load(PERPLEXITY_METRIC, keep_in_memory=True) if is_main else None
    before = eval_perplexity(trainer, lm_datasets["eval"], metric)
    # merged/'s card names the data and shows the perplexity before fine-tuning beside the one after (the model it
    # started from is the model's own: its Hub id, or the local folder in the card on disk).
    trainer.card_details.dataset = data_label(script_args)
    if is_main:
        trainer.card_details.metrics_before = {"perplexity": before["perplexity"], "loss": before["loss"]}
    trainer.train(resume_from_checkpoint=training_args.resume_from_checkpoint)
    if trainer.ended_run is not None:  # the run had finished: its results and merged/ stay as they were
        trainer.end()
        return
    # Training ends with the merged model on every worker, also saved to `{output_dir}/merged/`.
    after = eval_perplexity(trainer, lm_datasets["eval"], metric)
    if is_main:  # the same eval set as `before`, measured the same way: the card's "after" (rank 0 writes it)
        trainer.record_merged_metrics(
            {"eval_merged_perplexity": after["perplexity"], "eval_merged_loss": after["loss"]}
        )

    # ---- save & push ----
    trainer.save_state()
    if training_args.push_to_hub:
        trainer.push_merged_to_hub()
    trainer.end()  # every worker leaves the process group together
    if is_main:
        results = {
            "perplexity_before": before["perplexity"],
            "perplexity_after": after["perplexity"],
            "eval_loss_before": before["loss"],
            "eval_loss_after": after["loss"],
            "eval_blocks": len(lm_datasets["eval"]),
            "model": os.path.join(training_args.output_dir, "merged"),
        }
        with open(os.path.join(training_args.output_dir, RESULTS_FILE), "w", encoding="utf-8") as f:
            json.dump(results, f, indent=2)
            f.write("\n")
        change = 100 * (after["perplexity"] / before["perplexity"] - 1) if math.isfinite(before["perplexity"]) else 0
        print(
            f"eval perplexity: {before['perplexity']:.2f} before -> {after['perplexity']:.2f} after ({change:+.1f}%)\n"
            f"fine-tuned model: {results['model']}"
        )


if __name__ == "__main__":
    main()
