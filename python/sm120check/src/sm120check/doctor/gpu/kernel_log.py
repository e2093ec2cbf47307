"""Read this boot's kernel log, bounded, and pick out the NVIDIA driver's Xid and "fallen off the bus" lines.

Sources in order: /dev/kmsg read non-blocking until EAGAIN (this boot's ring buffer), else
`journalctl -k -b --no-pager -o short-monotonic`, else `dmesg`, each with a time and size bound. A log larger than
the bound keeps its newest lines (the Xid of a minute ago is on the last line) and KernelLog.cut says so. No source
readable (dmesg_restrict, a container) is a value: KernelLog.error says so and how to fix it, never a crash.

Line formats (NVIDIA's Xid documentation, docs.nvidia.com/deploy/xid-errors/, and driver output seen in
NVIDIA/open-gpu-kernel-modules issues):
    NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python3, GPU has fallen off the bus.
    NVRM: Xid (PCI:0000:2b:00): 79, GPU has fallen off the bus.
    NVRM: Xid (0000:01:00): 3, C 00000005 SC 00000007 M 00001ffc Data ffffffff        (older drivers: no "PCI:")
    NVRM: GPU 0000:2b:00.0: GPU has fallen off the bus.
    NVRM: GPU at 0000:01:00.0 has fallen off the bus.                                   (older drivers)
"""

from __future__ import annotations

import errno
import os
import re
import subprocess
import time
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass

from sm120check import bounded
from sm120check.doctor.gpu.payloads import KernelLog, XidEvent

MAX_BYTES = 32 << 20  # stop reading past this much log
READ_SECONDS = 3.0

_BUS = r"[0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}(?:\.[0-7])?"  # 0000:3b:00, 00000000:3B:00.0
_XID = re.compile(rf"NVRM: Xid \((?:PCI:)?(?P<pci>{_BUS})\): (?P<xid>\d+),\s*(?P<rest>.*)")
_FALLEN = re.compile(rf"NVRM: GPU (?:at )?(?:PCI:)?(?P<pci>{_BUS}):? (?:GPU )?has fallen off the bus")
_PID = re.compile(r"\bpid=(?P<pid>\d+)")
_NAME = re.compile(r"\bname=(?P<name>[^,]*)")
_MONO = re.compile(r"^\s*\[\s*(?P<s>\d+\.\d+)\]")  # "[ 1936.510073] ..." (dmesg, journalctl short-monotonic)


def parse_line(line: str, uptime_s: float | None = None) -> XidEvent | None:
    """The Xid event on one log line, or None. A "fallen off the bus" line without an Xid counts as Xid 79."""
    if uptime_s is None:
        mono = _MONO.match(line)
        uptime_s = float(mono.group("s")) if mono else None
    match = _XID.search(line)
    if match:
        rest = match.group("rest").strip()
        pid = _PID.search(rest)
        name = _NAME.search(rest)
        return XidEvent(
            int(match.group("xid")),
            match.group("pci"),
            rest,
            uptime_s,
            int(pid.group("pid")) if pid else None,
            name.group("name").strip() if name else "",
        )
    fallen = _FALLEN.search(line)
    if fallen:
        return XidEvent(79, fallen.group("pci"), "GPU has fallen off the bus (no Xid line)", uptime_s)
    return None


def parse(lines: Iterable[str]) -> tuple[XidEvent, ...]:
    """Every Xid event, in order; a "fallen off the bus" line right after an Xid 79 of the same GPU is not doubled."""
    events: list[XidEvent] = []
    for line in lines:
        event = parse_line(line)
        if event is None:
            continue
        if event.text.endswith("(no Xid line)") and any(
            e.xid == 79 and _same_gpu(e.pci, event.pci) for e in events[-4:]
        ):
            continue
        events.append(event)
    return tuple(events)


def _same_gpu(a: str, b: str) -> bool:
    def key(text: str) -> tuple[int, int, int] | None:
        parts = text.lower().split(":")
        try:
            return int(parts[0], 16), int(parts[1], 16), int(parts[2].split(".")[0], 16)
        except (ValueError, IndexError):
            return None

    return key(a) is not None and key(a) == key(b)


def _kmsg_records(data: bytes) -> list[str]:
    """/dev/kmsg records "prio,seq,usec,flags;message" -> "[  seconds] message"."""
    lines = []
    for record in data.decode(errors="replace").splitlines():
        if record.startswith(" "):  # continuation lines (" KEY=value") carry no message
            continue
        head, _, message = record.partition(";")
        fields = head.split(",")
        if len(fields) >= 3 and fields[2].isdigit():
            lines.append(f"[{int(fields[2]) / 1e6:12.6f}] {message}")
        else:
            lines.append(message)
    return lines


