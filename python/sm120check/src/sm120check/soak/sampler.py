"""The soak's sampler: a child process that reads every GPU once a second through NVML and waits for Xid events.

    python -m sm120check.soak.sampler --out soak.jsonl --duration 300 [--stop FILE] [--gpus 0,1]

It appends one `GpuSample` line per GPU per interval and one `XidSample` line per NVML Xid event to --out (flushed
as written, so a kill keeps what was read), announces each interval on stderr (`child.step`: the parent's watchdog
reads silence as a hung NVML call) and prints a one-line JSON summary last (`child.emit`). It reads only: no clock,
power, fan or application-clock setting is changed. The NVML binding is the doctor's (doctor/gpu/nvml_health).
Events: nvmlEventSetCreate, nvmlDeviceRegisterEvents(nvmlEventTypeXidCriticalError), nvmlEventSetWait_v2 with a
short timeout, so the loop never blocks longer than EVENT_WAIT_MS per wait.
"""

from __future__ import annotations

import argparse
import ctypes
import struct
import sys
import time
from pathlib import Path
from typing import IO

from sm120check.doctor import child
from sm120check.doctor.gpu.nvml_health import SUCCESS, Nvml
from sm120check.doctor.nvml_api import NvmlUnavailable
from sm120check.soak.samples import GpuSample, SamplerNote, XidSample, to_line

EVENT_XID = 0x8  # nvmlEventTypeXidCriticalError
ERROR_TIMEOUT = 10  # NVML_ERROR_TIMEOUT: no event in the wait
LOST_CODES = (15, 16)  # NVML_ERROR_GPU_IS_LOST, NVML_ERROR_RESET_REQUIRED
EVENT_WAIT_MS = 200
_CLOCK_SM, _CLOCK_MEM = 1, 2  # nvmlClockType_t
_SLOWDOWN = 1  # NVML_TEMPERATURE_THRESHOLD_SLOWDOWN
_FI_MEMORY_TEMP = 82  # NVML_FI_DEV_MEMORY_TEMP
_CORRECTED, _UNCORRECTED, _VOLATILE = 0, 1, 0


class EventData(ctypes.Structure):
    """nvmlEventData_t."""

    _fields_ = [
        ("device", ctypes.c_void_p),
        ("eventType", ctypes.c_ulonglong),
        ("eventData", ctypes.c_ulonglong),
        ("gpuInstanceId", ctypes.c_uint),
        ("computeInstanceId", ctypes.c_uint),
    ]


class FieldValue(ctypes.Structure):
    """nvmlFieldValue_t (the value union read as its 8 bytes)."""

    _fields_ = [
        ("fieldId", ctypes.c_uint),
        ("scopeId", ctypes.c_uint),
        ("timestamp", ctypes.c_longlong),
        ("latencyUsec", ctypes.c_longlong),
        ("valueType", ctypes.c_uint),
        ("nvmlReturn", ctypes.c_uint),
        ("value", ctypes.c_ulonglong),
    ]


class Utilization(ctypes.Structure):
    """nvmlUtilization_t."""

    _fields_ = [("gpu", ctypes.c_uint), ("memory", ctypes.c_uint)]


def _field_value(value: FieldValue) -> int | None:
    if value.nvmlReturn != SUCCESS:
        return None
    if value.valueType == 0:  # NVML_VALUE_TYPE_DOUBLE
        return int(struct.unpack("<d", struct.pack("<Q", value.value))[0])
    return int(value.value)


