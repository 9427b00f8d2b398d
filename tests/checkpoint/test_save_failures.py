"""Saves that fail: a full disk, an fsync error, and what interrupted saves leave behind."""

import errno
import json
import os
import re
import stat

import pytest
from helpers import SCRIPTS, launch, launch_failing, root_cause, sequence_dataset, tiny_model

from adloco_hf import AdLoCoConfig, AdLoCoTrainer
from adloco_hf.common.files import atomic_directory, publish_checkpoint


WORKER = os.path.join(SCRIPTS, "adloco_worker.py")

CONFIG = dict(
    max_steps=30, inner_steps=5, save_steps=10, num_instances=1, per_device_train_batch_size=2, max_batch_size=4,
    seed=3, optim="adamw_torch", learning_rate=3e-3, worker_timeout=10,
)  # fmt: skip


def spec_for(out, probe, config=None, **extra):
    return {
        "output_dir": out,
        "world_size": 2,
        "probe_dir": probe,
        "config": {"output_dir": out, **(config or CONFIG)},
        "probes": False,
        **extra,
    }


def launch_spec(spec, timeout=240):
    return launch(WORKER, json.dumps(spec), num_processes=2, timeout=timeout)


def check_full_disk(output: str, out: str, *, full_rank: int, target: str, step: int, kept: int) -> None:
    failed, last = os.path.join(out, f"checkpoint-{step}"), os.path.join(out, f"checkpoint-{kept}")
    assert f"SaveError: AdLoCo could not write {failed}" in output, output[-4000:]
    assert re.search(r"\([\d,]+ MiB free on /", output), output[-4000:]
    assert f"The last good checkpoint ({last}) is kept" in output
    assert "basic_ios::clear" in output if target == "torch.save" else "No space left on device" in output
    assert root_cause(output)[0] == full_rank  # the launcher blames the worker whose save failed
    # The other worker, waiting for it at most worker_timeout (10 s) plus the grace it gives the failed worker to
    # exit first (10 s), names it too: well before torchrun's 30 s between its SIGTERM (a flag) and SIGKILL.
    assert f"worker rank(s) {full_rank} failed, so this worker (rank {1 - full_rank}) stops" in output
    names = os.listdir(out)
    assert f"checkpoint-{kept}" in names and f"checkpoint-{step}" not in names
    assert not any(name.startswith(".tmp-") for name in names if name != f".tmp-checkpoint-{step}")


# ---- a full disk ----
@pytest.mark.multiprocess
def test_a_full_disk_names_the_path_free_space_and_the_kept_checkpoint(tmp_path):
    # Rank 1's AdLoCo state (torch.save) fails at checkpoint-20: checkpoint-10 is kept.
    out = str(tmp_path / "out")
    output = launch_failing(WORKER, json.dumps(spec_for(out, str(tmp_path / "p0"), disk_full=[1, 20, "torch.save"])),
                            num_processes=2, timeout=240)  # fmt: skip
    check_full_disk(output, out, full_rank=1, target="torch.save", step=20, kept=10)
    # The kept checkpoint resumes, and saves checkpoint-20; then rank 0's model weights (save_pretrained, which
    # only rank 0 writes) fail at checkpoint-30: checkpoint-20 is kept.
    spec = spec_for(out, str(tmp_path / "p1"), resume=True, disk_full=[0, 30, "save_pretrained"])
    output = launch_failing(WORKER, json.dumps(spec), num_processes=2, timeout=240)
    check_full_disk(output, out, full_rank=0, target="save_pretrained", step=30, kept=20)
    assert not os.path.isdir(os.path.join(out, "merged"))


# ---- leftovers of interrupted saves ----
LEFTOVER_DIRS = [
    ".tmp-checkpoint-20", ".old-checkpoint-10", ".merged.tmp-0badc0de", ".merged.old-12345678",
    ".merged-full.tmp-abcdef01", "merges/.outer-4.tmp-1a2b3c4d", "merges/.outer-2.old-5e6f7a8b",
]  # fmt: skip
LEFTOVER_FILES = ["adloco_rounds.jsonl.tmp-1234abcd", "README.md.tmp-deadbeef"]


