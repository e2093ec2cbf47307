"""The SM load: the spin kernel compiles with the real NVRTC (where this machine has one), the launch bookkeeping
runs against a stand-in libcuda (no GPU here), and gpu_clocks judges the reasons sampled under the load."""

from __future__ import annotations

import ctypes
import dataclasses
import itertools
import json
from pathlib import Path
from typing import Any

import pytest

from sm120check.doctor.health import load, verdicts
from sm120check.doctor.health.payloads import ClockSample, ComputeLoad, GpuHealth, NodeHealth
from sm120check.doctor.nvrtc_api import Nvrtc, NvrtcError

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "health"


def _h200() -> GpuHealth:
    data = json.loads((FIXTURES / "h200-2026-12-01-busy.json").read_text(encoding="utf-8"))
    (gpu,) = NodeHealth.from_json(data).gpus
    return gpu


def _nvrtc() -> Nvrtc:
    try:
        return Nvrtc.open()
    except OSError:
        pytest.skip("libnvrtc.so.13 does not load here")


def test_the_spin_kernel_compiles_to_ptx_for_the_devices_own_architecture() -> None:
    nvrtc = _nvrtc()
    arch = load.ptx_arch((9, 0), nvrtc.supported_archs())
    assert arch == "compute_90"
    ptx = load.compile_ptx(nvrtc, arch).decode()
    assert ".target sm_90" in ptx and f".entry {load.SPIN_KERNEL_NAME}" in ptx and "fma.rn.f32" in ptx


def test_a_newer_gpu_than_nvrtc_knows_gets_its_newest_ptx_and_an_older_one_none() -> None:
    assert load.ptx_arch((13, 0), [90, 100, 120]) == "compute_120"
    assert load.ptx_arch((12, 0), [90, 100, 120]) == "compute_120"
    assert load.ptx_arch((7, 0), [75, 80]) == ""


def test_a_kernel_that_does_not_compile_names_the_call_and_the_log() -> None:
    with pytest.raises(NvrtcError, match=r"nvrtcCompileProgram.*NVRTC_ERROR_COMPILATION.*error"):
        load.compile_ptx(_nvrtc(), "compute_90", 'extern "C" __global__ void k() { undefined_thing(); }')


class SpinCuda(load.Cuda):
    """Stand-in for libcuda (no GPU here): a launch 'takes' 1 ns per iteration; `fail_at` makes a call fail."""

    def __init__(self, fail_at: str = "") -> None:
        super().__init__(lib=None)  # type: ignore[arg-type]
        self.fail_at = fail_at
        self.launched: list[int] = []
        self.calls: list[str] = []

    def call(self, func: str, *args: Any) -> None:
        self.calls.append(func)
        if func == self.fail_at:
            raise load.CudaCallFailed(f"{func} returned CUDA_ERROR_UNSUPPORTED_PTX_VERSION")
        if func == "cuDeviceGetAttribute":
            args[0]._obj.value = {16: 132, 75: 9, 76: 0}[args[1]]
        elif func in ("cuDevicePrimaryCtxRetain", "cuModuleLoadData", "cuModuleGetFunction", "cuEventCreate"):
            args[0]._obj.value = 0x1000
        elif func == "cuMemAlloc_v2":
            args[0]._obj.value = 0x2000
        elif func == "cuLaunchKernel":
            params = args[9]
            self.launched.append(ctypes.c_uint.from_address(params[1]).value)
        elif func == "cuEventElapsedTime":
            args[0]._obj.value = self.launched[-1] * 1e-6  # ms


class ClockNvml:
    def clock_sample(self, handle: object) -> ClockSample:
        return ClockSample(0x4, 1980, 690_000, 41)


def test_the_iteration_count_is_calibrated_then_fixed_and_every_resource_is_released() -> None:
    cuda = SpinCuda()
    result = load.spin(cuda, 0, ClockNvml(), ctypes.c_void_p(1), _nvrtc(), spin_s=0.4)  # type: ignore[arg-type]
    assert result.error == "" and result.arch == "compute_90" and result.blocks == 132 * load.BLOCKS_PER_SM
    calibration, timed = cuda.launched[:-1], cuda.launched[-1]
    assert calibration[0] == load.FIRST_ITERATIONS and all(b == a * 8 for a, b in itertools.pairwise(calibration))
    assert timed * 1e-9 == pytest.approx(0.4, rel=0.01) and timed <= load.MAX_ITERATIONS
    assert result.iterations == timed and result.samples and result.reasons == 0x4
    assert {"cuModuleUnload", "cuMemFree_v2", "cuDevicePrimaryCtxRelease_v2"} <= set(cuda.calls)


def test_a_failing_cuda_call_becomes_the_loads_error() -> None:
    cuda = SpinCuda(fail_at="cuModuleLoadData")
    result = load.spin(cuda, 0, ClockNvml(), ctypes.c_void_p(1), _nvrtc())  # type: ignore[arg-type]
    assert result.error == "cuModuleLoadData returned CUDA_ERROR_UNSUPPORTED_PTX_VERSION" and not cuda.launched
    assert "cuDevicePrimaryCtxRelease_v2" in cuda.calls


def test_without_nvrtc_the_load_says_so() -> None:
    result = load.spin(SpinCuda(), 0, ClockNvml(), ctypes.c_void_p(1), None, "NVRTC does not load (x)")  # type: ignore[arg-type]
    assert result.error == "NVRTC does not load (x)" and not result.samples


def _under_load(reasons: int, temperature: int = 52) -> GpuHealth:
    samples = (ClockSample(0x1, 345, 90_000, 40), ClockSample(reasons, 1755, 700_000, temperature))
    return dataclasses.replace(_h200(), compute=ComputeLoad(0.41, 1 << 28, 528, 256, "compute_90", samples))


def test_sw_power_cap_under_the_sm_load_is_normal_and_said_so() -> None:
    verdict = verdicts.clocks(_under_load(0x4))
    assert verdict.status == verdicts.PASS and "under the SM load" in verdict.summary
    assert "SW power cap under the SM load: normal" in verdict.summary
    assert "SM clock min 345 MHz, power max 700 W, temperature max 52 C" in verdict.details


@pytest.mark.parametrize(("bit", "name"), [(0x8, "HW slowdown"), (0x40, "HW thermal"), (0x80, "HW power brake")])
def test_hardware_slowdown_under_the_sm_load_fails(bit: int, name: str) -> None:
    verdict = verdicts.clocks(_under_load(0x4 | bit))
    assert verdict.status == verdicts.FAIL and name in verdict.summary and "under the SM load" in verdict.summary
    assert "PSU" in verdict.remedy


def test_hot_under_load_warns() -> None:
    verdict = verdicts.clocks(_under_load(0x4, temperature=88))
    assert verdict.status == verdicts.WARN and "88 C" in verdict.summary


def test_a_load_that_could_not_run_warns_instead_of_passing_at_rest() -> None:
    gpu = dataclasses.replace(_h200(), compute=ComputeLoad(0.0, 0, 0, 256, "", error="NVRTC does not load (x)"))
    verdict = verdicts.clocks(gpu)
    assert verdict.status == verdicts.WARN and "could not load the SMs (NVRTC does not load (x))" in verdict.summary
    assert "libnvrtc.so.13" in verdict.remedy
