r"""Pretrain a causal language model with AdLoCo: adaptive batches, several instances that merge, DiLoCo rounds.

Every process of `accelerate launch` is one worker. A YAML file gives the arguments (`--config`), the command line
overrides any of them (`--max_steps 400`), and `--help` lists them all: this script's (below) and every field of
`AdLoCoConfig` / `TrainingArguments`.

    # The demo: tiny Llama, built-in offline corpus, 4 CPU workers, 4 instances that merge (under 5 minutes).
    accelerate launch --config_file accelerate_configs/cpu_4_workers.yaml \
        recipes/pretrain_c4.py --config recipes/configs/demo.yaml

    # The paper's setting: MicroLlama from keeeeenw/MicroLlama on C4, 4 workers sharing one GPU (gloo).
    CUDA_VISIBLE_DEVICES=0 accelerate launch --config_file accelerate_configs/one_gpu_4_workers.yaml \
        recipes/pretrain_c4.py --config recipes/configs/paper.yaml

    # MicroLlama's architecture from scratch on C4, one worker per GPU (NCCL).
    accelerate launch --config_file accelerate_configs/multi_gpu.yaml \
        recipes/pretrain_c4.py --config recipes/configs/c4_microllama.yaml

    # Any argument on the command line wins over the YAML file.
    accelerate launch --config_file accelerate_configs/cpu_4_workers.yaml \
        recipes/pretrain_c4.py --config recipes/configs/demo.yaml --max_steps 40 --output_dir outputs/short

    # Stream all of C4 (no document limit): each worker reads its own C4 files, tokenised and packed on the fly.
    accelerate launch --config_file accelerate_configs/multi_gpu.yaml \
        recipes/pretrain_c4.py --config recipes/configs/c4_streaming.yaml

    # Resume the last checkpoint of output_dir (same number of workers).
    accelerate launch --config_file accelerate_configs/cpu_4_workers.yaml \
        recipes/pretrain_c4.py --config recipes/configs/demo.yaml --resume_from_checkpoint last

    # Restart by itself after a worker dies (up to 3 times), each time from the newest intact checkpoint, if any.
    accelerate launch --config_file accelerate_configs/cpu_4_workers.yaml --max_restarts 3 \
        recipes/pretrain_c4.py --config recipes/configs/demo.yaml --resume_from_checkpoint auto

On a machine without a GPU the script sets `use_cpu=True` itself (with a MULTI_GPU launch config this gives a gloo
group of CPU workers). With `ADLOCO_EXPECT_WORLD_SIZE=N` in the environment, every worker checks that the launch
really started N workers. Outputs in `output_dir`: `adloco_rounds.jsonl`, `adloco_eval.jsonl`, `merges/outer-N/`,
`merged/` (the final model, with its tokenizer and model card) and `adloco_run.png`.
"""

import logging
import os
from dataclasses import dataclass, field

import torch
from transformers import HfArgumentParser, default_data_collator

from adloco_hf import AdLoCoConfig, AdLoCoTrainer
from adloco_hf.cli import parse_args_with_yaml, recipe_parser, setup_logging
from adloco_hf.data import (
    BUILTIN_CORPUS,
    BUILTIN_SOURCE_CORPUS,
    build_lm_datasets,
    build_lm_stream,
    lm_dataset_stats,
    load_document_stream,
    load_or_train_tokenizer,
    load_text_corpus,
)
from adloco_hf.inspection import (
    PLOT_FILE,
    check_checkpoint_path,
    checkpoints_newest_first,
    format_summary,
    summarize_run,
)
from adloco_hf.presets import MODEL_PRESETS, build_model


logger = logging.getLogger("pretrain_c4")

EXPECT_WORLD_SIZE_ENV = "ADLOCO_EXPECT_WORLD_SIZE"


