"""A checkpoint's manifest (`adloco_hf.checkpoint.manifest`) and the completeness of its per-worker state, without workers."""

import json
import logging
import os

import pytest
import torch

from adloco_hf.checkpoint.folders import check_rank_states, save_rank_state
from adloco_hf.checkpoint.manifest import (
    MANIFEST_NAME,
    CheckpointDamagedError,
    checkpoints_newest_first,
    file_crc32,
    newest_intact_checkpoint,
    record_own_files,
    resolve_checkpoint,
    verify_checkpoint,
    write_manifest,
)


def warnings_of(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and r.name.startswith("adloco_hf")]


def write(path, data: bytes) -> str:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(data)
    return str(path)


def make_checkpoint(folder, *, workers: int = 2, manifest: bool = True) -> str:
    """A staging checkpoint as `_save_checkpoint` leaves it: the Trainer's files, every worker's state, a manifest."""
    folder = str(folder)
    write(os.path.join(folder, "model.safetensors"), os.urandom(5000))
    write(os.path.join(folder, "trainer_state.json"), b'{"global_step": 10}')
    for rank in range(workers):
        path = save_rank_state(folder, rank, {"world_size": workers, "rank": rank, "w": torch.randn(100)})
        record_own_files(folder, rank, [path])
    if manifest:
        write_manifest(folder)
    return folder


def flip_a_byte(path) -> None:
    with open(path, "r+b") as f:
        f.seek(os.path.getsize(path) // 2)
        byte = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([byte[0] ^ 0xFF]))


# ---- writing the manifest ----
def test_the_manifest_lists_every_file_with_its_size_and_checksum(tmp_path):
    folder = make_checkpoint(tmp_path / "checkpoint-10")
    manifest = json.load(open(os.path.join(folder, "adloco", MANIFEST_NAME)))
    assert manifest["checksum"] == "crc32"
    assert sorted(manifest["files"]) == [
        "adloco/rank-0.pt", "adloco/rank-1.pt", "model.safetensors", "trainer_state.json",
    ]  # fmt: skip
    for relative, entry in manifest["files"].items():
        path = os.path.join(folder, relative)
        assert entry == {"size": os.path.getsize(path), "crc32": file_crc32(path)}
    assert sorted(os.listdir(os.path.join(folder, "adloco"))) == [MANIFEST_NAME, "rank-0.pt", "rank-1.pt"]
    assert verify_checkpoint(folder) is True


def test_a_workers_sum_is_used_only_while_its_file_keeps_its_size(tmp_path):
    folder = str(tmp_path / "checkpoint-5")
    path = write(os.path.join(folder, "adloco", "rank-0.pt"), b"abc")
    record_own_files(folder, 0, [path])
    sums = os.path.join(folder, "adloco", "sums-rank-0.json")
    json.dump({"adloco/rank-0.pt": {"size": 3, "crc32": "00000000"}}, open(sums, "w"))  # trusted as given
    write(os.path.join(folder, "adloco", "rank-1.pt"), b"xyz")
    json.dump({"adloco/rank-1.pt": {"size": 99, "crc32": "00000000"}}, open(sums.replace("0.json", "1.json"), "w"))
    files = write_manifest(folder)["files"]
    assert files["adloco/rank-0.pt"]["crc32"] == "00000000"
    assert files["adloco/rank-1.pt"] == {"size": 3, "crc32": file_crc32(os.path.join(folder, "adloco", "rank-1.pt"))}


def test_file_crc32_is_zlibs_over_the_whole_file(tmp_path):
    import zlib

    data = os.urandom(9 * 1024 * 1024 + 17)  # more than two chunks
    assert file_crc32(write(tmp_path / "f", data)) == f"{zlib.crc32(data):08x}"


