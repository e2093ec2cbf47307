"""Read a small text file from a tree that may be another machine's: bounded, regular files only, never blocking."""

from __future__ import annotations

import os
import stat
from pathlib import Path

MAX_BYTES = 64 << 10  # sysfs attributes are one page; /proc/cmdline is at most a few KiB


class Unreadable(Exception):
    """Why a file could not be read as text (missing, not a regular file, too large, binary, not UTF-8)."""


def read_text(path: Path, limit: int = MAX_BYTES) -> str:
    """The file's text, at most `limit` bytes; raises Unreadable naming the file and the reason.

    Opened non-blocking (a FIFO planted where a file is meant cannot hang the doctor) and refused unless it is a
    regular file (sysfs and procfs attributes are)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise Unreadable(f"{path}: {exc.strerror or exc}") from None
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise Unreadable(f"{path}: not a regular file")
        chunks: list[bytes] = []
        total = 0
        while total <= limit:
            try:
                chunk = os.read(fd, min(65536, limit + 1 - total))
            except OSError as exc:
                raise Unreadable(f"{path}: {exc.strerror or exc}") from None
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
    finally:
        os.close(fd)
    if total > limit:
        raise Unreadable(f"{path}: larger than {limit} bytes")
    data = b"".join(chunks)
    if b"\x00" in data:
        raise Unreadable(f"{path}: binary content (NUL bytes)")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise Unreadable(f"{path}: not UTF-8 text") from None
