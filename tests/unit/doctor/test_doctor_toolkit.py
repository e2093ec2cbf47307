"""toolkit: CUDA_HOME resolved like FlashInfer, nvcc version against the manifest, sm_120 target."""

from __future__ import annotations

from pathlib import Path

import pytest
from doctor_helpers import facts_for, fixture

from sm120check.doctor.cuda_toolkit.toolkit import NvccSm120Check, no_host_compiler, parse_nvcc_version, toolkit_verdict
from sm120check.doctor.facts import CudaHome, resolve_cuda_home
from sm120check.doctor.model import Context, Result, Status

VERSION = (0, fixture("nvcc-version-13.0.88.txt"))
CODES = fixture("nvcc-list-gpu-code-13.0.88.txt")
HOME = CudaHome("/usr/local/cuda", "CUDA_HOME")


def _which(path: str | None):  # type: ignore[no-untyped-def]
    return lambda name: path


def test_cuda_home_wins_over_cuda_path_and_nvcc_on_path() -> None:
    env = {"CUDA_HOME": "/opt/cuda", "CUDA_PATH": "/opt/other"}
    assert resolve_cuda_home(env, _which("/usr/bin/nvcc")) == CudaHome("/opt/cuda", "CUDA_HOME")


def test_empty_cuda_home_falls_through_to_cuda_path() -> None:
    assert resolve_cuda_home({"CUDA_HOME": "", "CUDA_PATH": "/opt/cuda"}, _which(None)) == CudaHome(
        "/opt/cuda", "CUDA_PATH"
    )


def test_nvcc_on_path_gives_its_grandparent() -> None:
    # This machine's `which nvcc` is the wrapper /usr/local/bin/nvcc: FlashInfer then uses /usr/local.
    assert resolve_cuda_home({}, _which("/usr/local/bin/nvcc")) == CudaHome("/usr/local", "which nvcc")


def test_usr_local_cuda_is_the_last_resort() -> None:
    assert resolve_cuda_home({}, _which(None), lambda p: True) == CudaHome("/usr/local/cuda", "/usr/local/cuda")
    assert resolve_cuda_home({}, _which(None), lambda p: False) == CudaHome("", "none")


def test_nvcc_version_output_parses_release_and_build() -> None:
    assert parse_nvcc_version(VERSION[1]) == ("13.0", "13.0.88")


def test_toolkit_matching_the_manifest_passes() -> None:
    result = toolkit_verdict(HOME, VERSION, CODES, "13.0.88", "/usr/local/cuda")
    assert result.status is Status.PASS, result
    assert result.data["nvcc"] == "13.0.88"


def test_nvcc_other_than_the_manifest_pin_fails_naming_both() -> None:
    result = toolkit_verdict(HOME, VERSION, CODES, "13.0.48", "")
    assert result.status is Status.FAIL
    assert "nvcc 13.0.88 but the manifest pins 13.0.48" in result.summary
    assert "--tags cuda_toolkit" in result.remedy


def test_cuda_12_nvcc_fails() -> None:
    cuda12 = (0, VERSION[1].replace("release 13.0, V13.0.88", "release 12.8, V12.8.93"))
    result = toolkit_verdict(HOME, cuda12, CODES, "", "")
    assert result.status is Status.FAIL and "not 13" in result.summary


def test_nvcc_without_sm_120_fails() -> None:
    result = toolkit_verdict(HOME, VERSION, CODES.replace("sm_120\n", ""), "", "")
    assert result.status is Status.FAIL and "cannot target sm_120" in result.summary


def test_cuda_home_other_than_the_manifests_warns() -> None:
    result = toolkit_verdict(CudaHome("/usr/local", "which nvcc"), VERSION, CODES, "13.0.88", "/opt/cuda")
    assert result.status is Status.WARN
    assert "CUDA_HOME=/opt/cuda" in result.remedy


def test_missing_nvcc_fails_with_the_path_tried() -> None:
    result = toolkit_verdict(CudaHome("/opt/cuda", "CUDA_HOME"), (127, "No such file"), "", "", "")
    assert result.status is Status.FAIL and "/opt/cuda/bin/nvcc does not run" in result.summary


@pytest.mark.skipif(not Path("/usr/local/cuda/bin/nvcc").exists(), reason="no /usr/local/cuda/bin/nvcc here")
def test_real_nvcc_builds_an_sm_120_cubin() -> None:
    ctx = Context(
        facts=facts_for(toolkit_home=CudaHome("/usr/local/cuda", "CUDA_HOME")),
        results={"toolkit": Result("toolkit", Status.PASS, "")},
    )
    result = NvccSm120Check().run(ctx)
    assert result.status is Status.PASS, result.details
    assert int(str(result.data["cubin_bytes"])) > 1000


def test_nvcc_without_a_host_compiler_is_named_with_the_package_to_install() -> None:
    # nvcc 13.0.88's output in a fresh Debian 12 container without gcc (seen in the lab's first converge).
    output = "gcc: No such file or directory\nnvcc fatal   : Failed to preprocess host compiler properties.\n"
    assert no_host_compiler(output)
    assert not no_host_compiler("ptxas fatal   : Value 'sm_120' is not defined for option 'gpu-name'")
