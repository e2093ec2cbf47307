"""The driver's view through NVML: pynvml when importable, else ctypes on libnvidia-ml.so.1."""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import Any


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


def read() -> NvmlInfo:
    try:
        import pynvml
    except ImportError:
        return _read_ctypes()
    return _read_pynvml(pynvml)


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _read_pynvml(pynvml: Any) -> NvmlInfo:
    try:
        pynvml.nvmlInit()
    except Exception as exc:  # pynvml raises its own NVMLError subclasses
        raise NvmlUnavailable(f"nvmlInit failed: {exc}") from None
    try:
        gpus = []
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            major, minor = pynvml.nvmlDeviceGetCudaComputeCapability(handle)
            try:
                persistence: bool | None = pynvml.nvmlDeviceGetPersistenceMode(handle) == 1
            except Exception:
                persistence = None
            bus = _text(pynvml.nvmlDeviceGetPciInfo(handle).busId)
            gpus.append(Gpu(index, _text(pynvml.nvmlDeviceGetName(handle)), (major, minor), persistence, bus))
        return NvmlInfo(
            driver=_text(pynvml.nvmlSystemGetDriverVersion()),
            cuda_driver=int(pynvml.nvmlSystemGetCudaDriverVersion()),
            gpus=tuple(gpus),
            backend="pynvml",
        )
    finally:
        pynvml.nvmlShutdown()


class _PciInfo(ctypes.Structure):
    _fields_ = [
        ("busIdLegacy", ctypes.c_char * 16),
        ("domain", ctypes.c_uint),
        ("bus", ctypes.c_uint),
        ("device", ctypes.c_uint),
        ("pciDeviceId", ctypes.c_uint),
        ("pciSubSystemId", ctypes.c_uint),
        ("busId", ctypes.c_char * 32),
    ]


def _read_ctypes() -> NvmlInfo:
    try:
        lib = ctypes.CDLL("libnvidia-ml.so.1")
    except OSError as exc:
        raise NvmlUnavailable(f"libnvidia-ml.so.1 does not load: {exc}") from None

    def call(func: str, *args: object) -> None:
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
            persistence = None if lib.nvmlDeviceGetPersistenceMode(handle, ctypes.byref(mode)) else mode.value == 1
            pci = _PciInfo()
            bus = _text(pci.busId) if lib.nvmlDeviceGetPciInfo_v3(handle, ctypes.byref(pci)) == 0 else ""
            gpus.append(Gpu(index, _text(name.value), (major.value, minor.value), persistence, bus))
        return NvmlInfo(_text(version.value), cuda.value, tuple(gpus), "ctypes")
    finally:
        lib.nvmlShutdown()
