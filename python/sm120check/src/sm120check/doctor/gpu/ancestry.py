"""Whose process is it: the parent chain of a pid from /proc/<pid>/stat, so the probe can leave out the doctor's own
children (its torch probe, rank launcher and NVRTC launch hold CUDA contexts while the process list is read)."""

from __future__ import annotations

from pathlib import Path

from sm120check import bounded

PROC = Path("/proc")
MAX_DEPTH = 256  # a parent chain longer than this is a /proc we misread, not a real tree


def parent(pid: int, proc: Path = PROC) -> int | None:
    """The ppid of `pid` (field 4 of /proc/<pid>/stat, after the parenthesised comm, which may hold spaces and
    parentheses); None when the process is gone or its stat is unreadable."""
    try:
        text = bounded.read_text(proc / str(pid) / "stat", 4096, lenient=True)
    except bounded.Unreadable:
        return None
    fields = text[text.rfind(")") + 1 :].split()
    try:
        return int(fields[1])
    except (IndexError, ValueError):
        return None


def descends_from(pid: int, root: int, proc: Path = PROC) -> bool:
    """True when `root` is `pid` or one of its ancestors (another PID namespace's pid, as NVML may list it for a
    containerised process, is simply not found: False)."""
    current: int | None = pid
    for _ in range(MAX_DEPTH):
        if current is None or current <= 0:
            return False
        if current == root:
            return True
        if current == 1:
            return False
        current = parent(current, proc)
    return False
