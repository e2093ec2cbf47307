"""abi: CUDA 12 wheels in the stack venv, and mapped libraries against the loader cache (recorded outputs)."""

from __future__ import annotations

from pathlib import Path

from doctor_helpers import fixture

from sm120check.doctor import loader, stackenv
from sm120check.doctor.model import Status
from sm120check.doctor.python_stack.abi import libs_verdict, torch_cuda_major, wheels_verdict

CACHE_TWO_NCCL = loader.parse_ldconfig(fixture("ldconfig-p-two-nccl.txt"))
MAPS_AGREE = loader.parse_maps(fixture("proc-self-maps-agree.txt"))
MAPS_DIFFER = loader.parse_maps(fixture("proc-self-maps-differ.txt"))


def _venv(tmp_path: Path, dists: dict[str, str], records: dict[str, str] | None = None) -> Path:
    site = tmp_path / "lib" / "python3.12" / "site-packages"
    for name, version in dists.items():
        info = site / f"{name.replace('-', '_')}-{version}.dist-info"
        info.mkdir(parents=True)
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n", encoding="utf-8")
        if records and name in records:
            (info / "RECORD").write_text(records[name], encoding="utf-8")
    return tmp_path


def _verdict(venv: Path) -> Status:
    return wheels_verdict(stackenv.installed(venv), str(venv), stackenv.nvidia_layouts(venv)).status


def test_torch_cuda_major_from_its_version() -> None:
    assert torch_cuda_major("2.11.0+cu130") == 13
    assert torch_cuda_major("2.9.1+cu128") == 12
    assert torch_cuda_major("2.14.1") == 13  # PyPI builds from 2.11 on are CUDA 13
    assert torch_cuda_major("2.10.0") == 12
    assert torch_cuda_major("2.13.0+cpu") is None


def test_cu12_wheel_beside_cuda13_torch_fails_with_uninstall_command(tmp_path: Path) -> None:
    venv = _venv(tmp_path, {"torch": "2.14.1", "nvidia-cuda-nvrtc-cu12": "12.8.93", "nvidia-cuda-nvrtc": "13.0.88"})
    result = wheels_verdict(stackenv.installed(venv), str(venv))
    assert result.status is Status.FAIL
    assert "nvidia-cuda-nvrtc-cu12 12.8.93" in result.summary
    assert f"{venv}/bin/pip uninstall -y nvidia-cuda-nvrtc-cu12" in result.remedy


def test_sgl_kernel_0_3_is_flagged_as_cuda_12(tmp_path: Path) -> None:
    venv = _venv(tmp_path, {"torch": "2.14.1", "sgl-kernel": "0.3.21"})
    result = wheels_verdict(stackenv.installed(venv), str(venv))
    assert result.status is Status.FAIL and "sgl-kernel 0.3.21" in result.summary


def test_clean_cuda13_venv_passes(tmp_path: Path) -> None:
    venv = _venv(tmp_path, {"torch": "2.14.1", "sglang-kernel": "0.4.10", "nvidia-nccl-cu13": "2.30.7"})
    assert wheels_verdict(stackenv.installed(venv), str(venv)).status is Status.PASS


def test_ldconfig_output_parses_every_cache_entry() -> None:
    assert CACHE_TWO_NCCL["libnvrtc.so.13"] == ["/tmp/sm120kit-fixture/opt-cuda-13.0.1/lib/libnvrtc.so.13"]
    assert len(CACHE_TWO_NCCL["libnccl.so.2"]) == 2
    system = loader.parse_ldconfig(fixture("ldconfig-p-this-machine.txt"))
    assert system["libcudart.so.13"] == ["/usr/local/cuda-13.0/lib/libcudart.so.13"]


def test_maps_parse_to_one_path_per_library() -> None:
    assert MAPS_DIFFER["libnvrtc"] == ["/tmp/nvrtcwheel/nvidia/cu13/lib/libnvrtc.so.13"]
    assert set(MAPS_AGREE) == {"libnvrtc", "libcudart", "libnccl"}


def test_maps_agreeing_with_the_cache_raise_no_mismatch() -> None:
    assert loader.mapped_vs_cache(MAPS_AGREE, CACHE_TWO_NCCL) == []


def test_nvrtc_mapped_from_elsewhere_than_the_cache_is_reported() -> None:
    (problem,) = loader.mapped_vs_cache(MAPS_DIFFER, CACHE_TWO_NCCL)
    assert problem.startswith("libnvrtc: process maps /tmp/nvrtcwheel/nvidia/cu13/lib/libnvrtc.so.13")


def test_two_nccl_copies_on_the_loader_path_warn() -> None:
    result = libs_verdict(MAPS_AGREE, CACHE_TWO_NCCL, {})
    assert result.status is Status.WARN
    assert "libnccl: 2 copies on the loader path" in result.summary


def test_single_copies_matching_the_cache_pass() -> None:
    cache = {k: v[:1] for k, v in CACHE_TWO_NCCL.items()}
    assert libs_verdict(MAPS_AGREE, cache, {}).status is Status.PASS


