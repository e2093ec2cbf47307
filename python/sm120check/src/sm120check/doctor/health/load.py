"""A bounded copy load per GPU through the CUDA driver API (ctypes on libcuda.so.1), with the link read while busy.

Pinned host memory (cuMemHostAlloc) <-> device memory (cuMemAlloc_v2), synchronous cuMemcpyHtoD_v2 /
cuMemcpyDtoH_v2 bracketed by events on the legacy default stream; the GB/s is the median over the repeats.
Copies repeat until each direction has been busy for `busy_s` (at least 3 copies) and stop at `limit_s`, so a
GPU trained at Gen1 x1 still finishes in a few seconds. While they run, a sampler thread reads the NVML link
generation/width and clock-event reasons every 10 ms: a link that drops to Gen1 at idle is read at speed.
No multicast, no clock or power changes, no resets, no NCCL.
"""

from __future__ import annotations

import contextlib
import ctypes
import statistics
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from sm120check.doctor.health.nvml_health import Nvml
from sm120check.doctor.health.payloads import LinkSample, LoadResult

SONAME = "libcuda.so.1"
MIB = 1 << 20


class CudaUnavailable(RuntimeError):
    """libcuda did not load or cuInit failed."""


class CudaCallFailed(RuntimeError):
    pass


def pci_key(bus_id: str) -> tuple[int, int, int] | None:
    """(domain, bus, device) of "00000000:3B:00.0" (NVML), "0000:3b:00.0" (CUDA) or "0000:3b:00" (an Xid line)."""
    parts = bus_id.strip().lower().replace("pci:", "").split(":")
    if len(parts) != 3:
        return None
    try:
        return int(parts[0], 16), int(parts[1], 16), int(parts[2].split(".")[0], 16)
    except ValueError:
        return None


@dataclass
class Cuda:
    lib: ctypes.CDLL

    @classmethod
    def open(cls) -> Cuda:
        try:
            lib = ctypes.CDLL(SONAME)
        except OSError as exc:
            raise CudaUnavailable(f"{SONAME} does not load: {exc}") from None
        cuda = cls(lib)
        try:
            cuda.call("cuInit", 0)
        except CudaCallFailed as exc:
            raise CudaUnavailable(str(exc)) from None
        return cuda

    def call(self, func: str, *args: object) -> None:
        code = int(getattr(self.lib, func)(*args))
        if code != 0:
            name = ctypes.c_char_p()
            self.lib.cuGetErrorName(code, ctypes.byref(name))
            raise CudaCallFailed(f"{func} returned {name.value.decode() if name.value else code}")

    def device_by_bus(self) -> dict[tuple[int, int, int], int]:
        count = ctypes.c_int()
        self.call("cuDeviceGetCount", ctypes.byref(count))
        found = {}
        for ordinal in range(count.value):
            dev = ctypes.c_int()
            self.call("cuDeviceGet", ctypes.byref(dev), ordinal)
            bus = ctypes.create_string_buffer(32)
            self.call("cuDeviceGetPCIBusId", bus, 32, dev)
            key = pci_key(bus.value.decode())
            if key is not None:
                found[key] = dev.value
        return found

    def release(self, func: str, *args: object) -> None:
        """Best-effort cleanup: a failed free must not hide the measurement."""
        with contextlib.suppress(CudaCallFailed):
            self.call(func, *args)


def _sampler(nvml: Nvml, handle: ctypes.c_void_p, stop: threading.Event, seen: list[LinkSample]) -> None:
    while not stop.is_set():
        sample = nvml.link_sample(handle)
        if sample not in seen:  # distinct states only: keeps the max gen/width and every reason bit
            seen.append(sample)
        stop.wait(0.01)


def _copies(
    cuda: Cuda,
    copy: Callable[[], None],
    start: ctypes.c_void_p,
    end: ctypes.c_void_p,
    size: int,
    busy_s: float,
    limit_s: float,
) -> list[float]:
    rates: list[float] = []
    began = time.monotonic()
    while True:
        cuda.call("cuEventRecord", start, ctypes.c_void_p(None))
        copy()
        cuda.call("cuEventRecord", end, ctypes.c_void_p(None))
        cuda.call("cuEventSynchronize", end)
        ms = ctypes.c_float()
        cuda.call("cuEventElapsedTime", ctypes.byref(ms), start, end)
        if ms.value > 0:
            rates.append(size / (ms.value / 1000.0) / 1e9)
        spent = time.monotonic() - began
        if spent >= limit_s or (spent >= busy_s and len(rates) >= 3):
            return rates


def measure(
    cuda: Cuda,
    dev: int,
    nvml: Nvml,
    handle: ctypes.c_void_p,
    *,
    size: int = 256 * MIB,
    busy_s: float = 0.5,
    limit_s: float = 2.5,
) -> LoadResult:
    """Pinned H2D then D2H copies on CUDA device `dev` while sampling NVML `handle`; never raises for CUDA errors."""
    began = time.monotonic()
    seen: list[LinkSample] = []
    stop = threading.Event()
    sampler = threading.Thread(target=_sampler, args=(nvml, handle, stop, seen), daemon=True)
    ctx, dptr, hptr = ctypes.c_void_p(), ctypes.c_ulonglong(), ctypes.c_void_p()
    start, end = ctypes.c_void_p(), ctypes.c_void_p()
    h2d: list[float] = []
    d2h: list[float] = []
    error = ""
    retained = False
    try:
        cuda.call("cuDevicePrimaryCtxRetain", ctypes.byref(ctx), dev)
        retained = True
        cuda.call("cuCtxSetCurrent", ctx)
        cuda.call("cuMemAlloc_v2", ctypes.byref(dptr), ctypes.c_size_t(size))
        cuda.call("cuMemHostAlloc", ctypes.byref(hptr), ctypes.c_size_t(size), 0)
        cuda.call("cuEventCreate", ctypes.byref(start), 0)
        cuda.call("cuEventCreate", ctypes.byref(end), 0)
        n = ctypes.c_size_t(size)
        sampler.start()
        h2d = _copies(cuda, lambda: cuda.call("cuMemcpyHtoD_v2", dptr, hptr, n), start, end, size, busy_s, limit_s)
        d2h = _copies(cuda, lambda: cuda.call("cuMemcpyDtoH_v2", hptr, dptr, n), start, end, size, busy_s, limit_s)
    except CudaCallFailed as exc:
        error = str(exc)
    finally:
        stop.set()
        if sampler.is_alive():
            sampler.join(timeout=1.0)
        for event in (start, end):
            if event.value:
                cuda.release("cuEventDestroy_v2", event)
        if hptr.value:
            cuda.release("cuMemFreeHost", hptr)
        if dptr.value:
            cuda.release("cuMemFree_v2", dptr)
        if retained:
            cuda.release("cuDevicePrimaryCtxRelease_v2", dev)
    return LoadResult(
        h2d_gbps=round(statistics.median(h2d), 2) if h2d else None,
        d2h_gbps=round(statistics.median(d2h), 2) if d2h else None,
        size_bytes=size,
        repeats=min(len(h2d), len(d2h)) if h2d and d2h else max(len(h2d), len(d2h)),
        seconds=round(time.monotonic() - began, 3),
        samples=tuple(seen),
        error=error,
    )
