"""Kernel-log parsing on the driver's line formats, and the readers' failure paths (values, never crashes)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from sm120check.doctor.gpu import kernel_log
from sm120check.doctor.gpu.payloads import KernelLog
from sm120check.doctor.gpu.xid import AZUREHPC_XIDS, CATALOGUE, lookup
from sm120check.doctor.node_health import verdicts

# Lines as the driver prints them (NVIDIA's Xid docs format `NVRM: Xid (PCI:<bus>): <xid>, pid=..., name=..., <text>`;
# the others as posted in NVIDIA/open-gpu-kernel-modules#1151 and user logs with older drivers).
DOCUMENTED = "NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python3, GPU has fallen off the bus."
ISSUE_1151 = [
    "May 18 19:02:39 kernel: NVRM: GPU at PCI:0000:2b:00: GPU-0b11d014-1685-04bd-26ed-5fc0bc1c44ae",
    "May 18 19:02:39 kernel: NVRM: Xid (PCI:0000:2b:00): 79, GPU has fallen off the bus.",
    "May 18 19:02:39 kernel: NVRM: GPU 0000:2b:00.0: GPU has fallen off the bus.",
]
OLD_DRIVER = "[  269.517039] NVRM: Xid (0000:01:00): 3, C 00000005 SC 00000007 M 00001ffc Data ffffffff"
OLD_FALLEN = "[ 1936.510073] NVRM: GPU at 0000:01:00.0 has fallen off the bus."
MMU = (
    "May 13 17:19:01 hyperion kernel: NVRM: Xid (PCI:0000:08:00): 31, Ch 0000003b, intr 10000000. MMU Fault: ENGINE "
    "GRAPHICS HUBCLIENT_SCC faulted @ 0x0_04687000. Fault is of type FAULT_PDE ACCESS_TYPE_READ"
)


def test_documented_line() -> None:
    event = kernel_log.parse_line(DOCUMENTED)
    assert event is not None
    assert (event.xid, event.pci, event.pid, event.process) == (79, "0000:3b:00", 1234, "python3")
    assert event.text.endswith("GPU has fallen off the bus.")


def test_xid_79_then_fallen_line_counts_once() -> None:
    events = kernel_log.parse(ISSUE_1151)
    assert [(e.xid, e.pci) for e in events] == [(79, "0000:2b:00")]


def test_old_formats_and_uptime() -> None:
    old = kernel_log.parse_line(OLD_DRIVER)
    assert old is not None and (old.xid, old.pci) == (3, "0000:01:00")
    assert old.uptime_s == pytest.approx(269.517039)
    fallen = kernel_log.parse([OLD_FALLEN])
    assert [(e.xid, e.pci) for e in fallen] == [(79, "0000:01:00.0")]
    mmu = kernel_log.parse_line(MMU)
    assert mmu is not None and mmu.xid == 31 and mmu.pid is None


def test_other_lines_are_ignored() -> None:
    assert kernel_log.parse(["usbhid 2-3:1.0: suspend error -5", "NVRM: loading NVIDIA UNIX Open Kernel Module"]) == ()


def test_kmsg_records() -> None:
    data = b"4,1234,5107644336,-;NVRM: Xid (PCI:0000:03:00): 79, GPU has fallen off the bus.\n SUBSYSTEM=pci\n"
    lines = kernel_log._kmsg_records(data)
    assert lines == ["[ 5107.644336] NVRM: Xid (PCI:0000:03:00): 79, GPU has fallen off the bus."]
    assert kernel_log.parse(lines)[0].uptime_s == pytest.approx(5107.644336)


def test_read_kmsg_stops_at_eagain_on_a_fifo(tmp_path: Path) -> None:
    fifo = tmp_path / "kmsg"
    os.mkfifo(fifo)
    writer = os.open(fifo, os.O_RDWR | os.O_NONBLOCK)  # keeps the FIFO open: an empty read is EAGAIN, not EOF
    try:
        os.write(writer, b"4,1,100,-;" + DOCUMENTED.encode() + b"\n")
        log = kernel_log.read_kmsg(str(fifo))
    finally:
        os.close(writer)
    assert kernel_log.parse(log.lines)[0].xid == 79 and log.cut == ""


def test_unreadable_everywhere_is_a_value(monkeypatch: pytest.MonkeyPatch) -> None:
    def denied(path: str = "/dev/kmsg", newest: bool = True) -> kernel_log.LogLines:
        raise PermissionError(1, "Operation not permitted", path)

    def failing(source: str, cmd: list[str], newest: bool = True) -> kernel_log.LogLines:
        raise OSError(f"{cmd[0]} exited 1: dmesg: read kernel buffer failed: Operation not permitted")

    monkeypatch.setattr(kernel_log, "read_kmsg", denied)
    monkeypatch.setattr(kernel_log, "read_command", failing)
    log = kernel_log.read()
    assert log.source == "" and log.events == ()
    assert log.error.startswith("kernel log unreadable:") and "run as root" in log.error
    assert "Operation not permitted" in log.error


def test_catalogue_covers_the_azurehpc_list_and_the_app_xids() -> None:
    for number in AZUREHPC_XIDS | {13, 31, 43, 45, 94, 95, 109, 140}:
        assert number in CATALOGUE, number
        assert CATALOGUE[number].action
    assert all(CATALOGUE[n].severity == "fail" for n in AZUREHPC_XIDS)
    assert lookup(79).name == "GPU has fallen off the bus"
    assert lookup(999).name == "not in the catalogue"


# --- probe 2, N72: a log larger than the bound keeps its newest lines, and says it cut --------------------------

XID_LAST = "NVRM: Xid (PCI:0000:3b:00): 48, pid=7, name=python3, DBE (Double Bit Error) ECC Error"


def test_journalctl_output_over_the_bound_keeps_its_newest_lines(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kernel_log, "MAX_BYTES", 1 << 20)
    noise = "print('usb 1-1: new device ' * 4, flush=False)\n"
    script = f"for _ in range(40000):\n    {noise}print({XID_LAST!r})\n"  # about 4 MiB, the Xid on the last line
    log = kernel_log.read_command("journalctl -k -b", [sys.executable, "-c", script])
    assert kernel_log.parse(log.lines)[-1].xid == 48
    assert log.cut == "the log is larger than 1 MiB: only its newest 1 MiB were read"
    assert log.lines[0].startswith("usb 1-1: new device")  # the line the cut went through is dropped whole


def test_the_xid_verdict_says_the_log_was_cut() -> None:
    cut = "the log is larger than 32 MiB: only its newest 32 MiB were read"
    log = KernelLog("journalctl -k -b", kernel_log.parse([XID_LAST]), lines=1, cut=cut)
    verdict = verdicts.xid(log)
    assert verdict.details.endswith(f"\n{cut}")
    clean = verdicts.xid(KernelLog("journalctl -k -b", (), lines=300000, cut=cut))
    assert clean.summary == f"no Xid in the kernel log since boot (journalctl -k -b, 300000 lines; {cut})"


def test_kmsg_over_the_bound_keeps_its_newest_records(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kernel_log, "MAX_BYTES", 4096)
    fifo = tmp_path / "kmsg"
    os.mkfifo(fifo)
    writer = os.open(fifo, os.O_RDWR | os.O_NONBLOCK)
    try:
        for seq in range(200):
            os.write(writer, f"6,{seq},{seq}000,-;usb 1-1: noise\n".encode())
        os.write(writer, b"4,200,200000,-;" + XID_LAST.encode() + b"\n")
        log = kernel_log.read_kmsg(str(fifo))
    finally:
        os.close(writer)
    assert kernel_log.parse(log.lines)[-1].xid == 48 and len(log.lines) < 201
    assert log.cut == "the log is larger than 4 KiB: only its newest 4 KiB were read"
