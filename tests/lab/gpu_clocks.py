"""Per bench level, the GPU's clocks, power and temperature while it ran: `sm120check.soak.sampler`'s lines (one a
second) joined with the bench's level_started_epoch and level_ended_epoch. Two starts of one launch whose GPU
milliseconds per token differ are then told apart: other clocks (a power cap, a thermal slowdown) or the same clocks
and slower kernels (what the start chose)."""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from sm120check.doctor.node_health.verdicts import reason_names
from sm120check.soak.samples import GpuSample, SampleError, from_json


def samples(lines: Iterable[str]) -> list[GpuSample]:
    """The GPU samples of a sampler file; notes, Xid events and lines that do not parse are left out."""
    out = []
    for line in lines:
        try:
            found = from_json(json.loads(line))
        except (ValueError, SampleError):
            continue
        if isinstance(found, GpuSample) and not found.lost:
            out.append(found)
    return out


def per_level(gpu: list[GpuSample], rows: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """For each bench line (a level of one sweep): the samples inside its window, their mean and lowest SM clock, mean
    power, highest temperature and every clock-event reason seen (the idle bit left out: a level is never idle)."""
    out = []
    for row in rows:
        lo, hi = float(row["level_started_epoch"]), float(row["level_ended_epoch"])
        inside = [s for s in gpu if lo <= s.t <= hi]
        sm = [s.sm_mhz for s in inside if s.sm_mhz is not None]
        power = [s.power_mw for s in inside if s.power_mw is not None]
        temps = [s.temperature_c for s in inside if s.temperature_c is not None]
        mask = 0
        for s in inside:
            mask |= s.reasons or 0
        out.append(
            {
                "label": row["label"],
                "concurrency": int(row["concurrency"]),
                "samples": len(inside),
                "sm_mhz_mean": round(sum(sm) / len(sm)) if sm else None,
                "sm_mhz_min": min(sm) if sm else None,
                "power_w_mean": round(sum(power) / len(power) / 1000, 1) if power else None,
                "temperature_c_max": max(temps) if temps else None,
                "reasons": reason_names(mask & ~0x1),
            }
        )
    return out