class Reader:
    """Reads one GpuSample per call through the doctor's Nvml; remembers which GPU a handle is for events."""

    def __init__(self, nvml: Nvml, indices: list[int]) -> None:
        self.nvml = nvml
        self.handles = {i: nvml.handle(i) for i in indices}
        self.names = {i: self._name(h) for i, h in self.handles.items()}
        self.events: ctypes.c_void_p | None = None
        self.event_note = ""

    def _name(self, handle: ctypes.c_void_p) -> str:
        buf = ctypes.create_string_buffer(96)
        return buf.value.decode() if self.nvml.raw("nvmlDeviceGetName", handle, buf, 96) == SUCCESS else ""

    def _uint(self, func: str, handle: ctypes.c_void_p, *lead: object) -> tuple[int | None, int]:
        value = ctypes.c_uint()
        code = self.nvml.raw(func, handle, *lead, ctypes.byref(value))
        return (value.value if code == SUCCESS else None), code

    def _ull(self, func: str, handle: ctypes.c_void_p, *lead: object) -> tuple[int | None, int]:
        value = ctypes.c_ulonglong()
        code = self.nvml.raw(func, handle, *lead, ctypes.byref(value))
        return (value.value if code == SUCCESS else None), code

    def sample(self, index: int) -> GpuSample:
        h = self.handles[index]
        self.nvml.step(f"NVML reads of GPU {index}")
        codes: list[int] = []

        def u(func: str, *lead: object) -> int | None:
            value, code = self._uint(func, h, *lead)
            codes.append(code)
            return value

        def ull(func: str, *lead: object) -> int | None:
            value, code = self._ull(func, h, *lead)
            codes.append(code)
            return value

        reasons = self.nvml.clock_reasons(h)
        rows = [ctypes.c_uint() for _ in range(4)]
        rows_ok = self.nvml.raw("nvmlDeviceGetRemappedRows", h, *(ctypes.byref(r) for r in rows)) == SUCCESS
        util = Utilization()
        util_code = self.nvml.raw("nvmlDeviceGetUtilizationRates", h, ctypes.byref(util))
        field = FieldValue(fieldId=_FI_MEMORY_TEMP)
        mem_temp = (
            _field_value(field) if self.nvml.raw("nvmlDeviceGetFieldValues", h, 1, ctypes.byref(field)) == 0 else None
        )
        sample = GpuSample(
            t=time.time(),
            gpu=index,
            name=self.names[index],
            sm_mhz=u("nvmlDeviceGetClockInfo", _CLOCK_SM),
            mem_mhz=u("nvmlDeviceGetClockInfo", _CLOCK_MEM),
            base_sm_mhz=u("nvmlDeviceGetDefaultApplicationsClock", _CLOCK_SM),
            reasons=reasons.value if reasons.ok else None,
            power_mw=u("nvmlDeviceGetPowerUsage"),
            power_limit_mw=u("nvmlDeviceGetEnforcedPowerLimit"),
            temperature_c=u("nvmlDeviceGetTemperature", 0),
            memory_temperature_c=mem_temp,
            slowdown_c=u("nvmlDeviceGetTemperatureThreshold", _SLOWDOWN),
            fan_percent=u("nvmlDeviceGetFanSpeed"),
            utilization=util.gpu if util_code == SUCCESS else None,
            ecc_corrected=ull("nvmlDeviceGetTotalEccErrors", _CORRECTED, _VOLATILE),
            ecc_uncorrected=ull("nvmlDeviceGetTotalEccErrors", _UNCORRECTED, _VOLATILE),
            remap_pending=rows[2].value if rows_ok else None,
            remap_failure=rows[3].value if rows_ok else None,
            pcie_gen=u("nvmlDeviceGetCurrPcieLinkGeneration"),
            pcie_width=u("nvmlDeviceGetCurrPcieLinkWidth"),
            pcie_replay=u("nvmlDeviceGetPcieReplayCounter"),
        )
        lost = next((c for c in [*codes, util_code] if c in LOST_CODES), None)
        if lost is not None:
            return GpuSample(t=sample.t, gpu=index, name=sample.name, lost=self.nvml.status(lost))
        return sample

    def register_events(self) -> None:
        """An event set for Xid events on every GPU; where NVML refuses, `event_note` says so (samples go on)."""
        events = ctypes.c_void_p()
        code = self.nvml.raw("nvmlEventSetCreate", ctypes.byref(events))
        if code != SUCCESS:
            self.event_note = f"nvmlEventSetCreate: {self.nvml.status(code)}"
            return
        refused = []
        for index, h in self.handles.items():
            code = self.nvml.raw("nvmlDeviceRegisterEvents", h, ctypes.c_ulonglong(EVENT_XID), events)
            if code != SUCCESS:
                refused.append(f"GPU {index}: {self.nvml.status(code)}")
        self.events = events
        if refused:
            self.event_note = "nvmlDeviceRegisterEvents refused Xid events on " + "; ".join(refused)

    def wait_events(self, seconds: float) -> list[XidSample]:
        """Xid events that arrive within `seconds` (waits of EVENT_WAIT_MS); sleeps when no event set exists."""
        end = time.monotonic() + seconds
        found: list[XidSample] = []
        while (left := end - time.monotonic()) > 0:
            if self.events is None:
                time.sleep(left)
                break
            data = EventData()
            wait = max(1, min(EVENT_WAIT_MS, int(left * 1000)))
            code = self.nvml.raw("nvmlEventSetWait_v2", self.events, ctypes.byref(data), wait)
            if code == SUCCESS and data.eventType & EVENT_XID:
                gpu = next((i for i, h in self.handles.items() if h.value == data.device), None)
                found.append(XidSample(time.time(), int(data.eventData), gpu, source="nvml"))
            elif code not in (SUCCESS, ERROR_TIMEOUT):
                self.event_note = f"nvmlEventSetWait_v2: {self.nvml.status(code)}"
                self.events = None
        return found

    def close(self) -> None:
        if self.events is not None:
            self.nvml.raw("nvmlEventSetFree", self.events)


def _write(out: IO[str], line: str) -> None:
    out.write(line + "\n")
    out.flush()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sm120check.soak.sampler")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--duration", type=float, required=True)
    parser.add_argument("--interval", type=float, default=1.0)
    parser.add_argument("--stop", type=Path, help="end at the next interval once this file exists")
    parser.add_argument("--gpus", default="", help="NVML indices, comma-separated (default: all)")
    args = parser.parse_args(argv)
    deadline = time.monotonic() + max(0.0, args.duration)
    with args.out.open("a", encoding="utf-8") as out:
        try:
            nvml = Nvml.open(child.step)
        except NvmlUnavailable as exc:
            _write(out, to_line(SamplerNote(time.time(), "failed", str(exc))))
            child.emit({"ok": False, "error": str(exc)})
            return 1
        intervals = 0
        try:
            indices = child.gpu_indices(args.gpus) or list(range(nvml.count()))
            reader = Reader(nvml, indices)
            reader.register_events()
            _write(out, to_line(SamplerNote(time.time(), "start", reader.event_note or f"GPUs {indices}")))
            while time.monotonic() < deadline and not (args.stop and args.stop.exists()):
                child.step(f"interval {intervals}")
                for index in indices:
                    _write(out, to_line(reader.sample(index)))
                child.step(f"interval {intervals}: Xid event wait")
                for event in reader.wait_events(min(args.interval, max(0.0, deadline - time.monotonic()))):
                    _write(out, to_line(event))
                intervals += 1
            reader.close()
            _write(out, to_line(SamplerNote(time.time(), "end", reader.event_note)))
        finally:
            nvml.close()
    child.emit({"ok": True, "intervals": intervals, "gpus": len(indices), "events": reader.event_note or "ok"})
    return 0


if __name__ == "__main__":
    sys.exit(main())