@dataclass
class ScriptArguments:
    """Model and data of the run; everything about training is in `AdLoCoConfig`."""

    model_name_or_path: str = field(
        default="tiny",
        metadata={
            "help": f"A preset trained from scratch ({', '.join(MODEL_PRESETS)}) or a folder / Hub id to start from "
            "(e.g. keeeeenw/MicroLlama, outputs/demo/merged)."
        },
    )
    dataset_name: str = field(
        default=BUILTIN_CORPUS,
        metadata={
            "help": f"{BUILTIN_CORPUS} (offline, 0.4M tokens), {BUILTIN_SOURCE_CORPUS} (offline, 31M tokens: the "
            "pinned packages' source), allenai/c4 (streamed; needs num_documents), a local .jsonl/.txt file or "
            "folder, or a Hub dataset id."
        },
    )
    dataset_files: list[str] | None = field(
        default=None,
        metadata={"help": "Local data files: JSON-lines in C4's schema for allenai/c4, or a Hub dataset's files."},
    )
    text_column: str = field(default="text", metadata={"help": "Column holding the documents."})
    num_documents: int | None = field(
        default=None, metadata={"help": "Take the first N documents (required for allenai/c4; default: all)."}
    )
    tokenizer_name_or_path: str | None = field(
        default=None,
        metadata={
            "help": "Tokenizer folder / Hub id. Default: the model's own for a pretrained model, else a byte-level "
            "BPE trained on the corpus (cached under cache_dir)."
        },
    )
    tokenizer_vocab_size: int = field(default=4096, metadata={"help": "Vocabulary size of a trained tokenizer."})
    block_size: int = field(default=128, metadata={"help": "Tokens per training sequence (documents are packed)."})
    eval_fraction: float = field(
        default=0.05,
        metadata={
            "help": f"Share of the documents held out for evaluation ({BUILTIN_SOURCE_CORPUS} has its own split)."
        },
    )
    max_eval_documents: int | None = field(default=None, metadata={"help": "Upper bound on the eval documents."})
    cache_dir: str = field(
        default="outputs/cache", metadata={"help": "Where trained tokenizers and packed datasets are cached."}
    )
    preprocessing_num_workers: int | None = field(
        default=None, metadata={"help": "Processes for tokenisation and packing (datasets.map num_proc)."}
    )
    streaming: bool = field(
        default=False,
        metadata={
            "help": "Stream the training documents (allenai/c4, local files, Hub datasets) instead of materialising "
            "them: no document limit, each worker reads its own files, tokenised and packed on the fly, and a "
            "resumed run continues each worker's stream exactly. Evaluation uses the first eval_documents documents."
        },
    )
    eval_documents: int = field(
        default=500, metadata={"help": "With --streaming: documents held out of training for evaluation."}
    )
    tokenizer_documents: int = field(
        default=10_000,
        metadata={"help": "With --streaming: the first N documents a trained tokenizer learns from (cached)."},
    )


def check_world_size(training_args: AdLoCoConfig) -> None:
    """Fail fast when the launch did not start the expected number of workers (see the module docstring)."""
    expected = os.environ.get(EXPECT_WORLD_SIZE_ENV)
    if expected is not None and training_args.world_size != int(expected):
        raise RuntimeError(
            f"rank {training_args.process_index}: this launch has {training_args.world_size} worker(s) but "
            f"{EXPECT_WORLD_SIZE_ENV}={expected}. On a machine without a GPU launch with a MULTI_GPU config or "
            "`--multi_gpu --num_processes N` (not `--cpu`), and keep use_cpu=True."
        )


