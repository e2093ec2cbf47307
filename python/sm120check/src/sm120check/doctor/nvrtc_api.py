"""NVRTC through ctypes, opened by soname the way sgl_kernel opens it.

The doctor itself never opens NVRTC: the probe `cuda_toolkit/nvrtc_info_probe.py` does, in a child process with a
hard timeout (a library whose constructor blocks, or that segfaults, must not take the doctor down).
`probe()` runs that child and turns its answer back into an `Opened` and `Compiled` values.
"""

from __future__ import annotations

import base64
import ctypes
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from sm120check.doctor import child, loader
from sm120check.doctor.payload import Fields, PayloadError

SONAME = "libnvrtc.so.13"

# A kernel with an exact integer reference: out[i] = a * x[i] + y[i] (mod 2**32).
TEST_KERNEL = r"""
extern "C" __global__ void sm120kit_axpy(unsigned int a, const unsigned int *x, const unsigned int *y,
                                         unsigned int *out, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = a * x[i] + y[i];
}
"""
TEST_KERNEL_NAME = "sm120kit_axpy"

ERROR_NAMES = {
    0: "NVRTC_SUCCESS",
    1: "NVRTC_ERROR_OUT_OF_MEMORY",
    2: "NVRTC_ERROR_PROGRAM_CREATION_FAILURE",
    3: "NVRTC_ERROR_INVALID_INPUT",
    4: "NVRTC_ERROR_INVALID_PROGRAM",
    5: "NVRTC_ERROR_INVALID_OPTION",
    6: "NVRTC_ERROR_COMPILATION",
    7: "NVRTC_ERROR_BUILTIN_OPERATION_FAILURE",
}


class NvrtcError(RuntimeError):
    pass


@dataclass(frozen=True)
class Compiled:
    arch: str
    ok: bool
    code: int  # nvrtcResult of the failing call, 0 on success
    cubin: bytes = b""
    log: str = ""
    seconds: float = 0.0

    @property
    def error(self) -> str:
        return ERROR_NAMES.get(self.code, f"nvrtcResult {self.code}")


class Nvrtc:
    """An opened NVRTC library. `Nvrtc.open()` raises OSError when the soname does not resolve."""

    def __init__(self, lib: ctypes.CDLL) -> None:
        self.lib = lib
        self.path = loader.dlopen_path(lib)

    @classmethod
    def open(cls, name: str = SONAME) -> Nvrtc:
        return cls(ctypes.CDLL(name))

    def _call(self, func: str, *args: object) -> None:
        code = int(getattr(self.lib, func)(*args))
        if code != 0:
            raise NvrtcError(f"{func} returned {ERROR_NAMES.get(code, code)}")

    def version(self) -> tuple[int, int]:
        major, minor = ctypes.c_int(), ctypes.c_int()
        self._call("nvrtcVersion", ctypes.byref(major), ctypes.byref(minor))
        return major.value, minor.value

    def supported_archs(self) -> list[int]:
        count = ctypes.c_int()
        self._call("nvrtcGetNumSupportedArchs", ctypes.byref(count))
        archs = (ctypes.c_int * count.value)()
        self._call("nvrtcGetSupportedArchs", archs)
        return list(archs)

    def compile(self, arch: str, source: str = TEST_KERNEL, name: str = "sm120kit_test.cu") -> Compiled:
        """Compile `source` to a cubin for `arch` ("sm_120", "sm_120a", "sm_120f", "sm_90", ...)."""
        start = time.monotonic()
        prog = ctypes.c_void_p()
        lib = self.lib
        code = lib.nvrtcCreateProgram(ctypes.byref(prog), source.encode(), name.encode(), 0, None, None)
        if code != 0:
            return Compiled(arch, False, code, seconds=time.monotonic() - start)
        try:
            options = (ctypes.c_char_p * 2)(f"--gpu-architecture={arch}".encode(), b"--std=c++17")
            code = lib.nvrtcCompileProgram(prog, 2, options)
            log = self._log(prog)
            if code != 0:
                return Compiled(arch, False, code, log=log, seconds=time.monotonic() - start)
            size = ctypes.c_size_t()
            code = lib.nvrtcGetCUBINSize(prog, ctypes.byref(size))
            if code != 0:
                return Compiled(arch, False, code, log=log, seconds=time.monotonic() - start)
            buffer = ctypes.create_string_buffer(size.value)
            code = lib.nvrtcGetCUBIN(prog, buffer)
            cubin = buffer.raw if code == 0 else b""
            return Compiled(arch, code == 0 and bool(cubin), code, cubin, log, time.monotonic() - start)
        finally:
            lib.nvrtcDestroyProgram(ctypes.byref(prog))

    def _log(self, prog: ctypes.c_void_p) -> str:
        size = ctypes.c_size_t()
        if self.lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size)) != 0 or size.value <= 1:
            return ""
        buffer = ctypes.create_string_buffer(size.value)
        self.lib.nvrtcGetProgramLog(prog, buffer)
        return buffer.value.decode(errors="replace").strip()