def test_cuda12_runtime_mapped_in_a_torch_process_fails() -> None:
    mapped = {"libcudart": ["/venv/lib/python3.12/site-packages/nvidia/cuda_runtime/lib/libcudart.so.12"]}
    result = libs_verdict(mapped, {}, {})
    assert result.status is Status.FAIL and "CUDA 12 copy mapped" in result.summary


def test_cuda13_math_wheels_with_library_version_12_pass(tmp_path: Path) -> None:
    # torch 2.11+ depends on cuFFT 12.0 (CUDA 13.0's cuFFT): its version is the library's, its files are cu13's.
    record = fixture("nvidia_cufft-12.0.0.61.RECORD")
    venv = _venv(tmp_path, {"torch": "2.14.1", "nvidia-cufft": "12.0.0.61"}, {"nvidia-cufft": record})
    assert "nvidia/cu13/lib/libcufft.so.12" in record
    assert _verdict(venv) is Status.PASS


def test_unsuffixed_wheel_with_files_under_cu12_fails(tmp_path: Path) -> None:
    record = fixture("nvidia_cufft-12.0.0.61.RECORD").replace("nvidia/cu13/", "nvidia/cu12/")
    venv = _venv(tmp_path, {"torch": "2.14.1", "nvidia-cufft": "11.4.1.4"}, {"nvidia-cufft": record})
    result = wheels_verdict(stackenv.installed(venv), str(venv), stackenv.nvidia_layouts(venv))
    assert result.status is Status.FAIL and "nvidia-cufft 11.4.1.4 (files under nvidia/cu12)" in result.summary


# What a torch 2.11+cu130 process mapped on the 2x H200 machine (docs/validation/2026-11-30-h200x2/l2.json), and
# that machine's loader cache entries for the same libraries (from the same run's abi_libs details).
H200_VENV = "/opt/torch/.venv/lib/python3.12/site-packages/nvidia"
H200_MAPPED = {
    "libnccl": [f"{H200_VENV}/nccl/lib/libnccl.so.2"],
    "libnvrtc": [f"{H200_VENV}/cu13/lib/libnvrtc.so.13"],
    "libcuda": ["/usr/local/nvidia/lib64/libcuda.so.580.159.04"],
    "libcudart": [f"{H200_VENV}/cu13/lib/libcudart.so.13"],
}
H200_CACHE = {
    "libnvrtc.so.13": ["/usr/local/cuda/targets/x86_64-linux/lib/libnvrtc.so.13"],
    "libcudart.so.13": ["/usr/local/cuda/targets/x86_64-linux/lib/libcudart.so.13"],
    "libnccl.so.2": ["/lib/x86_64-linux-gnu/libnccl.so.2"],
}


def test_torch_using_its_own_cuda13_runtime_copies_is_a_note_not_a_warning() -> None:
    cache = {k: v for k, v in H200_CACHE.items() if not k.startswith("libnccl")}
    cache["libnccl.so.2"] = list(H200_MAPPED["libnccl"])  # the node's NCCL is torch's wheel, as sm120kit sets it
    result = libs_verdict(H200_MAPPED, cache, {"libnvrtc": "/opt/cuda/lib64"})
    assert result.status is Status.PASS
    assert "libnvrtc: process maps" in result.details and "the manifest says /opt/cuda/lib64" in result.details


def test_a_second_nccl_on_the_loader_path_beside_torchs_warns() -> None:
    result = libs_verdict(H200_MAPPED, H200_CACHE, {})
    assert result.status is Status.WARN
    assert result.summary.startswith("a torch process maps libraries other than the node's: libnccl")


def test_cutlass_dsl_cu12_libs_beside_their_cu13_twin_pass_with_a_note(tmp_path: Path) -> None:
    # SGLang 0.5.23's full install (tests/integration/test_full_profile.py): nvidia-cutlass-dsl 4.8.0 always
    # requires nvidia-cutlass-dsl-libs-cu12, and -libs-cu13 through its [cu13] extra.
    dists = {
        "torch": "2.14.1",
        "nvidia-cutlass-dsl": "4.8.0",
        "nvidia-cutlass-dsl-libs-cu12": "4.8.0",
        "nvidia-cutlass-dsl-libs-cu13": "4.8.0",
    }
    venv = _venv(tmp_path, dists)
    result = wheels_verdict(stackenv.installed(venv), str(venv))
    assert result.status is Status.PASS
    assert "nvidia-cutlass-dsl-libs-cu12 4.8.0 (beside nvidia-cutlass-dsl-libs-cu13 4.8.0)" in result.details


def test_cu12_flavour_without_its_cu13_twin_still_fails(tmp_path: Path) -> None:
    venv = _venv(tmp_path, {"torch": "2.14.1", "nvidia-cutlass-dsl-libs-cu12": "4.8.0"})
    assert wheels_verdict(stackenv.installed(venv), str(venv)).status is Status.FAIL