def resolve_checkpoint(training_args: AdLoCoConfig) -> str | bool | None:
    """`--resume_from_checkpoint last` (or `true`): the newest intact checkpoint of output_dir, an error when there is
    none; `auto`: the same, or a fresh start when there is none (what a script restarted by `--max_restarts` wants);
    a path: that checkpoint. The trainer verifies it and skips a damaged newest one (`checkpoint/manifest.py`)."""
    checkpoint = training_args.resume_from_checkpoint
    if checkpoint is not None and checkpoint.lower() in ("last", "true"):
        if not checkpoints_newest_first(training_args.output_dir):
            raise ValueError(
                f"--resume_from_checkpoint last: no checkpoint-* folder in {training_args.output_dir} (use "
                "--resume_from_checkpoint auto to start afresh when there is none)"
            )
        return True
    if checkpoint is not None and checkpoint.lower() != "auto":
        check_checkpoint_path(checkpoint, training_args.output_dir)  # a path that does not exist
    return checkpoint


def streamed_datasets(script_args: ScriptArguments, tokenizer, world_size: int):
    """`--streaming`: the training stream (`PackedStream`, read by each worker in its part) and a map-style eval set
    of the stream's first `eval_documents` documents, held out of training."""
    documents = load_document_stream(
        script_args.dataset_name, data_files=script_args.dataset_files, text_column=script_args.text_column
    )
    train, eval_blocks = build_lm_stream(
        documents,
        tokenizer,
        block_size=script_args.block_size,
        eval_documents=script_args.eval_documents,
        num_proc=script_args.preprocessing_num_workers,
    )
    layout = "shards" if documents.num_shards >= world_size else "stride"
    logger.info(
        "data %s, streamed: %d shard(s), %d worker(s), layout %s; eval %s",
        script_args.dataset_name,
        documents.num_shards,
        world_size,
        layout,
        lm_dataset_stats({"eval": eval_blocks}),
    )
    return train, eval_blocks


def build_parser() -> HfArgumentParser:
    """The recipe's command line: `ScriptArguments` and every field of `AdLoCoConfig` (and `--config FILE.yaml`, added
    by `parse_args_with_yaml`); `--help` starts with this module's docstring, then AdLoCo's options."""
    return recipe_parser(ScriptArguments, __doc__)


def parse_args(argv: list[str] | None = None) -> tuple[ScriptArguments, AdLoCoConfig]:
    """The command line (`None`: `sys.argv[1:]`) as the script's dataclasses, with defaults from `--config`."""
    # Without a GPU the workers need use_cpu=True for a gloo group (else each one sees a world of 1).
    defaults = {} if torch.cuda.is_available() else {"use_cpu": True}
    return parse_args_with_yaml(build_parser(), argv, defaults=defaults)