@pytest.mark.multiprocess
def test_leftovers_of_interrupted_saves_are_removed_at_the_next_start_and_logged(tmp_path):
    out = tmp_path / "out"
    for name in LEFTOVER_DIRS:
        (out / name).mkdir(parents=True)
        (out / name / "model.safetensors").write_bytes(b"half written")
    for name in LEFTOVER_FILES:
        (out / name).write_text("half written")
    # The folders the set-aside copies belong to exist: those copies are stale. Other names are not the library's.
    kept = ["merges/outer-2/model.safetensors", "checkpoint-10/model.safetensors", "notes.tmp", ".tmp-notes/a.txt",
            "merges/outer-4.tmp-1a2b3c4d/x"]  # fmt: skip
    for name in kept + ["merged/model.safetensors"]:
        (out / name).parent.mkdir(parents=True, exist_ok=True)
        (out / name).write_text("mine")
    # A save killed between its two renames: the set-aside copy is the only complete checkpoint-5, so it comes back.
    (out / ".old-checkpoint-5").mkdir()
    (out / ".old-checkpoint-5" / "model.safetensors").write_text("complete")

    config = dict(CONFIG, max_steps=10, save_strategy="no")
    result = launch_spec(spec_for(str(out), str(tmp_path / "p"), config=config))
    output = result.stdout + result.stderr
    for name in LEFTOVER_DIRS + LEFTOVER_FILES:
        assert not (out / name).exists(), name
        assert f"removed {name}, left by an interrupted save" in output, (name, output[-3000:])
    for name in kept:
        assert (out / name).read_text() == "mine", name
    assert (out / "checkpoint-5" / "model.safetensors").read_text() == "complete"
    assert "restored checkpoint-5 from .old-checkpoint-5, left by an interrupted save" in output


# ---- fsync ----
def failing_fsync(fail_errno: int, only_directories: bool = False):
    real = os.fsync

    def fsync(fd):
        if not only_directories or stat.S_ISDIR(os.fstat(fd).st_mode):
            raise OSError(fail_errno, os.strerror(fail_errno))
        return real(fd)

    return fsync


def test_an_fsync_error_surfaces_naming_the_file_and_keeps_the_previous_folder(tmp_path, monkeypatch):
    folder = tmp_path / "merged"
    folder.mkdir()
    (folder / "model.safetensors").write_text("old")
    monkeypatch.setattr(os, "fsync", failing_fsync(errno.EIO))
    with pytest.raises(OSError) as caught, atomic_directory(str(folder)) as tmp:
        with open(os.path.join(tmp, "model.safetensors"), "w") as f:
            f.write("new")
    assert caught.value.errno == errno.EIO
    assert "fsync" in str(caught.value) and "model.safetensors" in str(caught.value)
    assert (folder / "model.safetensors").read_text() == "old"
    assert os.listdir(tmp_path) == ["merged"]  # the temporary folder is gone

    # A checkpoint's staging folder is fsynced before it is renamed: the published one stays as it was.
    staging, final = tmp_path / ".tmp-checkpoint-10", tmp_path / "checkpoint-10"
    for path, text in ((staging, "new"), (final, "old")):
        (path / "adloco").mkdir(parents=True)
        (path / "adloco" / "rank-1.pt").write_text(text)
        (path / "optimizer.pt").write_text(text)
    with pytest.raises(OSError, match=r"fsync.*(optimizer\.pt|rank-1\.pt)") as caught:
        publish_checkpoint(str(staging), str(final))
    assert caught.value.errno == errno.EIO
    assert (final / "optimizer.pt").read_text() == "old" and (final / "adloco" / "rank-1.pt").read_text() == "old"


def test_directories_whose_filesystem_cannot_fsync_them_are_skipped(tmp_path, monkeypatch):
    monkeypatch.setattr(os, "fsync", failing_fsync(errno.EINVAL, only_directories=True))
    with atomic_directory(str(tmp_path / "merged")) as tmp:
        with open(os.path.join(tmp, "model.safetensors"), "w") as f:
            f.write("new")
    assert (tmp_path / "merged" / "model.safetensors").read_text() == "new"
    monkeypatch.setattr(os, "fsync", failing_fsync(errno.EIO, only_directories=True))
    with pytest.raises(OSError), atomic_directory(str(tmp_path / "merged")):
        pass  # any other error of a directory's fsync still surfaces
    assert (tmp_path / "merged" / "model.safetensors").read_text() == "new"


def test_an_fsync_error_in_a_checkpoint_save_stops_training_with_a_clear_error(tmp_path, monkeypatch):
    out = str(tmp_path / "out")
    args = AdLoCoConfig(output_dir=out, use_cpu=True, report_to=[], disable_tqdm=True, **dict(CONFIG, max_steps=20))
    trainer = AdLoCoTrainer(model=tiny_model(), args=args, train_dataset=sequence_dataset(128))
    real = os.fsync

    def fsync(fd):  # fails for what checkpoint-20's save writes (Linux: the descriptor's path in /proc)
        if ".tmp-checkpoint-20" in os.readlink(f"/proc/self/fd/{fd}"):
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        return real(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    with pytest.raises(OSError) as caught:
        trainer.train()
    message = str(caught.value)
    assert type(caught.value).__name__ == "SaveError" and caught.value.__cause__.errno == errno.EIO
    assert f"AdLoCo could not write {os.path.join(out, 'checkpoint-20')}" in message and "fsync" in message
    assert f"The last good checkpoint ({os.path.join(out, 'checkpoint-10')}) is kept" in message
    assert sorted(n for n in os.listdir(out) if n.startswith("checkpoint-")) == ["checkpoint-10"]
