"""Per-GPU health readings through ctypes on libnvidia-ml.so.1 (pynvml is not guaranteed on a node).

Only the child gpu/node_health_probe.py loads this. Every call's return code is kept as the reading's status:
NVML_ERROR_NOT_SUPPORTED is "not supported" (a value, not a crash); a symbol missing from this driver's
libnvidia-ml is "not in this driver". The structs below follow nvml.h field for field (tests check the sizes).
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from sm120check import bounded
from sm120check.doctor.gpu.payloads import (
    NOT_IN_DRIVER,
    NOT_SUPPORTED,
    OK,
    ClockSample,
    GpuHealth,
    GpuProcess,
    LinkSample,
    Reading,
    missing,
)
from sm120check.doctor.nvml_api import NvmlUnavailable, PciInfo

SONAME = "libnvidia-ml.so.1"

# nvml.h return codes the readers treat specially
SUCCESS = 0
ERROR_NOT_SUPPORTED = 3
ERROR_INSUFFICIENT_SIZE = 7
VALUE_NOT_AVAILABLE = 0xFFFFFFFFFFFFFFFF  # NVML_VALUE_NOT_AVAILABLE for unsigned long long fields

# nvml.h enums
_MEMORY_ERROR_UNCORRECTED = 1  # nvmlMemoryErrorType_t NVML_MEMORY_ERROR_TYPE_UNCORRECTED
_VOLATILE_ECC, _AGGREGATE_ECC = 0, 1  # nvmlEccCounterType_t
_RETIRE_MULTIPLE_SBE, _RETIRE_DBE = 0, 1  # nvmlPageRetirementCause_t
_TEMPERATURE_GPU = 0  # nvmlTemperatureSensors_t
_CLOCK_SM = 1  # nvmlClockType_t NVML_CLOCK_SM


class Memory(ctypes.Structure):
    """nvmlMemory_t (v1): total, free, used in bytes."""

    _fields_ = [("total", ctypes.c_ulonglong), ("free", ctypes.c_ulonglong), ("used", ctypes.c_ulonglong)]


class Bar1Memory(ctypes.Structure):
    """nvmlBAR1Memory_t."""

    _fields_ = [("bar1Total", ctypes.c_ulonglong), ("bar1Free", ctypes.c_ulonglong), ("bar1Used", ctypes.c_ulonglong)]


class ProcessInfo(ctypes.Structure):
    """nvmlProcessInfo_t, the element of nvmlDeviceGetComputeRunningProcesses_v3 (same layout as _v2_t)."""

    _fields_ = [
        ("pid", ctypes.c_uint),
        ("usedGpuMemory", ctypes.c_ulonglong),
        ("gpuInstanceId", ctypes.c_uint),
        ("computeInstanceId", ctypes.c_uint),
    ]


def _quiet(text: str) -> None:
    pass


@dataclass
class Nvml:
    """A loaded, initialised NVML. `close()` shuts it down; handles are valid until then."""

    lib: ctypes.CDLL
    step: Callable[[str], None] = _quiet

    @classmethod
    def open(cls, step: Callable[[str], None] = _quiet) -> Nvml:
        step(f"dlopen {SONAME}")
        try:
            lib = ctypes.CDLL(SONAME)
        except OSError as exc:
            raise NvmlUnavailable(f"{SONAME} does not load: {exc} (no NVIDIA driver on this host?)") from None
        nvml = cls(lib, step)
        step("nvmlInit_v2")
        code = nvml.raw("nvmlInit_v2")
        if code != SUCCESS:
            raise NvmlUnavailable(f"nvmlInit_v2 returned {nvml.status(code)}")
        return nvml

    def close(self) -> None:
        self.step("nvmlShutdown")
        self.raw("nvmlShutdown")

    def has(self, func: str) -> bool:
        return hasattr(self.lib, func)

    def raw(self, func: str, *args: object) -> int:
        """Call an NVML function; -1 when this driver's library lacks the symbol."""
        if not self.has(func):
            return -1
        return int(getattr(self.lib, func)(*args))

    def status(self, code: int) -> str:
        if code == SUCCESS:
            return OK
        if code == -1:
            return NOT_IN_DRIVER
        if code == ERROR_NOT_SUPPORTED:
            return NOT_SUPPORTED
        text = self.lib.nvmlErrorString
        text.restype = ctypes.c_char_p
        message = text(code)
        return f"NVML error {code} ({message.decode() if isinstance(message, bytes) else message})"

    def uint(self, func: str, handle: ctypes.c_void_p, *lead: object) -> Reading:
        """A function filling one unsigned int after `lead` arguments."""
        value = ctypes.c_uint()
        code = self.raw(func, handle, *lead, ctypes.byref(value))
        return Reading(value.value) if code == SUCCESS else missing(self.status(code))

    def ulonglong(self, func: str, handle: ctypes.c_void_p, *lead: object) -> Reading:
        value = ctypes.c_ulonglong()
        code = self.raw(func, handle, *lead, ctypes.byref(value))
        return Reading(value.value) if code == SUCCESS else missing(self.status(code))

    def pair(self, func: str, handle: ctypes.c_void_p) -> tuple[Reading, Reading]:
        """A function filling (current, pending) unsigned ints (ECC mode, MIG mode)."""
        current, pending = ctypes.c_uint(), ctypes.c_uint()
        code = self.raw(func, handle, ctypes.byref(current), ctypes.byref(pending))
        if code != SUCCESS:
            return missing(self.status(code)), missing(self.status(code))
        return Reading(current.value), Reading(pending.value)

    def count(self) -> int:
        value = ctypes.c_uint()
        code = self.raw("nvmlDeviceGetCount_v2", ctypes.byref(value))
        if code != SUCCESS:
            raise NvmlUnavailable(f"nvmlDeviceGetCount_v2 returned {self.status(code)}")
        return value.value

    def handle(self, index: int) -> ctypes.c_void_p:
        handle = ctypes.c_void_p()
        code = self.raw("nvmlDeviceGetHandleByIndex_v2", index, ctypes.byref(handle))
        if code != SUCCESS:
            raise NvmlUnavailable(f"nvmlDeviceGetHandleByIndex_v2({index}) returned {self.status(code)}")
        return handle

    def driver(self) -> str:
        buf = ctypes.create_string_buffer(96)
        return buf.value.decode() if self.raw("nvmlSystemGetDriverVersion", buf, 96) == SUCCESS else ""

    def clock_reasons(self, handle: ctypes.c_void_p) -> Reading:
        reading = self.ulonglong("nvmlDeviceGetCurrentClocksEventReasons", handle)
        if reading.status == NOT_IN_DRIVER:  # drivers before r535 name it ...ThrottleReasons
            reading = self.ulonglong("nvmlDeviceGetCurrentClocksThrottleReasons", handle)
        return reading

    def link_sample(self, handle: ctypes.c_void_p) -> LinkSample:
        """What the sampler thread reads while copies run."""
        gen = self.uint("nvmlDeviceGetCurrPcieLinkGeneration", handle)
        width = self.uint("nvmlDeviceGetCurrPcieLinkWidth", handle)
        reasons = self.clock_reasons(handle)
        return LinkSample(gen.value if gen.ok else None, width.value if width.ok else None, reasons.value)

    def clock_sample(self, handle: ctypes.c_void_p) -> ClockSample:
        """What the sampler thread reads while the compute kernel runs."""
        reasons = self.clock_reasons(handle)
        sm = self.uint("nvmlDeviceGetClockInfo", handle, _CLOCK_SM)
        power = self.uint("nvmlDeviceGetPowerUsage", handle)
        temperature = self.uint("nvmlDeviceGetTemperature", handle, _TEMPERATURE_GPU)
        return ClockSample(reasons.value, sm.value, power.value, temperature.value)

    def processes(self, handle: ctypes.c_void_p) -> tuple[tuple[GpuProcess, ...], str]:
        func = "nvmlDeviceGetComputeRunningProcesses_v3"
        if not self.has(func):
            return (), NOT_IN_DRIVER
        count = ctypes.c_uint(0)
        code = self.raw(func, handle, ctypes.byref(count), None)
        if code == SUCCESS and count.value == 0:
            return (), OK
        if code not in (SUCCESS, ERROR_INSUFFICIENT_SIZE):
            return (), self.status(code)
        for _ in range(3):  # processes may start between the two calls: grow and retry
            room = count.value + 8
            infos = (ProcessInfo * room)()
            count = ctypes.c_uint(room)
            code = self.raw(func, handle, ctypes.byref(count), infos)
            if code == SUCCESS:
                found = []
                for info in infos[: count.value]:
                    used = None if info.usedGpuMemory == VALUE_NOT_AVAILABLE else int(info.usedGpuMemory)
                    found.append(GpuProcess(int(info.pid), used, _comm(int(info.pid))))
                return tuple(found), OK
            if code != ERROR_INSUFFICIENT_SIZE:
                return (), self.status(code)
        return (), self.status(ERROR_INSUFFICIENT_SIZE)

    def retired_pages(self, handle: ctypes.c_void_p) -> Reading:
        total = 0
        for cause in (_RETIRE_MULTIPLE_SBE, _RETIRE_DBE):
            count = ctypes.c_uint(0)
            code = self.raw("nvmlDeviceGetRetiredPages", handle, cause, ctypes.byref(count), None)
            if code not in (SUCCESS, ERROR_INSUFFICIENT_SIZE):  # a size query answers INSUFFICIENT_SIZE with count
                return missing(self.status(code))
            total += count.value
        return Reading(total)

    def gpu(self, index: int) -> GpuHealth:
        self.step(f"NVML health queries on GPU {index}")
        h = ctypes.c_void_p()
        code = self.raw("nvmlDeviceGetHandleByIndex_v2", index, ctypes.byref(h))
        if code != SUCCESS:
            return GpuHealth.unreadable(index, self.status(code))
        name_buf = ctypes.create_string_buffer(96)
        name = name_buf.value.decode() if self.raw("nvmlDeviceGetName", h, name_buf, 96) == SUCCESS else ""
        pci = PciInfo()
        bus = pci.busId.decode() if self.raw("nvmlDeviceGetPciInfo_v3", h, ctypes.byref(pci)) == SUCCESS else ""

        mem = Memory()
        code = self.raw("nvmlDeviceGetMemoryInfo", h, ctypes.byref(mem))
        mem_total, mem_used = (
            (Reading(mem.total), Reading(mem.used)) if code == SUCCESS else (missing(self.status(code)),) * 2
        )
        bar = Bar1Memory()
        code = self.raw("nvmlDeviceGetBAR1MemoryInfo", h, ctypes.byref(bar))
        bar_total, bar_used = (
            (Reading(bar.bar1Total), Reading(bar.bar1Used)) if code == SUCCESS else (missing(self.status(code)),) * 2
        )

        rows = [ctypes.c_uint() for _ in range(4)]
        code = self.raw("nvmlDeviceGetRemappedRows", h, *(ctypes.byref(r) for r in rows))
        remap = [Reading(r.value) if code == SUCCESS else missing(self.status(code)) for r in rows]

        ecc_mode, ecc_pending = self.pair("nvmlDeviceGetEccMode", h)
        mig_mode, mig_pending = self.pair("nvmlDeviceGetMigMode", h)
        procs, procs_status = self.processes(h)
        uncorrected = _MEMORY_ERROR_UNCORRECTED
        return GpuHealth(
            index=index,
            name=name,
            bus_id=bus,
            memory_total=mem_total,
            memory_used=mem_used,
            pcie_gen=self.uint("nvmlDeviceGetCurrPcieLinkGeneration", h),
            pcie_width=self.uint("nvmlDeviceGetCurrPcieLinkWidth", h),
            pcie_gen_max=self.uint("nvmlDeviceGetMaxPcieLinkGeneration", h),
            pcie_gen_gpu_max=self.uint("nvmlDeviceGetGpuMaxPcieLinkGeneration", h),
            pcie_width_max=self.uint("nvmlDeviceGetMaxPcieLinkWidth", h),
            pcie_replay=self.uint("nvmlDeviceGetPcieReplayCounter", h),
            ecc_mode=ecc_mode,
            ecc_mode_pending=ecc_pending,
            ecc_uncorrected_volatile=self.ulonglong("nvmlDeviceGetTotalEccErrors", h, uncorrected, _VOLATILE_ECC),
            ecc_uncorrected_aggregate=self.ulonglong("nvmlDeviceGetTotalEccErrors", h, uncorrected, _AGGREGATE_ECC),
            retired_pages=self.retired_pages(h),
            retired_pending=self.uint("nvmlDeviceGetRetiredPagesPendingStatus", h),
            remap_correctable=remap[0],
            remap_uncorrectable=remap[1],
            remap_pending=remap[2],
            remap_failure=remap[3],
            clock_reasons=self.clock_reasons(h),
            power_limit_mw=self.uint("nvmlDeviceGetPowerManagementLimit", h),
            power_default_mw=self.uint("nvmlDeviceGetPowerManagementDefaultLimit", h),
            power_enforced_mw=self.uint("nvmlDeviceGetEnforcedPowerLimit", h),
            temperature_c=self.uint("nvmlDeviceGetTemperature", h, _TEMPERATURE_GPU),
            mig_mode=mig_mode,
            mig_mode_pending=mig_pending,
            bar1_total=bar_total,
            bar1_used=bar_used,
            processes=procs,
            processes_status=procs_status,
        )


def _comm(pid: int) -> str:
    try:
        return bounded.read_text(Path(f"/proc/{pid}/comm"), 4096, lenient=True).strip()
    except bounded.Unreadable:
        return ""  # another PID namespace (a container) or gone
