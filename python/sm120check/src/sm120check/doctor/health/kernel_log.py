"""Read this boot's kernel log, bounded, and pick out the NVIDIA driver's Xid and "fallen off the bus" lines.

Sources in order: /dev/kmsg read non-blocking until EAGAIN (this boot's ring buffer), else
`journalctl -k -b --no-pager -o short-monotonic`, else `dmesg`, each with a time and size bound. No source
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
from collections.abc import Iterable

from sm120check.doctor.health.payloads import KernelLog, XidEvent

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


def read_kmsg(path: str = "/dev/kmsg") -> list[str]:
    """This boot's ring buffer, read non-blocking until EAGAIN; raises OSError (PermissionError) when unreadable."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    chunks: list[bytes] = []
    total = 0
    deadline = time.monotonic() + READ_SECONDS
    try:
        while total < MAX_BYTES and time.monotonic() < deadline:
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
            chunks.append(chunk)
            total += len(chunk)
    finally:
        os.close(fd)
    return _kmsg_records(b"".join(chunks))


def _command(cmd: list[str]) -> list[str]:
    proc = subprocess.run(cmd, capture_output=True, timeout=READ_SECONDS * 2, check=False)
    if proc.returncode != 0:
        err = proc.stderr.decode(errors="replace").strip().splitlines()
        raise OSError(f"{' '.join(cmd)} exited {proc.returncode}: {(err or ['no error output'])[-1]}")
    return proc.stdout[:MAX_BYTES].decode(errors="replace").splitlines()


def read() -> KernelLog:
    """The Xid events of this boot from the first readable source; KernelLog.error when none is readable."""
    problems: list[str] = []
    sources: list[tuple[str, list[str] | None]] = [
        ("/dev/kmsg", None),
        ("journalctl -k -b", ["journalctl", "-k", "-b", "--no-pager", "-o", "short-monotonic"]),
        ("dmesg", ["dmesg"]),
    ]
    for source, cmd in sources:
        try:
            lines = read_kmsg() if cmd is None else _command(cmd)
        except (OSError, subprocess.SubprocessError) as exc:
            problems.append(f"{source}: {exc}")
            continue
        if not lines and cmd is None:
            problems.append(f"{source}: no records")
            continue
        return KernelLog(source, parse(lines), lines=len(lines))
    return KernelLog(
        "",
        error="kernel log unreadable: "
        + "; ".join(problems)
        + " (run as root, or allow it with `sudo sysctl kernel.dmesg_restrict=0`; in a container, read the host's log)",
    )
