"""Compile a small CUDA kernel for sm_120 with NVRTC through ctypes; print a JSON report. No GPU needed.

Runs inside a node with the system interpreter (standard library only): it proves that libnvrtc.so.13 resolves by
soname through the loader cache and that NVRTC finds its builtins library there too (otherwise every compile fails
with NVRTC_ERROR_BUILTIN_OPERATION_FAILURE). Usage: python3 nvrtc_sm120.py [ARCH]
"""

from __future__ import annotations

import ctypes
import json
import struct
import sys

EM_CUDA = 190

KERNEL = b"""
extern "C" __global__ void saxpy(float a, const float* x, float* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i] + y[i];
}
"""


def main() -> int:
    arch = sys.argv[1] if len(sys.argv) > 1 else "sm_120"
    nvrtc = ctypes.CDLL("libnvrtc.so.13")
    nvrtc.nvrtcGetErrorString.restype = ctypes.c_char_p
    major, minor = ctypes.c_int(), ctypes.c_int()
    nvrtc.nvrtcVersion(ctypes.byref(major), ctypes.byref(minor))
    program = ctypes.c_void_p()
    status = nvrtc.nvrtcCreateProgram(ctypes.byref(program), KERNEL, b"saxpy.cu", 0, None, None)
    if status != 0:
        print(json.dumps({"stage": "create", "status": status}))
        return 1
    options = (ctypes.c_char_p * 1)(f"--gpu-architecture={arch}".encode())
    status = nvrtc.nvrtcCompileProgram(program, 1, options)
    log_size = ctypes.c_size_t()
    nvrtc.nvrtcGetProgramLogSize(program, ctypes.byref(log_size))
    log = ctypes.create_string_buffer(log_size.value)
    nvrtc.nvrtcGetProgramLog(program, log)
    cubin_size = ctypes.c_size_t()
    cubin = b""
    if status == 0 and nvrtc.nvrtcGetCUBINSize(program, ctypes.byref(cubin_size)) == 0:
        buffer = ctypes.create_string_buffer(cubin_size.value)
        nvrtc.nvrtcGetCUBIN(program, buffer)
        cubin = buffer.raw
    nvrtc.nvrtcDestroyProgram(ctypes.byref(program))
    report = {
        "nvrtc_version": f"{major.value}.{minor.value}",
        "arch": arch,
        "status": status,
        "error": nvrtc.nvrtcGetErrorString(status).decode(),
        "log": log.value.decode(errors="replace").strip(),
        "cubin_bytes": len(cubin),
        "cubin_is_elf": cubin[:4] == b"\x7fELF",
        "kernel_in_cubin": b"saxpy" in cubin,
        # NVRTC 13.0 cubins: e_machine EM_CUDA, SM number in bits 8..15 of e_flags (0x6007802 for sm_120).
        "cubin_machine": struct.unpack_from("<H", cubin, 18)[0] if len(cubin) >= 52 else 0,
        "cubin_sm": (struct.unpack_from("<I", cubin, 48)[0] >> 8) & 0xFF if len(cubin) >= 52 else 0,
    }
    print(json.dumps(report))
    return 0 if status == 0 and report["cubin_machine"] == EM_CUDA else 1


if __name__ == "__main__":
    sys.exit(main())