PROBE = "sm120check.doctor.cuda_toolkit.nvrtc_info_probe"


@dataclass(frozen=True)
class Opened:
    """What the NVRTC probe found: the file libnvrtc.so.13 resolved to, its version and architectures."""

    path: str
    version: tuple[int, int] | None = None  # None: nvrtcVersion failed
    archs: tuple[int, ...] = ()
    compiled: tuple[Compiled, ...] = ()


@dataclass(frozen=True)
class ProbeAnswer:
    """The NVRTC probe's answer: `opened` when the library loaded, else `open_error`; `problem` (and the
    `step` it happened in) when the probe hung, crashed or printed nothing."""

    opened: Opened | None = None
    open_error: str = ""
    problem: str = ""
    step: str = ""
    stderr_tail: str = ""
    interrupted: bool = False
    extra: Mapping[str, object] = field(default_factory=dict)


@dataclass(frozen=True)
class NvrtcInfo:
    """The answer of cuda_toolkit/nvrtc_info_probe.py (its payload type, here beside the ctypes reader both sides
    import): `open_error` when the soname does not resolve; else the file, its version and architectures
    (`version_error`
    when asking them failed) and the test kernel compiled for each asked architecture."""

    open_error: str = ""
    path: str = ""
    version: tuple[int, int] | None = None
    archs: tuple[int, ...] = ()
    version_error: str = ""
    compiled: tuple[Compiled, ...] = ()

    def to_json(self) -> dict[str, object]:
        if self.open_error:
            return {"open_error": self.open_error}
        out: dict[str, object] = {"path": self.path}
        if self.version is not None:
            out["version"] = list(self.version)
        if self.version_error:
            out["version_error"] = self.version_error
        else:
            out["archs"] = list(self.archs)
        if self.compiled:
            out["compiled"] = [
                {
                    "arch": c.arch,
                    "ok": c.ok,
                    "code": c.code,
                    "cubin": base64.b64encode(c.cubin).decode(),
                    "log": c.log[-4000:],
                    "seconds": c.seconds,
                }
                for c in self.compiled
            ]
        return out

    @classmethod
    def from_json(cls, data: object) -> NvrtcInfo:
        f = Fields("nvrtc_info", data)
        if f.has("open_error"):
            return cls(open_error=f.text("open_error"))
        version = f.integers("version") if f.has("version") else None
        if version is not None and len(version) != 2:
            raise PayloadError("nvrtc_info", "version", f"expected [major, minor], got {list(version)}")
        compiled = tuple(
            Compiled(c.text("arch"), c.flag("ok"), c.integer("code"), _cubin(c), c.text("log"), c.number("seconds"))
            for c in (f.objects("compiled") if f.has("compiled") else ())
        )
        return cls(
            path=f.text("path"),
            version=(version[0], version[1]) if version is not None else None,
            archs=f.integers("archs") if f.has("archs") else (),
            version_error=f.maybe_text("version_error") or "",
            compiled=compiled,
        )


def _cubin(c: Fields) -> bytes:
    try:
        return base64.b64decode(c.text("cubin"), validate=True)
    except ValueError as exc:
        raise PayloadError("nvrtc_info", c.at("cubin"), f"not base64 ({exc})") from None


def answer_from(data: Mapping[str, object]) -> ProbeAnswer:
    """The probe's JSON -> ProbeAnswer (pure; a malformed answer is a problem, not an exception)."""
    try:
        info = NvrtcInfo.from_json(data)
    except PayloadError as exc:
        return ProbeAnswer(problem=f"printed a malformed answer ({exc})")
    if info.open_error:
        return ProbeAnswer(open_error=info.open_error)
    return ProbeAnswer(opened=Opened(info.path, info.version, info.archs, info.compiled))


def probe(timeout: float, compile_for: Sequence[str] = ()) -> ProbeAnswer:
    """Open NVRTC (and compile the test kernel for `compile_for`) in the probe child, bounded by `timeout`."""
    args = ["--compile", ",".join(compile_for)] if compile_for else []
    outcome = child.run_probe(PROBE, args, timeout=timeout)
    if not outcome.ok:
        return ProbeAnswer(
            problem=outcome.problem,
            step=outcome.step,
            stderr_tail=outcome.stderr_tail,
            interrupted=outcome.interrupted,
        )
    return answer_from(outcome.data)


def arch_of(major: int, minor: int) -> str:
    """Compute capability -> NVRTC real architecture: (12, 0) -> "sm_120", (9, 0) -> "sm_90"."""
    return f"sm_{major}{minor}"
