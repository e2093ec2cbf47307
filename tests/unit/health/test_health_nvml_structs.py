"""The ctypes structs match nvml.h's layouts (a wrong struct silently reads garbage), and the readers keep NVML's
return codes as values. `FakeLib` is a stand-in for libnvidia-ml: this machine has no NVIDIA driver."""

from __future__ import annotations

import ctypes
from typing import Any

from sm120check.doctor.gpu import nvml_health
from sm120check.doctor.gpu.nvml_health import Bar1Memory, Memory, Nvml, ProcessInfo
from sm120check.doctor.nvml_api import PciInfo


def test_struct_sizes_match_nvml_h() -> None:
    # nvmlMemory_t / nvmlBAR1Memory_t: three unsigned long long
    assert ctypes.sizeof(Memory) == 24 and ctypes.sizeof(Bar1Memory) == 24
    # nvmlProcessInfo_t: unsigned int pid; (4 pad) unsigned long long usedGpuMemory; unsigned int gpuInstanceId,
    # computeInstanceId
    assert ctypes.sizeof(ProcessInfo) == 24
    assert ProcessInfo.usedGpuMemory.offset == 8 and ProcessInfo.computeInstanceId.offset == 20
    # nvmlPciInfo_t: char busIdLegacy[16] (NVML_DEVICE_PCI_BUS_ID_BUFFER_V2_SIZE); 5 unsigned int; char busId[32]
    assert ctypes.sizeof(PciInfo) == 16 + 5 * 4 + 32
    assert PciInfo.busId.offset == 36


class FakeLib:
    """Stand-in for libnvidia-ml.so.1: answers a few calls, lacks nvmlDeviceGetGpuMaxPcieLinkGeneration."""

    def __init__(self, codes: dict[str, int]) -> None:
        self.codes = codes

    def __getattr__(self, name: str) -> Any:
        if name == "nvmlErrorString":
            func: Any = lambda code: b"Not Supported" if code == 3 else b"Unknown Error"  # noqa: E731
            return func
        if name not in self.codes:
            raise AttributeError(name)

        def call(*args: Any) -> int:
            if self.codes[name] == 0 and name == "nvmlDeviceGetCurrPcieLinkGeneration":
                args[-1]._obj.value = 5
            return self.codes[name]

        return call


def test_not_supported_and_missing_symbol_are_values() -> None:
    fake = FakeLib({"nvmlDeviceGetCurrPcieLinkGeneration": 0, "nvmlDeviceGetPcieReplayCounter": 3})
    nvml = Nvml(fake)  # type: ignore[arg-type]
    handle = ctypes.c_void_p(1)
    assert nvml.uint("nvmlDeviceGetCurrPcieLinkGeneration", handle).value == 5
    assert nvml.uint("nvmlDeviceGetPcieReplayCounter", handle).status == "not supported"
    assert nvml.uint("nvmlDeviceGetGpuMaxPcieLinkGeneration", handle).status == "not in this driver"
    assert nvml.processes(handle) == ((), "not in this driver")


def test_clock_reasons_fall_back_to_the_old_name() -> None:
    fake = FakeLib({"nvmlDeviceGetCurrentClocksThrottleReasons": 3})
    reading = Nvml(fake).clock_reasons(ctypes.c_void_p(1))  # type: ignore[arg-type]
    assert reading.status == "not supported"


def test_value_not_available_constant() -> None:
    assert nvml_health.VALUE_NOT_AVAILABLE == 2**64 - 1
