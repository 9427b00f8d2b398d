"""Bytes on the wire: the library's ring all-reduce model and the start broadcast (what a run should send), and the
bytes a process's TCP sockets sent (`ss -tinpH`: what it did send)."""

import os
import re
import shutil
import subprocess

from adloco_hf.inspection import ring_all_reduce_bytes  # one byte model for DDP and AdLoCo alike


__all__ = ["parse_ss_bytes_sent", "ring_all_reduce_bytes", "socket_bytes_sent", "start_broadcast_bytes"]


def start_broadcast_bytes(world_size: int, parameters: int, dtype_bytes: int = 4) -> int:
    """Bytes of the broadcast at the start of a run: rank 0 sends its weights to every other worker once (DDP's
    module sync, AdLoCo's initialisation), `(world_size − 1) × parameters × dtype_bytes`."""
    return max(world_size - 1, 0) * parameters * dtype_bytes


_PID = re.compile(r"pid=(\d+)")
_BYTES_SENT = re.compile(r"\bbytes_sent:(\d+)")


def parse_ss_bytes_sent(text: str) -> dict[int, int]:
    """Sum `bytes_sent` per owning process over the sockets of `ss -tinpH` output.

    `ss -tinpH` prints one line per socket (state, queues, addresses, `users:(("name",pid=N,fd=F),...)`) followed,
    with `-i`, by one indented line of TCP info that holds `bytes_sent:B` once the socket has sent anything. A socket
    shared by several processes counts for each of them. Sockets without a `users:` field (owned by another user, or
    `ss` run without `-p`) are ignored.

    Returns:
        `{pid: bytes sent}` over the sockets currently open.
    """
    totals: dict[int, int] = {}
    owners: list[int] = []
    for line in text.splitlines():
        if not line.strip():
            continue
        if not line[0].isspace():  # a socket line: remember its owners until its info line
            owners = sorted({int(p) for p in _PID.findall(line)}) if "users:(" in line else []
            for pid in owners:
                totals.setdefault(pid, 0)
            # Some ss builds print the info on the same line when the output is not a terminal.
            match = _BYTES_SENT.search(line)
        else:
            match = _BYTES_SENT.search(line)
        if match and owners:
            for pid in owners:
                totals[pid] += int(match.group(1))
            owners = []
    return totals


def socket_bytes_sent(pid: int | None = None) -> int | None:
    """Bytes sent so far over the TCP sockets that process `pid` (default: this one) has open, from `ss -tinpH`.

    Returns None when `ss` is missing or fails. Bytes of sockets closed in the meantime are not counted: measure
    before and after a section during which the process groups' sockets stay open.
    """
    pid = os.getpid() if pid is None else pid
    if shutil.which("ss") is None:
        return None
    try:
        out = subprocess.run(["ss", "-tinpH"], capture_output=True, text=True, timeout=30, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return parse_ss_bytes_sent(out).get(pid, 0)
