"""nvrtc and sm120_jit: verdict logic, and the real NVRTC 13 on this machine (no GPU needed)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from doctor_helpers import SRC, doctor, find_nvrtc_dir, fixture, write_manifest

from sm120check.doctor.cuda_toolkit.nvrtc import nvrtc_verdict
from sm120check.doctor.cuda_toolkit.nvrtc_launch import jit_verdict
from sm120check.doctor.cuda_toolkit.nvrtc_launch_payload import JitLaunch, LaunchRow
from sm120check.doctor.model import Status
from sm120check.doctor.nvrtc_api import Compiled

ARCHS_13_0 = [75, 80, 86, 87, 88, 89, 90, 100, 103, 110, 120, 121]  # nvrtcGetSupportedArchs of NVRTC 13.0.88


@pytest.fixture(scope="module")
def nvrtc_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    found = find_nvrtc_dir(tmp_path_factory.mktemp("nvrtc"))
    if found is None:
        pytest.skip("no libnvrtc.so.13 here (CUDA tree, wheel, or the nvidia-cuda-nvrtc wheel from the index)")
    return found


class _Opened:
    path = "/opt/cuda-13.0.1/lib/libnvrtc.so.13"


def test_nvrtc_not_resolving_by_soname_fails_and_names_wheel_copies() -> None:
    copies = ["/opt/sm120kit/venv/lib/python3.12/site-packages/nvidia/cu13/lib/libnvrtc.so.13"]
    result = nvrtc_verdict(None, "libnvrtc.so.13: cannot open shared object file", None, (), copies, "", "")
    assert result.status is Status.FAIL
    assert copies[0] in result.details
    assert "--tags cuda_env" in result.remedy


def test_nvrtc_13_with_sm_120_passes() -> None:
    result = nvrtc_verdict(_Opened(), "", (13, 0), ARCHS_13_0, [], "/opt/cuda-13.0.1/lib", "13.0.88")  # type: ignore[arg-type]
    assert result.status is Status.PASS and "NVRTC 13.0 from /opt/cuda-13.0.1/lib/libnvrtc.so.13" in result.summary


def test_nvrtc_12_fails() -> None:
    result = nvrtc_verdict(_Opened(), "", (12, 8), [75, 120], [], "", "")  # type: ignore[arg-type]
    assert result.status is Status.FAIL and "not CUDA 13" in result.summary


def test_nvrtc_from_another_dir_than_the_manifest_warns() -> None:
    result = nvrtc_verdict(_Opened(), "", (13, 0), ARCHS_13_0, [], "/usr/local/cuda-13.0/lib", "")  # type: ignore[arg-type]
    assert result.status is Status.WARN and "not from the manifest's lib_dir" in result.summary


def test_missing_builtins_error_points_at_the_loader_path_fix() -> None:
    failed = Compiled("sm_120", False, 7, log=fixture("nvrtc-error7-log.txt"))
    result = jit_verdict([failed, failed, failed], None, "")
    assert result.status is Status.FAIL
    assert "NVRTC_ERROR_BUILTIN_OPERATION_FAILURE" in result.summary
    assert "libnvrtc-builtins.so.13.0" in result.details and "--tags cuda_env" in result.remedy


def test_gpu_launch_mismatch_fails_naming_the_gpu() -> None:
    ok = [Compiled(a, True, 0, b"x" * 5792) for a in ("sm_120", "sm_120a", "sm_120f")]
    launch = JitLaunch("/usr/lib/libnvrtc.so.13", (LaunchRow(0, "NVIDIA H200", "9.0", "sm_90", False, mismatches=3),))
    result = jit_verdict(ok, launch, "")
    assert result.status is Status.FAIL and "GPU 0 (sm_90): 3 wrong elements" in result.details


def test_launch_probe_timeout_fails() -> None:
    ok = [Compiled(a, True, 0, b"x") for a in ("sm_120", "sm_120a", "sm_120f")]
    result = jit_verdict(ok, None, "timed out after 120 s (killed with its process group)")
    assert result.status is Status.FAIL and "timed out" in result.summary


def test_real_nvrtc_by_soname_passes_and_jit_builds_sm120_family(nvrtc_dir: Path, tmp_path: Path) -> None:
    manifest = write_manifest(tmp_path, lib_dir=str(nvrtc_dir))
    run = doctor(
        "--select", "nvrtc,sm120_jit", "--json", "--manifest", str(manifest), env={"LD_LIBRARY_PATH": str(nvrtc_dir)}
    )
    results = {r["id"]: r for r in json.loads(run.stdout)["results"]}
    assert results["nvrtc"]["status"] == "pass", results["nvrtc"]
    assert results["nvrtc"]["data"]["path"] == str(nvrtc_dir / "libnvrtc.so.13")
    assert 120 in results["nvrtc"]["data"]["supported_archs"]
    assert results["sm120_jit"]["status"] == "pass", results["sm120_jit"]
    assert results["sm120_jit"]["data"]["sm_120f_cubin_bytes"] > 1000
    assert run.returncode == 0


def test_real_nvrtc_opened_by_path_without_loader_path_cannot_compile(nvrtc_dir: Path) -> None:
    code = (
        "import ctypes, json; from sm120check.doctor.nvrtc_api import Nvrtc; "
        f"c = Nvrtc(ctypes.CDLL({str(nvrtc_dir / 'libnvrtc.so.13')!r})).compile('sm_120'); "
        "print(json.dumps([c.code, c.log]))"
    )
    env = {k: v for k, v in os.environ.items() if k != "LD_LIBRARY_PATH"} | {"PYTHONPATH": str(SRC)}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60, check=True)
    code_, log = json.loads(out.stdout)
    if code_ == 0:
        pytest.skip("libnvrtc-builtins.so.13.0 resolves through the loader cache here")
    assert code_ == 7 and "libnvrtc-builtins.so.13.0" in log
