"""tests/lab/gpu_clocks.py: the sampler's lines joined with the bench's levels."""

from __future__ import annotations

from lab.gpu_clocks import per_level, samples
from sm120check.soak.samples import GpuSample, SamplerNote, to_line


def test_each_level_gets_the_samples_inside_its_window_and_names_the_reasons() -> None:
    lines = [
        to_line(SamplerNote(99.0, "start", "GPUs [0]")),
        to_line(GpuSample(100.5, 0, sm_mhz=1980, power_mw=300000, temperature_c=60, reasons=0x1)),
        to_line(GpuSample(101.5, 0, sm_mhz=1980, power_mw=500000, temperature_c=70, reasons=0x0)),
        to_line(GpuSample(102.5, 0, sm_mhz=1755, power_mw=700000, temperature_c=80, reasons=0x4)),
        to_line(GpuSample(103.5, 0, lost="GPU is lost")),
        "not json",
        to_line(GpuSample(110.5, 0, sm_mhz=1200, power_mw=100000, temperature_c=50, reasons=0x1)),
    ]
    gpu = samples(lines)
    assert [s.t for s in gpu] == [100.5, 101.5, 102.5, 110.5]  # the note, the lost GPU and the bad line left out
    rows = [
        {"label": "spec-7", "concurrency": 1, "level_started_epoch": 100.0, "level_ended_epoch": 103.0},
        {"label": "spec-7-s2", "concurrency": 1, "level_started_epoch": 104.0, "level_ended_epoch": 105.0},
    ]
    first, second = per_level(gpu, rows)
    assert first == {
        "label": "spec-7",
        "concurrency": 1,
        "samples": 3,
        "sm_mhz_mean": 1905,
        "sm_mhz_min": 1755,
        "power_w_mean": 500.0,
        "temperature_c_max": 80,
        "reasons": ["SW power cap"],  # the idle bit of the first sample is not a reason a level slowed
    }
    assert second["samples"] == 0 and second["sm_mhz_mean"] is None and second["reasons"] == []
