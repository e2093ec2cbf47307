"""A bounded copy load per GPU through the CUDA driver API (ctypes on libcuda.so.1), with the link read while busy.

Pinned host memory (cuMemHostAlloc) <-> device memory (cuMemAlloc_v2), synchronous cuMemcpyHtoD_v2 /
cuMemcpyDtoH_v2 bracketed by events on the legacy default stream; the GB/s is the median over the repeats.
Copies repeat until each direction has been busy for `busy_s` (at least 3 copies) and stop at `limit_s`, so a
GPU trained at Gen1 x1 still finishes in a few seconds. While they run, a sampler thread reads the NVML link
generation/width and clock-event reasons every 10 ms: a link that drops to Gen1 at idle is read at speed.

Copies do not load the SMs, so `spin` then runs a short compute load: an FMA loop compiled by NVRTC to PTX for the
device's compute capability, loaded with cuModuleLoadData and launched on every SM (`BLOCKS_PER_SM` blocks each)
with cuLaunchKernel. The iteration count is fixed per launch: short launches calibrate it (x8 until one takes
`CALIBRATE_S`), then one launch of about `SPIN_S` runs while NVML's clock-event reasons, SM clock, power and
temperature are sampled. The kernel ends by itself; every CUDA and NVRTC call is checked.
No multicast, no clock or power changes, no resets, no NCCL.
"""

from __future__ import annotations

import contextlib
import ctypes
import statistics
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from sm120check.doctor.gpu.nvml_health import Nvml
from sm120check.doctor.gpu.payloads import ClockSample, ComputeLoad, LinkSample, LoadResult
from sm120check.doctor.nvrtc_api import ERROR_NAMES, Nvrtc, NvrtcError

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


@contextlib.contextmanager
def held_context(cuda: Cuda, dev: int) -> Iterator[None]:
    """Hold device `dev`'s primary context across the copy and SM loads, so the second load does not pay for a
    context the first one's release destroyed. Raises CudaCallFailed when it cannot be retained."""
    ctx = ctypes.c_void_p()
    cuda.call("cuDevicePrimaryCtxRetain", ctypes.byref(ctx), dev)
    try:
        yield
    finally:
        cuda.release("cuDevicePrimaryCtxRelease_v2", dev)


Held = tuple[str, "ctypes.c_void_p | ctypes.c_ulonglong"]  # (the CUDA call that frees it, the handle)


def _event(event: ctypes.c_void_p) -> Held:
    return ("cuEventDestroy_v2", event)


def _clean_up(cuda: Cuda, stop: threading.Event, sampler: threading.Thread, retained: int | None, *held: Held) -> None:
    """End a load: stop its NVML sampler, free what it allocated (handles still 0 were never made), and release
    the primary context of device `retained` when the load retained it."""
    stop.set()
    if sampler.is_alive():
        sampler.join(timeout=1.0)
    for func, handle in held:
        if handle.value:
            cuda.release(func, handle)
    if retained is not None:
        cuda.release("cuDevicePrimaryCtxRelease_v2", retained)


def _sampler(nvml: Nvml, handle: ctypes.c_void_p, stop: threading.Event, seen: list[LinkSample]) -> None:
    while not stop.is_set():
        sample = nvml.link_sample(handle)
        if sample not in seen:  # distinct states only: keeps the max gen/width and every reason bit
            seen.append(sample)
        stop.wait(0.01)


def timed(
    cuda: Cuda,
    copy: Callable[[], None],
    stream: ctypes.c_void_p,
    start: ctypes.c_void_p,
    end: ctypes.c_void_p,
    *,
    at_least: int,
    busy_s: float,
    limit_s: float,
) -> list[float]:
    """Seconds per copy on the stream's clock (events around each), until `busy_s` and `at_least` copies, or
    `limit_s`: the one timing loop of the copy load and the peer copies."""
    took: list[float] = []
    began = time.monotonic()
    while True:
        cuda.call("cuEventRecord", start, stream)
        copy()
        cuda.call("cuEventRecord", end, stream)
        cuda.call("cuEventSynchronize", end)
        ms = ctypes.c_float()
        cuda.call("cuEventElapsedTime", ctypes.byref(ms), start, end)
        if ms.value > 0:
            took.append(ms.value / 1000.0)
        spent = time.monotonic() - began
        if spent >= limit_s or (spent >= busy_s and len(took) >= at_least):
            return took


