"""Files and folders written atomically: under a temporary name beside their destination, fsynced, then renamed.

A process that dies while writing never leaves a half-written file or folder where a complete one was expected. What
is published gets the modes the process's umask allows, whatever the writer underneath chose ([`apply_umask_modes`]).
"""

import contextlib
import errno
import os
import shutil
import uuid
from collections.abc import Iterator


__all__ = [
    "apply_umask_modes",
    "atomic_directory",
    "atomic_write_text",
    "current_umask",
    "publish_checkpoint",
    "publish_files",
    "replace_directory",
]


def current_umask() -> int:
    """The process's umask. Linux shows it in /proc/self/status (kernel 4.7 on); elsewhere `os.umask` can only read
    it by setting it, which leaves a moment in which another thread would create its files with the stand-in."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def apply_umask_modes(root: str) -> None:
    """Give `root` (a file, or a folder and everything under it) the modes a plain `open` or `mkdir` would under the
    process's umask: files 0o666 & ~umask (0o777 & ~umask when executable), folders 0o777 & ~umask.

    Why: a writer may create its files through `mkstemp`, whose mode is 0o600 whatever the umask (safetensors 0.8
    saving for transformers 5.23 does: every `model.safetensors`). On a shared file system no one else could then read
    a checkpoint or a merged model. A file this process may not change (another user's) keeps its mode.
    """
    mask = current_umask()
    paths = [(root, os.path.isdir(root))]
    if paths[0][1]:
        for dirpath, dirnames, filenames in os.walk(root):
            paths += [(os.path.join(dirpath, name), True) for name in dirnames]
            paths += [(os.path.join(dirpath, name), False) for name in filenames]
    for path, is_dir in paths:
        if os.path.islink(path):
            continue
        executable = is_dir or os.stat(path).st_mode & 0o100
        with contextlib.suppress(PermissionError):
            os.chmod(path, (0o777 if executable else 0o666) & ~mask)


@contextlib.contextmanager
def atomic_directory(final_dir: str) -> Iterator[str]:
    """Yield a temporary directory beside `final_dir`; on success it replaces `final_dir` in one rename.

    An existing `final_dir` is first renamed aside and removed only after the new one is in place. On error the
    temporary directory is removed and `final_dir` is left as it was.
    """
    final_dir = os.path.abspath(final_dir)
    parent, name = os.path.split(final_dir)
    os.makedirs(parent, exist_ok=True)
    tmp = os.path.join(parent, f".{name}.tmp-{uuid.uuid4().hex[:8]}")
    os.makedirs(tmp)
    try:
        yield tmp
        apply_umask_modes(tmp)
        _fsync_tree(tmp)
        old = None
        if os.path.exists(final_dir):
            old = os.path.join(parent, f".{name}.old-{uuid.uuid4().hex[:8]}")
            os.replace(final_dir, old)
        os.replace(tmp, final_dir)
        _fsync_dir(parent)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


# A directory's fsync fails with these where the filesystem cannot sync directories, e.g. EINVAL on SMB/CIFS mounts
# and EOPNOTSUPP on FUSE filesystems without fsyncdir (gocryptfs): skipped there. Every other error is raised.
_DIRECTORY_FSYNC_UNSUPPORTED = frozenset({errno.EINVAL, errno.ENOTSUP, errno.EOPNOTSUPP})


def fsync(path: str, *, directory: bool = False) -> None:
    """fsync `path`; an error is raised as an OSError naming `path` (see `_DIRECTORY_FSYNC_UNSUPPORTED`)."""
    if directory and os.name == "nt":
        return  # Windows cannot open a directory to sync it
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    except OSError as error:
        if not (directory and error.errno in _DIRECTORY_FSYNC_UNSUPPORTED):
            raise OSError(error.errno, f"fsync failed ({error.strerror})", path) from error
    finally:
        os.close(fd)


def _fsync_dir(path: str) -> None:
    fsync(path, directory=True)


def _fsync_tree(root: str) -> None:
    """fsync every file under `root`, then its folders: what is published must be on disk before the rename."""
    for dirpath, _, filenames in os.walk(root):
        for filename in filenames:
            fsync(os.path.join(dirpath, filename))
        _fsync_dir(dirpath)


def atomic_write_text(path: str, text: str) -> None:
    tmp = f"{path}.tmp-{uuid.uuid4().hex[:8]}"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
    fsync(tmp)
    os.replace(tmp, path)


def publish_checkpoint(staging: str, final_dir: str) -> None:
    """Rename a complete staging folder to `final_dir`; an existing one is set aside first and removed after.

    Every file of `staging` (whichever worker wrote it) is fsynced first: an fsync error is raised before anything
    is renamed, so `final_dir` is left as it was.
    """
    apply_umask_modes(staging)
    _fsync_tree(staging)
    aside = None
    if os.path.exists(final_dir):
        parent, name = os.path.split(os.path.abspath(final_dir))
        aside = os.path.join(parent, f".old-{name}")
        shutil.rmtree(aside, ignore_errors=True)
        os.replace(final_dir, aside)
    os.replace(staging, final_dir)
    _fsync_dir(os.path.dirname(os.path.abspath(final_dir)))
    if aside is not None:
        shutil.rmtree(aside, ignore_errors=True)


def replace_directory(tmp: str, path: str) -> None:
    """Move a finished directory into place; if another process got there first, keep theirs (same content)."""
    try:
        os.replace(tmp, path)
    except OSError:
        if not os.path.isdir(path):
            raise


def publish_files(tmp: str, target: str, *, last: str) -> None:
    """Move the files of `tmp` into `target` one by one (each `os.replace` is atomic), `last` at the end.

    `last` is the marker a reader checks: it is removed first, so a reader never pairs old files with a new marker.
    """
    with contextlib.suppress(FileNotFoundError):
        os.remove(os.path.join(target, last))
    for name in sorted(os.listdir(tmp), key=lambda name: name == last):
        os.replace(os.path.join(tmp, name), os.path.join(target, name))