@dataclass(frozen=True)
class LogLines:
    """The lines of one source, and what was left out when the log was larger than MAX_BYTES ("" when nothing)."""

    source: str
    lines: list[str]
    cut: str = ""


def _cut_note(newest: bool) -> str:
    size = bounded.size_text(MAX_BYTES)
    return f"the log is larger than {size}: only its {'newest' if newest else 'oldest'} {size} were read"


def read_kmsg(path: str = "/dev/kmsg", newest: bool = True) -> LogLines:
    """This boot's ring buffer, read non-blocking until EAGAIN; when it is larger than MAX_BYTES, its newest part
    (newest=True: an Xid of the last minute is on the last lines) or its oldest (the boot's own lines) is kept and
    `cut` says so. Raises OSError (PermissionError) when unreadable."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    chunks: deque[bytes] = deque()
    total = 0
    cut = ""
    deadline = time.monotonic() + READ_SECONDS
    try:
        while True:
            if time.monotonic() >= deadline:
                cut = f"reading {path} took longer than {READ_SECONDS:g} s: its newest records may be missing"
                break
            try:
                chunk = os.read(fd, 16384)  # one record per read
            except BlockingIOError:
                break
            except OSError as exc:
                if exc.errno == errno.EPIPE:  # the record was overwritten while reading: skip to the next
                    continue
                raise
            if not chunk:
                break
            if not newest and total + len(chunk) > MAX_BYTES:
                cut = _cut_note(newest)
                break
            chunks.append(chunk)
            total += len(chunk)
            while newest and total - len(chunks[0]) >= MAX_BYTES:  # /dev/kmsg gives one record per read
                total -= len(chunks.popleft())
                cut = _cut_note(newest)
    finally:
        os.close(fd)
    data = b"".join(chunks)
    if len(data) > MAX_BYTES:  # the oldest read went past the bound: keep its whole records after the cut
        data, cut = data[-MAX_BYTES:], _cut_note(newest)
        data = data[data.find(b"\n") + 1 :]
    return LogLines(path, _kmsg_records(data), cut)


def read_command(source: str, cmd: list[str], newest: bool = True) -> LogLines:
    """`cmd`'s output (journalctl, dmesg) as lines, at most MAX_BYTES of it, the newest or the oldest part."""
    out = bounded.command_output(cmd, MAX_BYTES, READ_SECONDS * 2, keep_newest=newest)
    if out.timed_out:
        raise OSError(f"{' '.join(cmd)} did not finish within {READ_SECONDS * 2:g} s")
    if out.returncode != 0:
        err = out.stderr.strip().splitlines()
        raise OSError(f"{' '.join(cmd)} exited {out.returncode}: {(err or ['no error output'])[-1]}")
    data = out.data
    if out.cut:  # the cut went through a line: drop its piece
        data = data[data.find(b"\n") + 1 :] if newest else data[: data.rfind(b"\n") + 1]
    return LogLines(source, data.decode(errors="replace").splitlines(), _cut_note(newest) if out.cut else "")


SOURCES: tuple[tuple[str, list[str] | None], ...] = (
    ("/dev/kmsg", None),
    ("journalctl -k -b", ["journalctl", "-k", "-b", "--no-pager", "-o", "short-monotonic"]),
    ("dmesg", ["dmesg"]),
)


def read_lines(newest: bool = True) -> tuple[LogLines | None, list[str]]:
    """The first readable source's lines (None when there is none) and why each source before it failed."""
    problems: list[str] = []
    for source, cmd in SOURCES:
        try:
            log = read_kmsg(newest=newest) if cmd is None else read_command(source, cmd, newest)
        except (OSError, subprocess.SubprocessError) as exc:
            problems.append(f"{source}: {exc}")
            continue
        if not log.lines:
            problems.append(f"{source}: no records")
            continue
        return log, problems
    return None, problems


def read() -> KernelLog:
    """The Xid events of this boot from the first readable source, the newest MAX_BYTES of it; KernelLog.error when
    no source is readable, KernelLog.cut when the log was larger."""
    log, problems = read_lines()
    if log is not None:
        return KernelLog(log.source, parse(log.lines), lines=len(log.lines), cut=log.cut)
    return KernelLog(
        "",
        error="kernel log unreadable: "
        + "; ".join(problems)
        + " (run as root, or allow it with `sudo sysctl kernel.dmesg_restrict=0`; in a container, read the host's log)",
    )