def _copies(
    cuda: Cuda,
    copy: Callable[[], None],
    start: ctypes.c_void_p,
    end: ctypes.c_void_p,
    size: int,
    busy_s: float,
    limit_s: float,
) -> list[float]:
    """GB/s of each synchronous copy on the legacy default stream (at least 3)."""
    legacy = ctypes.c_void_p(None)
    seconds = timed(cuda, copy, legacy, start, end, at_least=3, busy_s=busy_s, limit_s=limit_s)
    return [size / s / 1e9 for s in seconds]


BUSY_S = 0.3  # per direction: a few dozen NVML link samples at speed, and the median of 8+ copies at Gen5 x16


def measure(
    cuda: Cuda,
    dev: int,
    nvml: Nvml,
    handle: ctypes.c_void_p,
    *,
    size: int = 256 * MIB,
    busy_s: float = BUSY_S,
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
        _clean_up(
            cuda,
            stop,
            sampler,
            dev if retained else None,
            _event(start),
            _event(end),
            ("cuMemFreeHost", hptr),
            ("cuMemFree_v2", dptr),
        )
    return LoadResult(
        h2d_gbps=round(statistics.median(h2d), 2) if h2d else None,
        d2h_gbps=round(statistics.median(d2h), 2) if d2h else None,
        size_bytes=size,
        repeats=min(len(h2d), len(d2h)) if h2d and d2h else max(len(h2d), len(d2h)),
        seconds=round(time.monotonic() - began, 3),
        samples=tuple(seen),
        error=error,
    )


# ---- compute load ------------------------------------------------------------------------------------------------

SPIN_KERNEL_NAME = "sm120kit_spin"
# Four independent FMA chains per thread; the store under a condition that never holds keeps the loop alive.
SPIN_KERNEL = r"""
extern "C" __global__ void sm120kit_spin(float *out, unsigned int iterations) {
  float a = 1.0f + threadIdx.x * 1e-6f, b = a + 1e-3f, c = b + 1e-3f, d = c + 1e-3f;
  const float m = 0.999999f, k = 1e-7f;
  for (unsigned int i = 0; i < iterations; ++i) {
    a = fmaf(a, m, k); b = fmaf(b, m, k); c = fmaf(c, m, k); d = fmaf(d, m, k);
  }
  if (a + b + c + d == -1.0f) out[blockIdx.x] = a;
}
"""
SPIN_S = 0.4  # the timed launch: long enough for a dozen NVML samples and for power to ramp
CALIBRATE_S = 0.02
FIRST_ITERATIONS = 1 << 12
MAX_ITERATIONS = (1 << 32) - 1  # the kernel's unsigned int
BLOCKS_PER_SM, THREADS = 4, 256
_SM_COUNT, _CC_MAJOR, _CC_MINOR = 16, 75, 76  # CUdevice_attribute


def ptx_arch(cc: tuple[int, int], supported: list[int]) -> str:
    """The NVRTC virtual architecture for a GPU: its own (compute_90 for 9.0), else the newest NVRTC knows below it
    (PTX is forward compatible); "" when NVRTC knows none that old."""
    want = cc[0] * 10 + cc[1]
    fits = [a for a in supported if a <= want]
    return f"compute_{max(fits)}" if fits else ""


def compile_ptx(nvrtc: Nvrtc, arch: str, source: str = SPIN_KERNEL) -> bytes:
    """`source` -> NUL-terminated PTX for `arch` ("compute_90"); NvrtcError names the failing call and the log."""
    lib, prog = nvrtc.lib, ctypes.c_void_p()
    code = int(lib.nvrtcCreateProgram(ctypes.byref(prog), source.encode(), b"sm120kit_spin.cu", 0, None, None))
    if code != 0:
        raise NvrtcError(f"nvrtcCreateProgram returned {ERROR_NAMES.get(code, code)}")
    try:
        options = (ctypes.c_char_p * 1)(f"--gpu-architecture={arch}".encode())
        code = int(lib.nvrtcCompileProgram(prog, 1, options))
        if code != 0:
            size = ctypes.c_size_t()
            lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
            log = ctypes.create_string_buffer(max(size.value, 1))
            lib.nvrtcGetProgramLog(prog, log)
            text = log.value.decode(errors="replace")
            raise NvrtcError(f"nvrtcCompileProgram({arch}) returned {ERROR_NAMES.get(code, code)}: {text}")
        size = ctypes.c_size_t()
        code = int(lib.nvrtcGetPTXSize(prog, ctypes.byref(size)))
        if code != 0:
            raise NvrtcError(f"nvrtcGetPTXSize returned {ERROR_NAMES.get(code, code)}")
        ptx = ctypes.create_string_buffer(size.value)
        code = int(lib.nvrtcGetPTX(prog, ptx))
        if code != 0:
            raise NvrtcError(f"nvrtcGetPTX returned {ERROR_NAMES.get(code, code)}")
        return ptx.raw
    finally:
        lib.nvrtcDestroyProgram(ctypes.byref(prog))


_PTX_LOCK = threading.Lock()
_PTX: dict[tuple[int, str], bytes] = {}


def _shared_ptx(nvrtc: Nvrtc, arch: str) -> bytes:
    """compile_ptx once per (library, arch) for the spin threads of every GPU (the same PTX serves them all)."""
    with _PTX_LOCK:
        key = (id(nvrtc.lib), arch)
        if key not in _PTX:
            _PTX[key] = compile_ptx(nvrtc, arch)
        return _PTX[key]


def nvrtc_candidates(paths: Iterable[str] = ()) -> list[str]:
    """Where NVRTC may be when its soname does not resolve: the CUDA 13 wheels of the doctor's interpreter
    (nvidia/cu13/lib, nvidia/cuda_nvrtc/lib), then the usual toolkit homes."""
    found: list[str] = []
    for site in (*paths, *(p for p in sys.path if p.endswith("site-packages"))):
        found += sorted(str(f) for f in Path(site).glob("nvidia/*/lib/libnvrtc.so.13*") if f.is_file())
    for home in ("/usr/local/cuda", "/opt/cuda"):
        found += sorted(str(f) for f in Path(home).glob("lib*/libnvrtc.so.13*") if f.is_file())
    return list(dict.fromkeys(f for f in found if not f.endswith((".alt", ".a"))))


def _open_file(path: str) -> Nvrtc:
    """NVRTC from a file off the loader's path, its builtins first: nvrtcCompileProgram dlopens
    libnvrtc-builtins.so.13.x by soname, which a wheel's lib folder (no RPATH) does not resolve, and fails with
    NVRTC_ERROR_BUILTIN_OPERATION_FAILURE; once loaded from the same folder, that soname matches the loaded copy."""
    for builtins in sorted(Path(path).parent.glob("libnvrtc-builtins.so.13*")):
        if builtins.is_file() and ".alt." not in builtins.name:
            ctypes.CDLL(str(builtins))
    return Nvrtc.open(path)


def open_nvrtc() -> tuple[Nvrtc | None, str]:
    """NVRTC by soname (as the nvrtc checks open it), else from a CUDA 13 wheel or toolkit; or why not (the compute
    load then says it could not run)."""
    try:
        return Nvrtc.open(), ""
    except OSError as exc:
        first = str(exc)
    for path in nvrtc_candidates():
        try:
            return _open_file(path), ""
        except OSError:
            continue
    return None, f"NVRTC does not load ({first}; no libnvrtc.so.13 in the CUDA 13 wheels or toolkit either)"


def _clock_sampler(nvml: Nvml, handle: ctypes.c_void_p, stop: threading.Event, seen: list[ClockSample]) -> None:
    while not stop.is_set():
        seen.append(nvml.clock_sample(handle))
        stop.wait(0.02)


def _attribute(cuda: Cuda, attribute: int, dev: int) -> int:
    value = ctypes.c_int()
    cuda.call("cuDeviceGetAttribute", ctypes.byref(value), attribute, dev)
    return value.value


def spin(
    cuda: Cuda,
    dev: int,
    nvml: Nvml,
    handle: ctypes.c_void_p,
    nvrtc: Nvrtc | None,
    nvrtc_error: str = "",
    *,
    spin_s: float = SPIN_S,
) -> ComputeLoad:
    """The FMA kernel on every SM of CUDA device `dev`, clocks sampled through NVML `handle`; never raises for
    CUDA or NVRTC errors (they become `error`)."""
    blocks = iterations = 0
    arch, seconds = "", 0.0
    seen: list[ClockSample] = []
    if nvrtc is None:
        return ComputeLoad(0.0, 0, 0, THREADS, "", error=nvrtc_error or "NVRTC does not load")
    stop = threading.Event()
    sampler = threading.Thread(target=_clock_sampler, args=(nvml, handle, stop, seen), daemon=True)
    ctx, module, func = ctypes.c_void_p(), ctypes.c_void_p(), ctypes.c_void_p()
    out, start, end = ctypes.c_ulonglong(), ctypes.c_void_p(), ctypes.c_void_p()
    error, retained = "", False
    try:
        arch = ptx_arch((_attribute(cuda, _CC_MAJOR, dev), _attribute(cuda, _CC_MINOR, dev)), nvrtc.supported_archs())
        if not arch:
            raise NvrtcError(f"NVRTC supports no architecture old enough for CUDA device {dev}")
        ptx = _shared_ptx(nvrtc, arch)
        blocks = _attribute(cuda, _SM_COUNT, dev) * BLOCKS_PER_SM
        cuda.call("cuDevicePrimaryCtxRetain", ctypes.byref(ctx), dev)
        retained = True
        cuda.call("cuCtxSetCurrent", ctx)
        cuda.call("cuModuleLoadData", ctypes.byref(module), ptx)
        cuda.call("cuModuleGetFunction", ctypes.byref(func), module, SPIN_KERNEL_NAME.encode())
        cuda.call("cuMemAlloc_v2", ctypes.byref(out), ctypes.c_size_t(4 * blocks))
        cuda.call("cuEventCreate", ctypes.byref(start), 0)
        cuda.call("cuEventCreate", ctypes.byref(end), 0)

        def launch(count: int) -> float:
            n = ctypes.c_uint(count)
            params = (ctypes.c_void_p * 2)(ctypes.addressof(out), ctypes.addressof(n))
            cuda.call("cuEventRecord", start, ctypes.c_void_p(None))
            cuda.call("cuLaunchKernel", func, blocks, 1, 1, THREADS, 1, 1, 0, ctypes.c_void_p(None), params, None)
            cuda.call("cuEventRecord", end, ctypes.c_void_p(None))
            cuda.call("cuEventSynchronize", end)
            ms = ctypes.c_float()
            cuda.call("cuEventElapsedTime", ctypes.byref(ms), start, end)
            return ms.value / 1000.0

        iterations = FIRST_ITERATIONS
        took = launch(iterations)
        while took < CALIBRATE_S and iterations * 8 <= MAX_ITERATIONS:
            iterations *= 8
            took = launch(iterations)
        iterations = min(MAX_ITERATIONS, max(iterations, int(iterations * spin_s / max(took, 1e-6))))
        sampler.start()
        seconds = launch(iterations)
    except (CudaCallFailed, NvrtcError) as exc:
        error = str(exc)
    finally:
        _clean_up(
            cuda,
            stop,
            sampler,
            dev if retained else None,
            _event(start),
            _event(end),
            ("cuMemFree_v2", out),
            ("cuModuleUnload", module),
        )
    return ComputeLoad(round(seconds, 3), iterations, blocks, THREADS, arch, tuple(seen), error)
