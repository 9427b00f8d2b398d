"""`common/files.py`: what is published gets the modes the process's umask allows, whatever the writer did."""

import os
import stat
import tempfile

import pytest
import safetensors.torch
import torch

from adloco_hf.common.files import apply_umask_modes, atomic_directory, current_umask, publish_checkpoint


@pytest.fixture
def umask():
    """Run the test under umask 0o002 (a group-shared file system's), the caller's put back after."""
    old = os.umask(0o002)
    yield 0o002
    os.umask(old)


def mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def write_like_mkstemp(folder: str) -> str:
    """A file written as safetensors 0.8 writes `model.safetensors` for transformers 5.23: through mkstemp (0600)."""
    fd, tmp = tempfile.mkstemp(dir=folder)
    os.close(fd)
    safetensors.torch.save_file({"w": torch.ones(2)}, tmp)
    path = os.path.join(folder, "model.safetensors")
    os.replace(tmp, path)
    return path


def test_the_umask_is_read_without_changing_it(umask):
    assert current_umask() == umask
    assert current_umask() == umask


def test_a_published_folder_gets_the_umask_modes(tmp_path, umask):
    with atomic_directory(str(tmp_path / "merged")) as tmp:
        assert mode(write_like_mkstemp(tmp)) == 0o600  # the writer's mode, which the publication must not keep
        script = os.path.join(tmp, "run.sh")
        with open(script, "w") as f:
            f.write("#!/bin/sh\n")
        os.chmod(script, 0o700)
        os.mkdir(os.path.join(tmp, "sub"), mode=0o700)
    assert mode(tmp_path / "merged" / "model.safetensors") == 0o664
    assert mode(tmp_path / "merged" / "run.sh") == 0o775  # executable stays executable, for everyone the umask allows
    assert mode(tmp_path / "merged" / "sub") == 0o775
    assert mode(tmp_path / "merged") == 0o775

    staging = tmp_path / ".tmp-checkpoint-10"
    staging.mkdir()
    write_like_mkstemp(str(staging))
    publish_checkpoint(str(staging), str(tmp_path / "checkpoint-10"))
    assert mode(tmp_path / "checkpoint-10" / "model.safetensors") == 0o664


def test_a_single_file_and_a_strict_umask(tmp_path):
    path = write_like_mkstemp(str(tmp_path))
    old = os.umask(0o077)
    try:
        apply_umask_modes(path)
    finally:
        os.umask(old)
    assert mode(path) == 0o600  # a private umask keeps files private
    old = os.umask(0o022)
    try:
        apply_umask_modes(path)
    finally:
        os.umask(old)
    assert mode(path) == 0o644
