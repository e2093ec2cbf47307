"""The cache key: which FlashInfer, CUDA, target, torch and build context a cached module belongs to."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from jitcache_helpers import FIXTURES, KEY

from sm120check.jitcache.build import libcuda_problem
from sm120check.jitcache.key import BuildContext, CacheKey, KeyProblem, arch_dir, jit_debug, parse_nvcc_release

CONTEXT = BuildContext(
    flashinfer_dir="/opt/sm120kit/venv/lib/python3.12/site-packages/flashinfer",
    tvm_ffi_dir="/opt/sm120kit/venv/lib/python3.12/site-packages/tvm_ffi",
    python_include="/usr/include/python3.12",
    cuda_home="/opt/cuda",
    cache_root="/var/cache/sm120kit/.cache/flashinfer",
    cxx="c++ 13.3.0",
)


def test_cuda_release_is_read_from_real_nvcc_output() -> None:
    assert parse_nvcc_release((FIXTURES / "nvcc-version-13.0.88.txt").read_text()) == "13.0.88"


def test_unreadable_nvcc_output_is_named_in_the_error() -> None:
    with pytest.raises(KeyProblem, match="cannot read a CUDA release"):
        parse_nvcc_release("nvcc: command not found")


def test_sm120_gpu_gets_the_family_target_on_cuda_13() -> None:
    assert arch_dir(None, ["12.0", "12.0"], "13.0.88") == "120f"


def test_h200_gets_the_arch_specific_target() -> None:
    assert arch_dir(None, ["9.0"], "13.0.88") == "90a"


def test_declared_arch_list_wins_over_the_gpus_seen() -> None:
    assert arch_dir("12.0f", ["9.0"], "13.0.88") == "120f"


def test_build_host_without_gpu_must_declare_a_target() -> None:
    with pytest.raises(KeyProblem, match="flashinfer_jit_arch_list"):
        arch_dir("", [], "13.0.88")


def test_key_names_each_field_that_differs() -> None:
    other = dataclasses.replace(KEY, torch="2.11.0+cu130", arch="120f")
    assert KEY.differences(other) == ["arch: 90a vs 120f", "torch: 2.14.1 vs 2.11.0+cu130"]


def test_ignored_fields_are_not_compared() -> None:
    other = dataclasses.replace(KEY, torch="2.11.0+cu130")
    assert KEY.differences(other, ignore=["torch"]) == []


def test_moving_the_venv_changes_the_context() -> None:
    moved = dataclasses.replace(CONTEXT, flashinfer_dir="/srv/venv/lib/python3.12/site-packages/flashinfer")
    assert moved.digest() != CONTEXT.digest()
    assert CONTEXT.differences(moved)[0].startswith("flashinfer_dir:")


def test_slug_is_a_safe_file_name() -> None:
    key = dataclasses.replace(KEY, torch="2.13.0+cpu")
    assert key.slug() == "flashinfer-0.7.2_cuda-13.0.88_90a_torch-2.13.0-cpu_3db7a3a5f8161882"


def test_key_read_back_from_a_bundle_must_be_complete() -> None:
    with pytest.raises(KeyProblem, match="lacks context"):
        CacheKey.from_mapping({k: v for k, v in KEY.as_dict().items() if k != "context"}, "bundle.tar.gz")


def test_build_host_without_libcuda_is_told_before_compiling(tmp_path: Path) -> None:
    problem = libcuda_problem({}, tmp_path / "cuda", system_dirs=())
    assert problem is not None and "lib64/stubs/libcuda.so" in problem


def test_stub_directory_in_extra_ldflags_satisfies_the_link(tmp_path: Path) -> None:
    (tmp_path / "stubs").mkdir()
    (tmp_path / "stubs" / "libcuda.so").write_bytes(b"")
    env = {"FLASHINFER_EXTRA_LDFLAGS": f"-L{tmp_path / 'stubs'}"}
    assert libcuda_problem(env, tmp_path / "cuda", system_dirs=()) is None


def test_verbose_jit_means_debug_builds_unless_debug_is_set() -> None:
    assert jit_debug({"FLASHINFER_JIT_VERBOSE": "1"})
    assert not jit_debug({"FLASHINFER_JIT_VERBOSE": "1", "FLASHINFER_JIT_DEBUG": "0"})
