"""The copy load's bookkeeping with stand-ins for libcuda and NVML (this machine has no GPU): medians, the busy link
samples, and a failing CUDA call that becomes LoadResult.error instead of an exception."""

from __future__ import annotations

import ctypes
from typing import Any

import pytest

from sm120check.doctor.gpu import load
from sm120check.doctor.gpu.payloads import LinkSample


class FakeCuda(load.Cuda):
    """Stand-in for libcuda: each copy 'takes' 5 ms; `fail_at` names a call that returns an error."""

    def __init__(self, fail_at: str = "") -> None:
        super().__init__(lib=None)  # type: ignore[arg-type]
        self.fail_at = fail_at
        self.calls: list[str] = []

    def call(self, func: str, *args: Any) -> None:
        self.calls.append(func)
        if func == self.fail_at:
            raise load.CudaCallFailed(f"{func} returned CUDA_ERROR_OUT_OF_MEMORY")
        if func in ("cuMemAlloc_v2", "cuMemHostAlloc", "cuEventCreate", "cuDevicePrimaryCtxRetain"):
            args[0]._obj.value = 0x1000
        if func == "cuEventElapsedTime":
            args[0]._obj.value = 5.0


class FakeNvml:
    def link_sample(self, handle: object) -> LinkSample:
        return LinkSample(5, 16, 0x4)


def test_measure_medians_and_busy_samples() -> None:
    cuda = FakeCuda()
    result = load.measure(cuda, 0, FakeNvml(), ctypes.c_void_p(1), size=256 << 20, busy_s=0.0, limit_s=5.0)  # type: ignore[arg-type]
    assert result.error == ""
    assert result.h2d_gbps == pytest.approx((256 << 20) / 0.005 / 1e9, rel=0.01)
    assert result.repeats == 3
    assert result.busy_gen == 5 and result.busy_width == 16 and result.busy_reasons == 0x4
    # everything allocated is released, the primary context too
    for freed in ("cuMemFreeHost", "cuMemFree_v2", "cuEventDestroy_v2", "cuDevicePrimaryCtxRelease_v2"):
        assert freed in cuda.calls


def test_failing_cuda_call_is_a_value() -> None:
    cuda = FakeCuda(fail_at="cuMemAlloc_v2")
    result = load.measure(cuda, 0, FakeNvml(), ctypes.c_void_p(1), busy_s=0.0)  # type: ignore[arg-type]
    assert result.h2d_gbps is None and "CUDA_ERROR_OUT_OF_MEMORY" in result.error
    assert "cuDevicePrimaryCtxRelease_v2" in cuda.calls
    assert not any(c.startswith("cuMemcpy") for c in cuda.calls)
