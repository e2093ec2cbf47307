"""The soak's record: the JSONL time series, the doctor's JSON / JUnit / Prometheus reports of its verdicts, a PNG.

soak.jsonl: a first `{"kind": "meta", ...}` line (host, start, arguments), then one line per sample (soak/samples.py)
appended as they are read: the sampler child writes the GPU and Xid lines live, the parent adds the server's
intervals, the kernel log's Xids and the sampler's fate once the soak ends. The reports are the doctor's writers
(doctor/report.py) over the verdicts, so a fleet and node_exporter read a soak like a doctor run.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path

from sm120check.bench.plot import _pyplot
from sm120check.doctor import report
from sm120check.doctor.model import Result
from sm120check.soak.samples import GpuSample, Sample, ServerInterval, XidSample, to_line
from sm120check.soak.verdicts import HW_SLOWDOWN, POWER, THERMAL, runs

JSONL, JSON, JUNIT, PROM, PNG = "soak.jsonl", "soak.json", "soak.junit.xml", "soak.prom", "soak.png"


def write_meta(path: Path, meta: Mapping[str, object]) -> None:
    with path.open("a", encoding="utf-8") as out:
        out.write(json.dumps({"kind": "meta", **meta}, sort_keys=True, default=str) + "\n")


def append(path: Path, samples: Sequence[Sample]) -> None:
    with path.open("a", encoding="utf-8") as out:
        for sample in samples:
            out.write(to_line(sample) + "\n")


def write_reports(folder: Path, results: Sequence[Result], info: report.RunInfo) -> list[Path]:
    written = []
    for name, text in (
        (JSON, report.to_json(results, info)),
        (JUNIT, report.to_junit(results, info)),
        (PROM, report.to_prometheus(results, info)),
    ):
        report.write_file(folder / name, text)
        written.append(folder / name)
    return written


def plot(path: Path, samples: Sequence[Sample], start: float) -> list[str]:
    """tokens/s, SM clock, power, temperatures and fan over time (s into the soak); Xids as red lines, thermal and
    power throttling as shaded spans. Returns the notes written on panels that have no data."""
    plt = _pyplot()
    fig, axes = plt.subplots(5, 1, figsize=(10, 12), sharex=True)
    server = [s for s in samples if isinstance(s, ServerInterval)]
    gpus: dict[int, list[GpuSample]] = {}
    for s in samples:
        if isinstance(s, GpuSample) and not s.lost:
            gpus.setdefault(s.gpu, []).append(s)
    tok, sm, power, temp, fan = axes
    if server:
        tok.plot([i.t - start for i in server], [i.tokens_per_s for i in server], label="tokens/s")
        errs = [i.t - start for i in server if i.errors]
        if errs:
            tok.plot(errs, [0] * len(errs), "rx", label="failed requests")
        tok.legend(loc="upper right")
    tok.set_ylabel("tokens/s")
    for gpu, rows in sorted(gpus.items()):
        x = [s.t - start for s in rows]
        sm.plot(x, [s.sm_mhz for s in rows], label=f"GPU {gpu} SM")
        power.plot(x, [(s.power_mw or 0) / 1000 for s in rows], label=f"GPU {gpu}")
        limits = {s.power_limit_mw for s in rows if s.power_limit_mw}
        for limit in limits:
            power.axhline(limit / 1000, linestyle=":", color="grey")
        temp.plot(x, [s.temperature_c for s in rows], label=f"GPU {gpu}")
        if any(s.memory_temperature_c is not None for s in rows):
            temp.plot(x, [s.memory_temperature_c for s in rows], linestyle="--", label=f"GPU {gpu} memory")
        for slowdown in {s.slowdown_c for s in rows if s.slowdown_c}:
            temp.axhline(slowdown, linestyle=":", color="red")
        if any(s.fan_percent is not None for s in rows):
            fan.plot(x, [s.fan_percent for s in rows], label=f"GPU {gpu}")
        for first, last in runs(rows, lambda s: bool((s.reasons or 0) & (THERMAL | POWER | HW_SLOWDOWN))):
            for ax in axes:
                ax.axvspan(first - start - 0.5, last - start + 0.5, color="orange", alpha=0.15, lw=0)
        base = {s.base_sm_mhz for s in rows if s.base_sm_mhz}
        for mhz in base:
            sm.axhline(mhz, linestyle=":", color="grey")
    for xid in (s for s in samples if isinstance(s, XidSample)):
        for ax in axes:
            ax.axvline(xid.t - start, color="red")
        tok.annotate(f"Xid {xid.xid}", (xid.t - start, 0), color="red", rotation=90, va="bottom")
    sm.set_ylabel("SM MHz")
    power.set_ylabel("power W")
    temp.set_ylabel("temperature C")
    fan.set_ylabel("fan %")
    notes = []
    if gpus and not any(s.fan_percent is not None for rows in gpus.values() for s in rows):
        notes.append("NVML gave no fan speed (a board without fans of its own)")
        fan.text(0.5, 0.5, notes[-1], ha="center", va="center", transform=fan.transAxes)
    fan.set_xlabel("seconds into the soak (orange: thermal/power throttling; red: Xid)")
    for ax in axes[1:]:
        if ax.get_legend_handles_labels()[0]:
            ax.legend(loc="upper right", fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return notes