# ---- verifying it ----
@pytest.mark.parametrize(
    ("damage", "file", "words"),
    [
        ("truncate", "model.safetensors", "has 2500 bytes but 5000 were written"),
        ("truncate", "adloco/rank-1.pt", "bytes but"),
        ("delete", "adloco/rank-1.pt", "is missing (it was written with"),
        ("flip", "model.safetensors", "was altered after it was written (CRC-32"),
        ("flip", "adloco/rank-0.pt", "was altered after it was written"),
    ],
)
def test_a_damaged_file_is_named(tmp_path, damage, file, words):
    folder = make_checkpoint(tmp_path / "checkpoint-10")
    path = os.path.join(folder, *file.split("/"))
    if damage == "truncate":
        with open(path, "r+b") as f:
            f.truncate(os.path.getsize(path) // 2)
    elif damage == "delete":
        os.remove(path)
    else:
        flip_a_byte(path)
    with pytest.raises(CheckpointDamagedError) as error:
        verify_checkpoint(folder)
    message = str(error.value)
    assert f"{path} " in message and words in message
    assert "resume from an earlier one" in message
    assert isinstance(error.value, ValueError)


def test_every_missing_or_truncated_file_is_named_at_once(tmp_path):
    folder = make_checkpoint(tmp_path / "checkpoint-10")
    os.remove(os.path.join(folder, "adloco", "rank-0.pt"))
    os.remove(os.path.join(folder, "adloco", "rank-1.pt"))
    with pytest.raises(CheckpointDamagedError, match="rank-0.pt is missing.*rank-1.pt is missing"):
        verify_checkpoint(folder)


def test_an_unreadable_manifest_is_named(tmp_path):
    folder = make_checkpoint(tmp_path / "checkpoint-10")
    manifest = os.path.join(folder, "adloco", MANIFEST_NAME)
    with open(manifest, "r+b") as f:
        f.truncate(10)
    with pytest.raises(CheckpointDamagedError, match=f"{manifest} is unreadable"):
        verify_checkpoint(folder)


def test_a_checkpoint_without_a_manifest_loads_with_a_warning(tmp_path, records):
    folder = make_checkpoint(tmp_path / "checkpoint-10", manifest=False)
    assert verify_checkpoint(folder) is False
    assert any("cannot be verified" in message and folder in message for message in warnings_of(records))


# ---- resume_from_checkpoint=True ----
def test_resume_true_takes_the_newest_intact_checkpoint_and_names_the_skipped_one(tmp_path, records):
    out = tmp_path / "out"
    for step in (5, 10, 20):
        make_checkpoint(out / f"checkpoint-{step}")
    os.makedirs(out / ".tmp-checkpoint-30")  # an interrupted save, never a candidate
    (out / "checkpoint-x").mkdir()
    assert checkpoints_newest_first(str(out)) == [str(out / f"checkpoint-{s}") for s in (20, 10, 5)]
    assert newest_intact_checkpoint(str(out)) == str(out / "checkpoint-20")

    with open(out / "checkpoint-20" / "model.safetensors", "r+b") as f:
        f.truncate(100)
    records.clear()
    assert resolve_checkpoint(True, str(out)) == str(out / "checkpoint-10")
    skipped = [m for m in warnings_of(records) if "skipped" in m]
    assert len(skipped) == 1 and str(out / "checkpoint-20") in skipped[0] and "model.safetensors" in skipped[0]
    assert any("resuming from" in m and str(out / "checkpoint-10") in m for m in warnings_of(records))


def test_resume_true_with_every_checkpoint_damaged_or_none(tmp_path):
    out = tmp_path / "out"
    assert newest_intact_checkpoint(str(out)) is None  # no folder: the Trainer's own error follows
    assert resolve_checkpoint(True, str(out)) is True
    make_checkpoint(out / "checkpoint-10")
    os.remove(out / "checkpoint-10" / "trainer_state.json")
    with pytest.raises(CheckpointDamagedError, match="no intact checkpoint in .*checkpoint-10"):
        newest_intact_checkpoint(str(out))


def test_resume_auto_takes_the_newest_intact_checkpoint_or_starts_afresh(tmp_path, records):
    out = tmp_path / "out"
    assert resolve_checkpoint("auto", str(out)) is None  # no folder yet: a fresh start, not an error
    out.mkdir()
    assert resolve_checkpoint("AUTO", str(out)) is None
    for step in (10, 20):
        make_checkpoint(out / f"checkpoint-{step}")
    assert resolve_checkpoint("auto", str(out)) == str(out / "checkpoint-20")
    os.remove(out / "checkpoint-20" / "trainer_state.json")
    records.clear()
    assert resolve_checkpoint("auto", str(out)) == str(out / "checkpoint-10")  # the damaged newest one skipped
    assert any("skipped" in m and str(out / "checkpoint-20") in m for m in warnings_of(records))


def test_an_explicit_checkpoint_is_verified_and_other_values_pass_through(tmp_path):
    folder = make_checkpoint(tmp_path / "checkpoint-10")
    assert resolve_checkpoint(folder, str(tmp_path)) == folder
    assert resolve_checkpoint(None, str(tmp_path)) is None
    assert resolve_checkpoint(False, str(tmp_path)) is False
    os.remove(os.path.join(folder, "model.safetensors"))
    with pytest.raises(CheckpointDamagedError, match="model.safetensors is missing"):
        resolve_checkpoint(folder, str(tmp_path))


def test_a_checkpoint_that_does_not_exist_is_named_with_the_ones_that_do(tmp_path):
    """It was diagnosed as a folder "not written by AdLoCoTrainer", to start afresh from its weights (issue 41)."""
    out = tmp_path / "out"
    with pytest.raises(FileNotFoundError) as error:
        resolve_checkpoint(str(tmp_path / "x" / "does-not-exist"), str(out))
    message = str(error.value)
    assert message.startswith(f"resume_from_checkpoint={str(tmp_path / 'x' / 'does-not-exist')!r} does not exist.")
    assert f"No checkpoint-* folder exists in {out}" in message and "not written by" not in message
    for step in (5, 10):
        make_checkpoint(out / f"checkpoint-{step}")
    with pytest.raises(FileNotFoundError) as error:
        resolve_checkpoint(str(out / "checkpoint-15"), str(out))
    assert f"Checkpoints that exist: {out}: checkpoint-5, checkpoint-10" in str(error.value), str(error.value)
    with pytest.raises(FileNotFoundError, match=f"{tmp_path / 'elsewhere'}: checkpoint-7"):  # beside the path too
        make_checkpoint(tmp_path / "elsewhere" / "checkpoint-7")
        resolve_checkpoint(str(tmp_path / "elsewhere" / "checkpoint-8"), str(out))
    # A run's output_dir in place of one of its checkpoints.
    with pytest.raises(
        ValueError, match=r"is a run's output_dir, not a checkpoint: .*\(checkpoint-5, checkpoint-10\)"
    ):
        resolve_checkpoint(str(out), str(out))


# ---- every worker's state, with or without a manifest ----
@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_a_missing_worker_state_gives_one_message_whatever_the_world_size(tmp_path, world_size):
    folder = make_checkpoint(tmp_path / "checkpoint-10", manifest=False)  # written before manifests
    os.remove(os.path.join(folder, "adloco", "rank-1.pt"))
    with pytest.raises(ValueError) as error:
        check_rank_states(folder, world_size)
    assert str(error.value) == (
        f"{folder} was written by 2 workers but adloco/rank-1.pt is missing: every worker's state is needed, this "
        "checkpoint cannot be resumed; resume from an earlier one"
    )


def test_a_missing_rank_0_state_is_found_from_the_other_files(tmp_path):
    folder = make_checkpoint(tmp_path / "checkpoint-10", manifest=False)
    os.remove(os.path.join(folder, "adloco", "rank-0.pt"))
    with pytest.raises(ValueError, match="written by 2 workers but adloco/rank-0.pt is missing"):
        check_rank_states(folder, 1)


def test_a_complete_checkpoint_of_another_world_size_reports_how_many_wrote_it(tmp_path):
    folder = make_checkpoint(tmp_path / "checkpoint-10", workers=2)
    assert check_rank_states(folder, 2) == 2
    assert check_rank_states(folder, 3) == 2  # an elastic resume (`elastic.py`), not refused here
