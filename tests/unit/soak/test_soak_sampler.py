"""The sampler's structs match nvml.h, and its reader turns NVML answers into GpuSample and XidSample values.
`FakeNvmlLib` stands in for libnvidia-ml.so.1 because this machine has no NVIDIA driver: it answers each call with a
code and fills the call's last out-parameter."""

from __future__ import annotations

import ctypes
from typing import Any

from sm120check.bench.closedloop import RequestRecord
from sm120check.doctor.gpu.nvml_health import Nvml
from sm120check.soak import sampler
from sm120check.soak.drive import intervals


def test_struct_layouts_match_nvml_h() -> None:
    # nvmlEventData_t: nvmlDevice_t device; unsigned long long eventType, eventData; unsigned int gpuInstanceId,
    # computeInstanceId
    assert ctypes.sizeof(sampler.EventData) == 32 and sampler.EventData.eventData.offset == 16
    # nvmlFieldValue_t: unsigned int fieldId, scopeId; long long timestamp, latencyUsec; nvmlValueType_t valueType;
    # nvmlReturn_t nvmlReturn; nvmlValue_t value (8 bytes)
    assert ctypes.sizeof(sampler.FieldValue) == 40 and sampler.FieldValue.value.offset == 32


VALUES = {
    "nvmlDeviceGetPowerUsage": 575_000,
    "nvmlDeviceGetEnforcedPowerLimit": 600_000,
    "nvmlDeviceGetTemperature": 71,
    "nvmlDeviceGetTemperatureThreshold": 92,
    "nvmlDeviceGetFanSpeed": 55,
    "nvmlDeviceGetCurrPcieLinkGeneration": 5,
    "nvmlDeviceGetCurrPcieLinkWidth": 16,
    "nvmlDeviceGetPcieReplayCounter": 3,
    "nvmlDeviceGetDefaultApplicationsClock": 1590,
    "nvmlDeviceGetCurrentClocksEventReasons": 0x4,
    "nvmlDeviceGetTotalEccErrors": 0,
}


class FakeNvmlLib:
    def __init__(self, codes: dict[str, int] | None = None, xid: int | None = None) -> None:
        self.codes = codes or {}
        self.xid = xid

    def __getattr__(self, name: str) -> Any:
        if name == "nvmlErrorString":
            return lambda code: b"GPU is lost" if code == 15 else b"Unknown Error"

        def call(*args: Any) -> int:
            code = self.codes.get(name, 0)
            if code:
                return code
            out: Any = getattr(args[-1], "_obj", None) if args else None
            if name == "nvmlDeviceGetHandleByIndex_v2":
                out.value = 0x1000 + args[0]
            elif name == "nvmlDeviceGetClockInfo":
                out.value = 2400 if args[1] == 1 else 13801
            elif name == "nvmlEventSetWait_v2":
                if self.xid is None:
                    return sampler.ERROR_TIMEOUT
                args[1]._obj.device, args[1]._obj.eventType, args[1]._obj.eventData = (
                    0x1000,
                    sampler.EVENT_XID,
                    self.xid,
                )
                self.xid = None
            elif name in VALUES and out is not None:
                out.value = VALUES[name]
            return 0

        return call


def reader(lib: FakeNvmlLib) -> sampler.Reader:
    return sampler.Reader(Nvml(lib), [0])  # type: ignore[arg-type]


def test_a_sample_carries_what_nvml_answered() -> None:
    s = reader(FakeNvmlLib()).sample(0)
    assert (s.sm_mhz, s.mem_mhz, s.base_sm_mhz, s.reasons) == (2400, 13801, 1590, 0x4)
    assert (s.power_mw, s.power_limit_mw, s.temperature_c, s.slowdown_c, s.fan_percent) == (
        575_000,
        600_000,
        71,
        92,
        55,
    )
    assert (s.pcie_gen, s.pcie_width, s.pcie_replay, s.ecc_uncorrected, s.lost) == (5, 16, 3, 0, "")


def test_a_lost_gpu_is_a_sample_that_says_so() -> None:
    s = reader(FakeNvmlLib({"nvmlDeviceGetTemperature": 15})).sample(0)
    assert s.lost == "NVML error 15 (GPU is lost)" and s.sm_mhz is None


def test_an_unsupported_reading_is_none_not_a_failure() -> None:
    s = reader(FakeNvmlLib({"nvmlDeviceGetFanSpeed": 3})).sample(0)
    assert s.fan_percent is None and s.temperature_c == 71 and not s.lost


def test_an_xid_event_names_its_gpu() -> None:
    r = reader(FakeNvmlLib(xid=119))
    r.register_events()
    events = r.wait_events(0.05)
    assert [(e.xid, e.gpu, e.source) for e in events] == [(119, 0, "nvml")]


def test_intervals_count_tokens_failures_and_requests_in_flight() -> None:
    epoch, start = 1000.0, 1010.0  # perf_counter 10.0 is Unix 1010.0
    ok = RequestRecord(False, 10.0, 10.1, 12.5, 10.5, ((10.5, 5), (11.5, 7)))
    failed = RequestRecord(False, 10.0, 10.2, 11.2, error="connection reset by the server", partial=((10.8, 3),))
    got = intervals([ok, failed], epoch, start, start + 3)
    assert [i.tokens for i in got] == [8, 7, 0]
    assert [i.errors for i in got] == [0, 1, 0] and got[1].error == "connection reset by the server"
    assert [i.done for i in got] == [0, 0, 1]
    assert [i.in_flight for i in got] == [2, 1, 0]
