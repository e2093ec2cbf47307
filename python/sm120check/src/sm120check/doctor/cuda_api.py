"""The CUDA driver API through ctypes on libcuda.so.1: just enough to load a cubin, launch it, read back."""

from __future__ import annotations

import ctypes
from collections.abc import Sequence

_CC_MAJOR, _CC_MINOR = 75, 76  # CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_{MAJOR,MINOR}


class CudaError(RuntimeError):
    pass


class Driver:
    def __init__(self) -> None:
        self.lib = ctypes.CDLL("libcuda.so.1")
        self.lib.cuLaunchKernel.argtypes = [
            ctypes.c_void_p,
            *([ctypes.c_uint] * 6),
            ctypes.c_uint,
            ctypes.c_void_p,
            ctypes.c_void_p,
            ctypes.c_void_p,
        ]
        self.call("cuInit", 0)

    def call(self, func: str, *args: object) -> None:
        code = int(getattr(self.lib, func)(*args))
        if code != 0:
            name = ctypes.c_char_p()
            self.lib.cuGetErrorName(code, ctypes.byref(name))
            raise CudaError(f"{func} returned {name.value.decode() if name.value else code}")

    def device_count(self) -> int:
        count = ctypes.c_int()
        self.call("cuDeviceGetCount", ctypes.byref(count))
        return count.value

    def device(self, ordinal: int) -> tuple[int, str, tuple[int, int]]:
        dev = ctypes.c_int()
        self.call("cuDeviceGet", ctypes.byref(dev), ordinal)
        name = ctypes.create_string_buffer(128)
        self.call("cuDeviceGetName", name, 128, dev)
        major, minor = ctypes.c_int(), ctypes.c_int()
        self.call("cuDeviceGetAttribute", ctypes.byref(major), _CC_MAJOR, dev)
        self.call("cuDeviceGetAttribute", ctypes.byref(minor), _CC_MINOR, dev)
        return dev.value, name.value.decode(errors="replace"), (major.value, minor.value)

    def run_axpy(self, dev: int, cubin: bytes, name: str, a: int, x: Sequence[int], y: Sequence[int]) -> list[int]:
        """Load `cubin` on device `dev`, launch kernel `name`(a, x, y, out, n), return out."""
        n = len(x)
        ctx = ctypes.c_void_p()
        self.call("cuDevicePrimaryCtxRetain", ctypes.byref(ctx), dev)
        try:
            self.call("cuCtxSetCurrent", ctx)
            module, func = ctypes.c_void_p(), ctypes.c_void_p()
            self.call("cuModuleLoadData", ctypes.byref(module), ctypes.c_char_p(cubin))
            try:
                self.call("cuModuleGetFunction", ctypes.byref(func), module, name.encode())
                host_x, host_y = (ctypes.c_uint * n)(*x), (ctypes.c_uint * n)(*y)
                host_out = (ctypes.c_uint * n)()
                size = ctypes.sizeof(host_x)
                ptrs = [ctypes.c_uint64() for _ in range(3)]
                for ptr in ptrs:
                    self.call("cuMemAlloc_v2", ctypes.byref(ptr), ctypes.c_size_t(size))
                try:
                    self.call("cuMemcpyHtoD_v2", ptrs[0], host_x, ctypes.c_size_t(size))
                    self.call("cuMemcpyHtoD_v2", ptrs[1], host_y, ctypes.c_size_t(size))
                    args = [ctypes.c_uint(a), ptrs[0], ptrs[1], ptrs[2], ctypes.c_int(n)]
                    params = (ctypes.c_void_p * len(args))(
                        *(ctypes.cast(ctypes.byref(v), ctypes.c_void_p) for v in args)
                    )
                    block = 256
                    self.call(
                        "cuLaunchKernel", func, (n + block - 1) // block, 1, 1, block, 1, 1, 0, None, params, None
                    )
                    self.call("cuCtxSynchronize")
                    self.call("cuMemcpyDtoH_v2", host_out, ptrs[2], ctypes.c_size_t(size))
                finally:
                    for ptr in ptrs:
                        self.lib.cuMemFree_v2(ptr)
                return list(host_out)
            finally:
                self.lib.cuModuleUnload(module)
        finally:
            self.lib.cuDevicePrimaryCtxRelease_v2(dev)
