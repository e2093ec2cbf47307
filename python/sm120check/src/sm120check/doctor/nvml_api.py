"""The driver's view through NVML: pynvml when importable, else ctypes on libnvidia-ml.so.1.

`read()` loads NVML into the calling process: only the probe `gpu/nvml_info_probe.py` calls it, in a child
process with a hard timeout, so that a pynvml that hangs on import or a libnvidia-ml that blocks or
segfaults cannot take the doctor down. `step` is told what is about to happen (the import, the dlopen,
each NVML call), so a hang or a crash can be reported with the step it happened in.
"""

from __future__ import annotations

import ctypes
import importlib.util
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sm120check.doctor import loader

SONAME = "libnvidia-ml.so.1"


class NvmlUnavailable(RuntimeError):
    """NVML could not be loaded or initialised; the message says which step failed."""


@dataclass(frozen=True)
class Gpu:
    index: int
    name: str
    cc: tuple[int, int]
    persistence: bool | None  # None: NVML could not say
    bus_id: str = ""


@dataclass(frozen=True)
class NvmlInfo:
    driver: str  # "580.159.04"
    cuda_driver: int  # CUDA version the driver supports, 13000 for 13.0
    gpus: tuple[Gpu, ...]
    backend: str  # "pynvml" or "ctypes"


def _quiet(text: str) -> None:
    pass


def read(step: Callable[[str], None] = _quiet) -> NvmlInfo:
    try:
        spec = importlib.util.find_spec("pynvml")
    except (ImportError, ValueError):
        spec = None
    if spec is None:
        return _read_ctypes(step)
    step(f"import pynvml (from {spec.origin})")
    try:
        import pynvml
    except ImportError:
        return _read_ctypes(step)
    return _read_pynvml(pynvml, step)


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _read_pynvml(pynvml: Any, step: Callable[[str], None] = _quiet) -> NvmlInfo:
    where = f"pynvml ({getattr(pynvml, '__file__', '?')})"
    step(f"nvmlInit in {where}")
    try:
        pynvml.nvmlInit()
    except Exception as exc:  # pynvml raises its own NVMLError subclasses
        raise NvmlUnavailable(f"nvmlInit failed: {exc}") from None
    try:
        gpus = []
        step(f"nvmlDeviceGetCount in {where}")
        for index in range(pynvml.nvmlDeviceGetCount()):
            step(f"GPU {index} queries in {where}")
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            major, minor = pynvml.nvmlDeviceGetCudaComputeCapability(handle)
            try:
                persistence: bool | None = pynvml.nvmlDeviceGetPersistenceMode(handle) == 1
            except Exception:
                persistence = None
            bus = _text(pynvml.nvmlDeviceGetPciInfo(handle).busId)
            gpus.append(Gpu(index, _text(pynvml.nvmlDeviceGetName(handle)), (major, minor), persistence, bus))
        step(f"nvmlSystemGetDriverVersion in {where}")
        return NvmlInfo(
            driver=_text(pynvml.nvmlSystemGetDriverVersion()),
            cuda_driver=int(pynvml.nvmlSystemGetCudaDriverVersion()),
            gpus=tuple(gpus),
            backend="pynvml",
        )
    finally:
        step(f"nvmlShutdown in {where}")
        pynvml.nvmlShutdown()


class PciInfo(ctypes.Structure):
    """nvmlPciInfo_t (what nvmlDeviceGetPciInfo_v3 fills)."""

    _fields_ = [
        ("busIdLegacy", ctypes.c_char * 16),
        ("domain", ctypes.c_uint),
        ("bus", ctypes.c_uint),
        ("device", ctypes.c_uint),
        ("pciDeviceId", ctypes.c_uint),
        ("pciSubSystemId", ctypes.c_uint),
        ("busId", ctypes.c_char * 32),
    ]


def _read_ctypes(step: Callable[[str], None] = _quiet) -> NvmlInfo:
    step(f"dlopen {SONAME}")
    try:
        lib = ctypes.CDLL(SONAME)
    except OSError as exc:
        raise NvmlUnavailable(f"{SONAME} does not load: {exc}") from None
    where = loader.dlopen_path(lib) or SONAME

    def call(func: str, *args: object) -> None:
        step(f"{func} in {where}")
        code = int(getattr(lib, func)(*args))
        if code != 0:
            text = lib.nvmlErrorString
            text.restype = ctypes.c_char_p
            raise NvmlUnavailable(f"{func} returned {code} ({_text(text(code))})")

    call("nvmlInit_v2")
    try:
        version = ctypes.create_string_buffer(96)
        call("nvmlSystemGetDriverVersion", version, 96)
        cuda = ctypes.c_int()
        call("nvmlSystemGetCudaDriverVersion_v2", ctypes.byref(cuda))
        count = ctypes.c_uint()
        call("nvmlDeviceGetCount_v2", ctypes.byref(count))
        gpus = []
        for index in range(count.value):
            handle = ctypes.c_void_p()
            call("nvmlDeviceGetHandleByIndex_v2", index, ctypes.byref(handle))
            name = ctypes.create_string_buffer(96)
            call("nvmlDeviceGetName", handle, name, 96)
            major, minor = ctypes.c_int(), ctypes.c_int()
            call("nvmlDeviceGetCudaComputeCapability", handle, ctypes.byref(major), ctypes.byref(minor))
            mode = ctypes.c_int()
            step(f"nvmlDeviceGetPersistenceMode, nvmlDeviceGetPciInfo_v3 (GPU {index}) in {where}")
            persistence = None if lib.nvmlDeviceGetPersistenceMode(handle, ctypes.byref(mode)) else mode.value == 1
            pci = PciInfo()
            bus = _text(pci.busId) if lib.nvmlDeviceGetPciInfo_v3(handle, ctypes.byref(pci)) == 0 else ""
            gpus.append(Gpu(index, _text(name.value), (major.value, minor.value), persistence, bus))
        return NvmlInfo(_text(version.value), cuda.value, tuple(gpus), "ctypes")
    finally:
        step(f"nvmlShutdown in {where}")
        lib.nvmlShutdown()