def main(argv: list[str] | None = None) -> None:
    script_args, training_args = parse_args(argv)
    # Building AdLoCoConfig initialised the process group, so the data below is prepared by rank 0 first.
    setup_logging(training_args)
    check_world_size(training_args)
    resume_from_checkpoint = resolve_checkpoint(training_args)  # before the data: a wrong path fails in seconds
    is_main = training_args.process_index == 0
    logger.info(
        "%d worker(s) on %s, backend %s", training_args.world_size, training_args.device, training_args.ddp_backend
    )

    # ---- model & tokenizer (a trained tokenizer learns from the corpus, so the documents are read first) ----
    is_preset = script_args.model_name_or_path in MODEL_PRESETS
    tokenizer_source = script_args.tokenizer_name_or_path
    if tokenizer_source is None and not is_preset:
        tokenizer_source = script_args.model_name_or_path  # a pretrained model keeps its own vocabulary
    if script_args.streaming and script_args.num_documents is not None:
        raise ValueError(
            "num_documents limits a materialised corpus; with --streaming the training stream has no limit (stop "
            "with max_steps, or pass fewer --dataset_files): drop num_documents (--num_documents null)"
        )
    # The main process streams (C4) or reads the documents into the datasets cache and trains the tokenizer into
    # cache_dir first; the others then reuse both. Streaming, only a trained tokenizer's sample is read here (its
    # first tokenizer_documents documents).
    texts = None
    with training_args.main_process_first(desc="loading the corpus and the tokenizer"):
        if not script_args.streaming or tokenizer_source is None:
            texts = load_text_corpus(
                script_args.dataset_name,
                num_documents=script_args.tokenizer_documents if script_args.streaming else script_args.num_documents,
                data_files=script_args.dataset_files,
                text_column=script_args.text_column,
            )
        tokenizer = load_or_train_tokenizer(
            tokenizer_source, texts, vocab_size=script_args.tokenizer_vocab_size, cache_dir=script_args.cache_dir
        )
    overrides = None
    if is_preset:
        overrides = {
            "bos_token_id": tokenizer.bos_token_id,
            "eos_token_id": tokenizer.eos_token_id,
            "pad_token_id": tokenizer.pad_token_id,
            "max_position_embeddings": max(
                MODEL_PRESETS[script_args.model_name_or_path]["max_position_embeddings"], script_args.block_size
            ),
        }
    model = build_model(
        script_args.model_name_or_path, vocab_size=len(tokenizer), seed=training_args.seed, config_overrides=overrides
    )
    max_positions = getattr(model.config, "max_position_embeddings", None)
    if max_positions is not None and script_args.block_size > max_positions:
        raise ValueError(
            f"block_size={script_args.block_size} exceeds the model's max_position_embeddings={max_positions}; "
            "lower block_size"
        )
    logger.info(
        "model %s: %.1fM parameters, vocabulary %d",
        script_args.model_name_or_path,
        sum(p.numel() for p in model.parameters()) / 1e6,
        len(tokenizer),
    )

    # ---- dataset ----
    if script_args.streaming:
        train_dataset, eval_dataset = streamed_datasets(script_args, tokenizer, training_args.world_size)
    else:
        # The main process tokenises and packs into cache_dir first; the others load what it wrote.
        with training_args.main_process_first(desc="tokenising and packing"):
            lm_datasets = build_lm_datasets(
                texts,
                tokenizer,
                block_size=script_args.block_size,
                eval_fraction=script_args.eval_fraction,
                max_eval_documents=script_args.max_eval_documents,
                cache_dir=script_args.cache_dir,
                num_proc=script_args.preprocessing_num_workers,
            )
        logger.info("data %s: %s", script_args.dataset_name, lm_dataset_stats(lm_datasets))
        train_dataset, eval_dataset = lm_datasets["train"], lm_datasets["eval"]

    # ---- training ----
    trainer = AdLoCoTrainer(
        model=model,
        args=training_args,
        train_dataset=train_dataset,
        eval_dataset=eval_dataset if training_args.eval_strategy != "no" else None,
        processing_class=tokenizer,
        data_collator=default_data_collator,
    )
    # The cards name the data: local shards (in C4's schema) by their paths, else the dataset (a Hub id, a corpus).
    local = [path for path in script_args.dataset_files or [] if os.path.isfile(path)]
    trainer.card_details.dataset = ", ".join(local) or script_args.dataset_name
    result = trainer.train(resume_from_checkpoint=resume_from_checkpoint)
    trainer.log_metrics("train", result.metrics)
    trainer.save_metrics("train", result.metrics)
    trainer.save_state()

    # ---- save & push ----
    # `{output_dir}/merged/` (safetensors, tokenizer, model card) was written at the end of training (and pushed, by
    # a run that had ended already: resumed again, it trains nothing and keeps its files).
    if training_args.push_to_hub and trainer.ended_run is None:
        trainer.push_merged_to_hub()
    trainer.end()  # every worker leaves the process group together
    if is_main:
        logger.info("merged model: %s", os.path.join(training_args.output_dir, "merged"))
        print(format_summary(summarize_run(training_args.output_dir)))
        plot = os.path.join(training_args.output_dir, PLOT_FILE)
        if os.path.isfile(plot):  # drawn at the end of training, and shown in merged/'s card
            print(f"plot: {plot}")


if __name__ == "__main__":
    main()
