"""The recipes: YAML + command-line parsing, presets, the perplexity metric, and pretrain → fine-tune end to end."""

import importlib.util
import json
import math
import os
import random
import subprocess
import sys
from pathlib import Path

import evaluate
import pytest
import torch
from helpers import CONTRACT_ROUND_KEYS as ROUND_KEYS
from helpers import launch, write_c4_shards
from transformers import AutoModelForCausalLM, AutoTokenizer, HfArgumentParser

from adloco_hf import AdLoCoConfig
from adloco_hf.cli import load_yaml_defaults, parse_args_with_yaml
from adloco_hf.presets import build_model


ROOT = Path(__file__).resolve().parents[2]
RECIPES = ROOT / "recipes"
CONFIGS = RECIPES / "configs"
FIXTURE = ROOT / "tests" / "fixtures" / "pretrain_tiny.yaml"
STREAMING_FIXTURE = ROOT / "tests" / "fixtures" / "pretrain_tiny_streaming.yaml"
METRIC = ROOT / "adloco_hf" / "metrics" / "perplexity.py"
# Every file the subprocesses could write outside tmp_path (datasets cache, evaluate modules) goes under it instead.
HERMETIC_ENV = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}


def load_recipe(name: str):
    spec = importlib.util.spec_from_file_location(f"recipe_{name}", RECIPES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def pretrain():
    return load_recipe("pretrain_c4")


def write_yaml(path: Path, text: str) -> str:
    path.write_text(text)
    return str(path)


# ---- (a) YAML + command line ----


def test_yaml_values_are_used(pretrain, tmp_path):
    config = write_yaml(
        tmp_path / "run.yaml",
        "model_name_or_path: tiny\n"
        "dataset_files: [a.jsonl, b.jsonl]\n"
        "block_size: 64\n"
        "max_steps: 40\n"
        "inner_steps: 20\n"
        "learning_rate: 2e-5\n"  # YAML 1.1 reads this as a string: converted by the argument's type
        "num_instances: 2\n"
        "max_batch_size: 8\n"
        "report_to: none\n",
    )
    parser = HfArgumentParser((pretrain.ScriptArguments, AdLoCoConfig))
    script_args, args = parse_args_with_yaml(parser, ["--config", config, "--output_dir", str(tmp_path / "out")])
    assert script_args.model_name_or_path == "tiny"
    assert script_args.dataset_files == ["a.jsonl", "b.jsonl"]
    assert script_args.block_size == 64
    # num_instances as the file sets it (this one process trains 1 of them: config/launch.py).
    assert (args.max_steps, args.inner_steps, args.num_instances_asked, args.max_batch_size) == (40, 20, 2, 8)
    assert args.learning_rate == 2e-5 and isinstance(args.learning_rate, float)
    assert args.eval_steps == 20  # AdLoCoConfig's own default still applies to what the file does not set
    assert script_args.tokenizer_vocab_size == 4096


def test_command_line_overrides_yaml_and_yaml_overrides_script_defaults(pretrain, tmp_path):
    config = write_yaml(tmp_path / "run.yaml", "max_steps: 40\ninner_steps: 20\nblock_size: 64\nuse_cpu: false\n")
    parser = HfArgumentParser((pretrain.ScriptArguments, AdLoCoConfig))
    argv = ["--config", config, "--max_steps", "60", "--block_size", "32", "--output_dir", str(tmp_path)]
    script_args, args = parse_args_with_yaml(parser, argv, defaults={"use_cpu": True, "inner_steps": 10})
    assert args.max_steps == 60 and script_args.block_size == 32  # command line > YAML
    assert args.inner_steps == 20 and args.use_cpu is False  # YAML > the script's defaults


def test_script_defaults_apply_without_yaml(pretrain, tmp_path):
    parser = HfArgumentParser((pretrain.ScriptArguments, AdLoCoConfig))
    argv = ["--max_steps", "10", "--inner_steps", "5", "--output_dir", str(tmp_path)]
    script_args, args = parse_args_with_yaml(parser, argv, defaults={"use_cpu": True})
    assert args.use_cpu is True
    assert script_args.model_name_or_path == "tiny"


def test_unknown_yaml_key_is_a_clear_error(pretrain, tmp_path):
    config = write_yaml(tmp_path / "typo.yaml", "max_steps: 40\nlearning_rat: 1e-3\n")
    parser = HfArgumentParser((pretrain.ScriptArguments, AdLoCoConfig))
    with pytest.raises(
        ValueError, match=r"typo\.yaml: unknown key\(s\) 'learning_rat' \(did you mean 'learning_rate'"
    ):
        parse_args_with_yaml(parser, ["--config", config])


def test_bad_yaml_value_and_non_mapping_are_clear_errors(pretrain, tmp_path):
    parser = HfArgumentParser((pretrain.ScriptArguments, AdLoCoConfig))
    bad = write_yaml(tmp_path / "bad.yaml", "max_steps: forty\n")
    with pytest.raises(ValueError, match="bad.yaml: max_steps: 'forty' is not a valid value"):
        load_yaml_defaults(parser, bad)
    listing = write_yaml(tmp_path / "list.yaml", "- max_steps\n")
    with pytest.raises(ValueError, match="must hold a mapping"):
        load_yaml_defaults(parser, listing)


def test_yaml_satisfies_required_arguments(tmp_path):
    finetune = load_recipe("finetune_clm")
    config = write_yaml(tmp_path / "ft.yaml", "model_name_or_path: some/model\ndataset_name: notes.jsonl\n")
    parser = HfArgumentParser((finetune.ScriptArguments, AdLoCoConfig))
    argv = ["--config", config, "--max_steps", "10", "--inner_steps", "5", "--output_dir", str(tmp_path)]
    script_args, _ = parse_args_with_yaml(parser, argv)
    assert (script_args.model_name_or_path, script_args.dataset_name) == ("some/model", "notes.jsonl")


def test_finetune_reads_local_files_without_a_dataset_name(tmp_path):
    """`--dataset_files a.jsonl b.txt` alone: the files in order (globs expanded), `--num_documents` over all of them;
    a missing file and no data at all are clear errors."""
    finetune = load_recipe("finetune_clm")
    (tmp_path / "a.jsonl").write_text("".join(json.dumps({"text": f"a{i}"}) + "\n" for i in range(3)))
    (tmp_path / "b.txt").write_text("b0\nb1\n")
    argv = ["--model_name_or_path", "m", "--output_dir", str(tmp_path / "out"), "--max_steps", "10"]
    script_args, _ = finetune.parse_args([*argv, "--inner_steps", "5", "--dataset_files", str(tmp_path / "a.jsonl")])
    assert script_args.dataset_name is None
    files = [str(tmp_path / "a.jsonl"), str(tmp_path / "b.*")]
    texts = finetune.load_documents(finetune.ScriptArguments(model_name_or_path="m", dataset_files=files))
    assert texts["text"] == ["a0", "a1", "a2", "b0", "b1"]
    first = finetune.ScriptArguments(model_name_or_path="m", dataset_files=files, num_documents=4)
    assert finetune.load_documents(first)["text"] == ["a0", "a1", "a2", "b0"]
    missing = finetune.ScriptArguments(model_name_or_path="m", dataset_files=[str(tmp_path / "none.jsonl")])
    with pytest.raises(FileNotFoundError, match="none.jsonl: no such file"):
        finetune.load_documents(missing)
    with pytest.raises(SystemExit):
        finetune.parse_args([*argv, "--inner_steps", "5"])


@pytest.mark.parametrize("name", ["demo", "paper", "c4_microllama", "c4_streaming"])
def test_shipped_configs_parse_and_start_with_their_launch_command(pretrain, name):
    path = CONFIGS / f"{name}.yaml"
    first_line = path.read_text().splitlines()[0]
    assert first_line.startswith("# ") and "accelerate launch --config_file accelerate_configs/" in first_line
    assert first_line.endswith(f"recipes/pretrain_c4.py --config recipes/configs/{name}.yaml")
    values = load_yaml_defaults(HfArgumentParser((pretrain.ScriptArguments, AdLoCoConfig)), path)
    assert values["max_steps"] % values["inner_steps"] == 0
    assert values["dataloader_num_workers"] == 0


def test_paper_config_holds_the_papers_table(pretrain):
    values = load_yaml_defaults(HfArgumentParser((pretrain.ScriptArguments, AdLoCoConfig)), CONFIGS / "paper.yaml")
    expected = {
        "inner_steps": 200,
        "max_steps": 4000,
        "learning_rate": 2e-5,
        "outer_lr": 0.5,
        "outer_momentum": 0.0,
        "num_instances": 4,
        "per_device_train_batch_size": 1,
        "merge_every": 3,
        "eta": 0.8,
        "theta": 0.01,
        "nu": 0.3,
        "fp16": True,
        "weight_decay": 0.1,
        "model_name_or_path": "keeeeenw/MicroLlama",
        "dataset_name": "allenai/c4",
        "ddp_backend": "gloo",
    }
    assert {key: values[key] for key in expected} == expected


# ---- presets and the metric ----


def test_presets_are_seeded_llamas():
    first, again = build_model("tiny", vocab_size=300, seed=3), build_model("tiny", vocab_size=300, seed=3)
    other = build_model("tiny", vocab_size=300, seed=4)
    assert type(first).__name__ == "LlamaForCausalLM"
    assert (first.config.hidden_size, first.config.num_hidden_layers, first.config.vocab_size) == (64, 2, 300)
    assert all(torch.equal(a, b) for a, b in zip(first.parameters(), again.parameters()))
    assert not all(torch.equal(a, b) for a, b in zip(first.parameters(), other.parameters()))
    with pytest.raises(ValueError, match="vocab_size=len"):
        build_model("tiny", vocab_size=None, seed=0)
    with pytest.raises(ValueError, match="neither a preset"):
        build_model("./no/such/folder", vocab_size=None, seed=0)


def test_microllama_preset_has_the_papers_architecture():
    with torch.device("meta"):
        model = build_model("microllama", vocab_size=None, seed=0)
    config = model.config
    assert (config.hidden_size, config.intermediate_size, config.num_hidden_layers) == (1024, 5632, 12)
    assert (config.num_attention_heads, config.num_key_value_heads) == (16, 4)
    assert (config.max_position_embeddings, config.vocab_size) == (2048, 32000)


def test_saved_model_loads_in_float32(tmp_path):
    build_model("tiny", vocab_size=300, seed=0, dtype=torch.bfloat16).save_pretrained(tmp_path)
    assert build_model(str(tmp_path), vocab_size=300, seed=0).dtype == torch.float32
    assert build_model(str(tmp_path), vocab_size=300, seed=0, dtype="auto").dtype == torch.bfloat16


def test_perplexity_metric_loads_offline_and_weights_by_tokens(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    metric = evaluate.load(str(METRIC), cache_dir=str(tmp_path))
    result = metric.compute(losses=[2.0, 1.0], num_tokens=[100, 300])
    assert result["loss"] == pytest.approx(1.25)
    assert result["perplexity"] == pytest.approx(math.exp(1.25))
    metric.add_batch(losses=[2.0], num_tokens=[100])
    metric.add_batch(losses=[1.0], num_tokens=[300])
    assert metric.compute()["perplexity"] == pytest.approx(math.exp(1.25))


# ---- (b) pretraining with 2 workers, (c) fine-tuning its merged model ----


@pytest.fixture(scope="module")
def pretrained_run(tmp_path_factory):
    """recipes/pretrain_c4.py on 2 CPU workers, 2 instances merging after round 2 (see the fixture config)."""
    tmp = tmp_path_factory.mktemp("pretrain")
    out = tmp / "out"
    env = HERMETIC_ENV | {
        "HF_HOME": str(tmp / "hf"),
        "MPLCONFIGDIR": str(tmp / "mpl"),
        "ADLOCO_EXPECT_WORLD_SIZE": "2",
    }
    result = launch(
        str(RECIPES / "pretrain_c4.py"),
        "--config",
        str(FIXTURE),
        "--output_dir",
        str(out),
        "--cache_dir",
        str(tmp / "cache"),
        num_processes=2,
        timeout=240,
        env=env,
    )
    return out, result.stdout + result.stderr


@pytest.mark.multiprocess
def test_pretrain_recipe_with_two_workers(pretrained_run):
    out, output = pretrained_run
    rounds = [json.loads(line) for line in (out / "adloco_rounds.jsonl").read_text().splitlines()]
    for line in rounds:
        assert ROUND_KEYS <= line.keys(), f"missing {sorted(ROUND_KEYS - line.keys())}"
    # Both workers trained (world size 2, also asserted inside each worker by ADLOCO_EXPECT_WORLD_SIZE).
    first = [line for line in rounds if line["outer_step"] == 1]
    assert sorted(rank for line in first for rank in line["workers"]) == [0, 1]
    assert [line["num_instances"] for line in rounds if line["outer_step"] == 2] == [1, 1]
    assert any(line["merged_from"] for line in rounds)
    assert max(line["outer_step"] for line in rounds) == 4
    assert max(line["next_batch_size"] for line in rounds) > 2  # the norm test grew the batch
    assert all(math.isfinite(line["train_loss"]) for line in rounds)

    merge = json.loads((out / "merges" / "outer-2" / "adloco_merge.json").read_text())
    assert sorted(merge["instances"]) == [0, 1] and sum(merge["weights"]) == pytest.approx(1.0)
    assert (out / "merges" / "outer-2" / "model.safetensors").is_file()

    merged = out / "merged"
    for name in ("model.safetensors", "config.json", "tokenizer.json", "README.md"):
        assert (merged / name).is_file(), f"merged/ lacks {name}"
    model = AutoModelForCausalLM.from_pretrained(merged)
    tokenizer = AutoTokenizer.from_pretrained(merged)
    assert model.config.vocab_size == len(tokenizer) == 512
    assert (out / "adloco_run.png").stat().st_size > 10_000
    # The card shows this run's plot (drawn by the library at the end of training) and names the corpus in its text.
    assert (merged / "adloco_run.png").read_bytes() == (out / "adloco_run.png").read_bytes()
    card = (merged / "README.md").read_text()
    assert "](adloco_run.png)" in card and "Trained on `builtin:python-docs`." in card
    assert "datasets:" not in card and "model-index" not in card  # the built-in corpus is no Hub dataset
    assert "AdLoCo run:" in output and "eval perplexity" in output
    assert "round 4 (step" in output  # the library's per-round line reaches the recipe's console on rank 0
    assert output.count("round 4 (step") == 1 and "{'adloco/" not in output and "Num Epochs" not in output


@pytest.mark.multiprocess
def test_pretrain_recipe_streams_local_shards(tmp_path):
    """`--streaming` through the same code path as all of C4: 4 local shards in C4's schema, 2 workers."""
    files, _ = write_c4_shards(tmp_path / "shards", 4, 30)
    out = tmp_path / "out"
    env = HERMETIC_ENV | {"HF_HOME": str(tmp_path / "hf"), "MPLCONFIGDIR": str(tmp_path / "mpl")}
    result = launch(
        str(RECIPES / "pretrain_c4.py"),
        "--config",
        str(STREAMING_FIXTURE),
        "--output_dir",
        str(out),
        "--cache_dir",
        str(tmp_path / "cache"),
        "--dataset_files",
        *files,
        num_processes=2,
        timeout=240,
        env=env | {"ADLOCO_EXPECT_WORLD_SIZE": "2"},
    )
    output = result.stdout + result.stderr
    assert "streamed: 4 shard(s), 2 worker(s), layout shards" in output
    rounds = [json.loads(line) for line in (out / "adloco_rounds.jsonl").read_text().splitlines()]
    for line in rounds:
        assert ROUND_KEYS <= line.keys(), f"missing {sorted(ROUND_KEYS - line.keys())}"
    assert sorted(rank for line in rounds if line["outer_step"] == 1 for rank in line["workers"]) == [0, 1]
    assert max(line["outer_step"] for line in rounds) == 4 and any(line["merged_from"] for line in rounds)
    assert all(math.isfinite(line["train_loss"]) for line in rounds)
    evals = [json.loads(line) for line in (out / "adloco_eval.jsonl").read_text().splitlines()]
    assert evals and all(math.isfinite(value) for e in evals for key, value in e.items() if key.endswith("loss"))
    state = torch.load(out / "checkpoint-10" / "adloco" / "rank-1.pt", weights_only=True)
    assert state["sampler"]["kind"] == "stream" and state["sampler"]["stream"]["source"]["layout"] == "shards"
    model = AutoModelForCausalLM.from_pretrained(out / "merged")
    assert model.config.vocab_size == len(AutoTokenizer.from_pretrained(out / "merged"))


def write_notes(path: Path, documents: int = 80) -> None:
    """Short templated stories: far from Python's docs, so fine-tuning must lower the perplexity."""
    rng = random.Random(0)
    animals, places, foods = ["cat", "dog", "fox", "owl", "goat"], ["garden", "barn", "forest"], ["apples", "bread"]
    with open(path, "w") as f:
        for _ in range(documents):
            sentences = [
                f"The {rng.choice(animals)} in the {rng.choice(places)} eats {rng.choice(foods)} every morning."
                for _ in range(rng.randint(4, 8))
            ]
            f.write(json.dumps({"text": " ".join(sentences), "source": "notes"}) + "\n")


@pytest.mark.multiprocess
def test_a_checkpoint_that_does_not_exist_fails_before_the_data_is_built(tmp_path):
    """`--resume_from_checkpoint PATH` was checked in train(), after the corpus was read, the tokenizer trained and
    the data packed, and diagnosed as a folder "not written by AdLoCoTrainer" (issue 41)."""
    missing = tmp_path / "out" / "checkpoint-99"
    command = [
        sys.executable, str(RECIPES / "pretrain_c4.py"), "--config", str(FIXTURE), "--output_dir",
        str(tmp_path / "out"), "--cache_dir", str(tmp_path / "cache"), "--resume_from_checkpoint", str(missing),
    ]  # fmt: skip
    env = (
        os.environ | HERMETIC_ENV | {"HF_HOME": str(tmp_path / "hf"), "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    )
    result = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=240)
    assert result.returncode != 0
    assert f"FileNotFoundError: resume_from_checkpoint={str(missing)!r} does not exist" in result.stderr, result.stderr
    assert not (tmp_path / "cache").exists()  # no tokenizer trained, no data packed


def test_finetune_recipe_lowers_perplexity(pretrained_run, tmp_path):
    merged = pretrained_run[0] / "merged"
    notes = tmp_path / "notes.jsonl"
    write_notes(notes)
    out = tmp_path / "finetune"
    command = [
        sys.executable,
        str(RECIPES / "finetune_clm.py"),
        "--model_name_or_path",
        str(merged),
        "--dataset_name",
        str(notes),
        "--output_dir",
        str(out),
        "--block_size",
        "64",
        "--max_steps",
        "20",
        "--inner_steps",
        "10",
        "--learning_rate",
        "3e-3",
        "--per_device_train_batch_size",
        "4",
        "--max_batch_size",
        "8",
        "--save_strategy",
        "no",
        "--report_to",
        "none",
        "--disable_tqdm",
        "true",
    ]
    env = os.environ | HERMETIC_ENV | {"HF_HOME": str(tmp_path / "hf"), "OMP_NUM_THREADS": "2"}
    try:
        result = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    except subprocess.TimeoutExpired as error:
        raise AssertionError(f"finetune_clm.py did not finish in 120 s:\n{error.stdout}\n{error.stderr}") from error
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-6000:]

    results = json.loads((out / "finetune_results.json").read_text())
    before, after = results["perplexity_before"], results["perplexity_after"]
    evals = [json.loads(line) for line in open(out / "adloco_eval.jsonl")]  # every round's evaluation, and merged/'s
    assert [(e["global_step"], e["instance"]) for e in evals] == [(10, 0), (20, 0), (20, "merged")], evals
    assert math.isfinite(before) and math.isfinite(after)
    assert after < before, results
    assert (out / "merged" / "model.safetensors").is_file()
    # The card: the perplexity before fine-tuning beside the one after, the model it started from, the data.
    card = (out / "merged" / "README.md").read_text()
    assert f"| perplexity | {before:.6g} | {after:.6g} |" in card, card
    assert f"Training started from `{merged}`." in card and f"Trained on `{notes}`." in card
    assert "base_model" not in card.split("---")[1]  # a local folder, no Hub repo
    assert AutoModelForCausalLM.from_pretrained(out / "merged").config.vocab_size == 512
