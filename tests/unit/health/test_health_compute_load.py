"""The SM load: the spin kernel compiles with the real NVRTC on CPU (no GPU needed: the dev venv's nvidia-cuda-nvrtc
wheel from requirements-dev.txt, or a CUDA toolkit's copy), the launch bookkeeping runs against a stand-in libcuda,
and gpu_clocks judges the reasons sampled under the load. The real launch needs a GPU: tests/gpu/test_health_gpu.py
on the device machine."""

from __future__ import annotations

import ctypes
import dataclasses
import itertools
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from sm120check.doctor.gpu import load
from sm120check.doctor.gpu.payloads import ClockSample, ComputeLoad, GpuHealth, NodeHealth
from sm120check.doctor.node_health import verdicts
from sm120check.doctor.nvrtc_api import Nvrtc, NvrtcError

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "health"


def _h200() -> GpuHealth:
    data = json.loads((FIXTURES / "h200-2026-12-01-busy.json").read_text(encoding="utf-8"))
    (gpu,) = NodeHealth.from_json(data).gpus
    return gpu


def _nvrtc() -> Nvrtc:
    """The NVRTC the doctor's load would open (soname, then the CUDA 13 wheels and toolkits). requirements-dev.txt
    installs nvidia-cuda-nvrtc into the dev venv, so NVRTC always exists where these tests run: missing is a failure."""
    nvrtc, error = load.open_nvrtc()
    if nvrtc is None:
        pytest.fail(f"{error}: `make dev` installs nvidia-cuda-nvrtc==13.0.88 (requirements-dev.txt)", pytrace=False)
    return nvrtc


@pytest.mark.parametrize(("cc", "arch"), [((9, 0), "compute_90"), ((12, 0), "compute_120")])
def test_the_spin_kernel_compiles_to_ptx_for_the_devices_own_architecture(cc: tuple[int, int], arch: str) -> None:
    nvrtc = _nvrtc()
    assert load.ptx_arch(cc, nvrtc.supported_archs()) == arch
    raw = load.compile_ptx(nvrtc, arch)
    assert raw.endswith(b"\0"), "cuModuleLoadData needs NUL-terminated PTX"
    ptx = raw.rstrip(b"\0").decode()
    assert f".target sm_{arch.removeprefix('compute_')}" in ptx
    # the entry cuModuleGetFunction looks up by name (extern "C": unmangled), with the kernel's two parameters (the
    # float * as .u64, NVVM 20 adding `.ptr .align 1` for sm_120; the unsigned int iterations as .u32)
    name = load.SPIN_KERNEL_NAME
    entry = re.search(
        rf"\.visible \.entry {name}\(\s*\.param \.u64 [^,]*{name}_param_0,\s*\.param \.u32 {name}_param_1\s*\)", ptx
    )
    assert entry, ptx[:800]
    assert ptx.count("fma.rn.f32") >= 4, "the four FMA chains were optimised away"


def test_nvrtc_from_a_wheel_off_the_loader_path_finds_its_builtins_and_compiles() -> None:
    """A fresh interpreter (no builtins loaded yet), NVRTC opened from the wheel's file as open_nvrtc falls back to
    when the soname does not resolve: nvrtcCompileProgram must find libnvrtc-builtins.so.13.0 beside it."""
    wheel = [p for p in load.nvrtc_candidates() if "site-packages" in p]
    assert wheel, "no nvidia-cuda-nvrtc wheel on sys.path: `make dev` installs it (requirements-dev.txt)"
    code = (
        "import sys; from sm120check.doctor.gpu import load; "
        "ptx = load.compile_ptx(load._open_file(sys.argv[1]), 'compute_90'); print(len(ptx))"
    )
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path), LD_LIBRARY_PATH="/nonexistent")
    proc = subprocess.run(
        [sys.executable, "-c", code, wheel[0]], capture_output=True, text=True, env=env, timeout=60, check=False
    )
    assert proc.returncode == 0, proc.stderr
    assert int(proc.stdout) > 1000


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
