"""What a resume checks before training, with real workers: the run's settings, and every file of the checkpoint.

One stopped run (checkpoints at steps 10 and 20, stopped at step 22) is shared by the tests; each works on copies.
"""

import json
import os
import shutil

import pytest
from helpers import RESUME_CONFIG, SCRIPTS, launch, merged_params


pytestmark = pytest.mark.multiprocess

WORKER = os.path.join(SCRIPTS, "adloco_worker.py")
RESUME_WORKER = os.path.join(SCRIPTS, "resume_worker.py")

# 2 workers, 2 instances merging at round 4, growing batches, attention dropout: what an exact resume must restore.
CONFIG = RESUME_CONFIG
DROPOUT = 0.1  # as the session's `resume_reference` run


def spec_for(out, probe, **extra):
    config = {"output_dir": out, **CONFIG}
    return {"output_dir": out, "world_size": 2, "probe_dir": probe, "config": config, "dropout": DROPOUT, **extra}


def run(spec, timeout=300):
    return launch(WORKER, json.dumps(spec), num_processes=2, timeout=timeout)


def truncate(path, keep=0.5):
    size = os.path.getsize(path)
    with open(path, "r+b") as f:
        f.truncate(int(size * keep))


@pytest.fixture(scope="module")
def stopped_run(tmp_path_factory):
    """A run stopped at step 22 (every worker gone), with checkpoint-10 and checkpoint-20 on disk."""
    root = tmp_path_factory.mktemp("stopped")
    out = str(root / "out")
    run(spec_for(out, str(root / "probe"), fail=["all", 22, 0]))
    assert {"checkpoint-10", "checkpoint-20"} <= set(os.listdir(out))
    assert not os.path.isdir(os.path.join(out, "merged"))
    return out


def try_resumes(tmp_path, attempts, timeout=300):
    """Every worker tries each attempt in turn (resume_worker.py); returns {name: [rank 0's result, rank 1's]}."""
    probe = str(tmp_path / "attempts")
    spec = {"world_size": 2, "probe_dir": probe, "attempts": attempts}
    output = launch(RESUME_WORKER, json.dumps(spec), num_processes=2, timeout=timeout)
    results = {}
    for item in attempts:
        results[item["name"]] = [
            json.load(open(os.path.join(probe, f"{item['name']}-rank{rank}.json"))) for rank in range(2)
        ]
    return results, output.stdout + output.stderr


def attempt(tmp_path, name, checkpoint, model=None, **changes):
    out = str(tmp_path / name)
    item = {"name": name, "checkpoint": checkpoint, "config": {**CONFIG, "output_dir": out, **changes}}
    return {**item, "dropout": DROPOUT, **({"model": model} if model else {})}


@pytest.fixture(scope="module")
def resume_attempts(tmp_path_factory, stopped_run):
    """Every resume attempt of the two tests below, in one launch: (tmp folder, {name: results}, output)."""
    root = tmp_path_factory.mktemp("attempts")
    checkpoint = os.path.join(stopped_run, "checkpoint-10")

    def damaged(name, damage):
        copy = str(root / "checkpoints" / name)
        shutil.copytree(checkpoint, copy)
        damage(copy)
        return copy

    attempts = [
        attempt(root, "inner_steps", checkpoint, inner_steps=4, save_steps=8),
        attempt(root, "num_instances", checkpoint, num_instances=1),
        # Two heads of 16 instead of four of 8, one key/value head instead of two: every tensor keeps its shape.
        attempt(root, "heads", checkpoint, model={"num_attention_heads": 2, "num_key_value_heads": 1}),
        # Safe to change: the learning rate (warned: the checkpoint's schedule goes on) and the save cadence.
        attempt(root, "learning_rate", checkpoint, learning_rate=1e-2, save_steps=15),
        attempt(root, "model", damaged("model", lambda c: truncate(os.path.join(c, "model.safetensors")))),
        attempt(root, "deleted", damaged("deleted", lambda c: os.remove(os.path.join(c, "adloco", "rank-1.pt")))),
        # Last: before the manifest, rank 1 failed alone while rank 0 went on training (and waited for it).
        attempt(root, "rank", damaged("rank", lambda c: truncate(os.path.join(c, "adloco", "rank-1.pt")))),
    ]
    results, output = try_resumes(root, attempts)
    return root, results, output


def test_a_resume_with_changed_run_settings_is_refused_before_training(resume_attempts):
    root, results, output = resume_attempts
    expected = {
        "inner_steps": "inner_steps was 5 in the checkpoint, is 4 now",
        "num_instances": "num_instances was 2 in the checkpoint, is 1 now",
        "heads": "model config num_attention_heads was 4 in the checkpoint, is 2 now",
    }
    for name, text in expected.items():
        for result in results[name]:
            assert not result["accepted"], (name, result)
            assert result["value_error"] and text in result["message"], (name, result)
            assert "checkpoint-10" in result["message"]
        assert not os.path.exists(os.path.join(root, name, "adloco_rounds.jsonl"))  # refused before training
    assert "num_key_value_heads was 2 in the checkpoint, is 1 now" in results["heads"][0]["message"]

    assert all(result["accepted"] for result in results["learning_rate"]), results["learning_rate"]
    assert "learning_rate=0.01 differs from the checkpoint's 0.003" in output
    # This run's save_steps (15), not the checkpoint's (10) from trainer_state.json, decides where checkpoints land.
    names = os.listdir(root / "learning_rate")
    assert "checkpoint-15" in names and "checkpoint-30" in names and "checkpoint-20" not in names


def test_a_damaged_checkpoint_is_refused_with_an_error_naming_the_file(resume_attempts):
    root, results, _ = resume_attempts
    for name, file, problem in (
        ("model", "model.safetensors", "bytes but"),
        ("rank", os.path.join("adloco", "rank-1.pt"), "bytes but"),
        ("deleted", os.path.join("adloco", "rank-1.pt"), "is missing"),
    ):
        first, second = results[name]
        assert not first["accepted"] and first["value_error"], (name, first)
        assert first == second, (name, results[name])  # one message, the same on every worker
        path = os.path.join(root, "checkpoints", name, file)
        assert f"{path} " in first["message"] and problem in first["message"], (name, first)
        assert "resume with" not in first["message"]  # no advice to change the number of processes


def test_resume_true_skips_a_damaged_newest_checkpoint_and_ends_as_an_uninterrupted_run(
    tmp_path, stopped_run, resume_reference
):
    out = str(tmp_path / "out")
    shutil.copytree(stopped_run, out)
    truncate(os.path.join(out, "checkpoint-20", "model.safetensors"))
    result = run(spec_for(out, str(tmp_path / "p1"), resume=True))
    output = result.stdout + result.stderr
    assert f"skipped {os.path.join(out, 'checkpoint-20')}" in output, output[-3000:]
    assert "model.safetensors" in output

    assert (merged_params(out) - merged_params(resume_reference)).abs().max().item() <= 1e-6
