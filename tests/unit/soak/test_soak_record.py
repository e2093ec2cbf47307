"""The soak's record: JSONL lines read back as the samples written, and the PNG drawn with Xids and throttling."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from sm120check.soak import record
from sm120check.soak.samples import GpuSample, Sample, SamplerNote, ServerInterval, XidSample, parse_lines
from unit.soak.test_soak_verdicts import HEALTHY, START


def samples() -> list[Sample]:
    out: list[Sample] = [replace(HEALTHY, t=START + i, reasons=0x40 if 30 <= i < 50 else 0x4) for i in range(90)]
    out += [
        ServerInterval(START + i, 1.0, 900, 3, 1 if i == 70 else 0, 16, "HTTP 500" if i == 70 else "")
        for i in range(90)
    ]
    out += [XidSample(START + 60, 119, 0), SamplerNote(START + 90, "end")]
    return sorted(out, key=lambda s: s.t)


def test_jsonl_reads_back_what_was_written_and_names_a_cut_line(tmp_path: Path) -> None:
    path = tmp_path / record.JSONL
    record.write_meta(path, {"host": "n1", "start": START})
    record.append(path, samples())
    with path.open("a") as stream:
        stream.write('{"kind": "gpu", "t": 1')  # the line a kill cut short
    read, skipped = parse_lines(path.read_text())
    assert read == samples()
    assert skipped == ["line 184: not JSON (cut short?)"]


def test_png_marks_xids_and_throttling(tmp_path: Path) -> None:
    path = tmp_path / record.PNG
    assert record.plot(path, samples(), START) == []
    assert path.read_bytes()[:4] == b"\x89PNG" and path.stat().st_size > 10_000


def test_png_says_when_the_gpu_has_no_fan(tmp_path: Path) -> None:
    fanless = [replace(s, fan_percent=None) if isinstance(s, GpuSample) else s for s in samples()]  # an H100 SXM
    assert record.plot(tmp_path / record.PNG, fanless, START) == [
        "NVML gave no fan speed (a board without fans of its own)"
    ]
