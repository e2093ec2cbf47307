"""The doctor's flashinfer_jit check: per module, cached for this node or how long the first server start blocks."""

from __future__ import annotations

from pathlib import Path

import pytest
from jitcache_helpers import built_module, module_dir, ninja

from sm120check.doctor.flashinfer_jit import flashinfer_jit as flashinfer_jit_check
from sm120check.doctor.flashinfer_jit.flashinfer_jit import FlashinferJitCheck, judge, module_rows, serving_env
from sm120check.doctor.model import Context, Status
from sm120check.manifest import CudaPins, Manifest, NcclPins

# The toolkit and NCCL pins: the flashinfer_jit check reads none of them.
NO_CUDA, NO_NCCL = CudaPins("", "", "", "", ""), NcclPins("", "")


def _manifest(venv: Path, env: dict[str, str]) -> Manifest:
    return Manifest(Path("m.json"), "full", NO_CUDA, NO_NCCL, "580.65.06", str(venv), {}, env, raw={})


def test_module_cached_for_this_key_passes(tmp_path: Path) -> None:
    root = tmp_path / "cache"
    built_module(root, tmp_path / "src")
    result = judge(module_rows(root, "0.7.2", "90a", ["demo"], ninja()), "here", "90a")
    assert result.status is Status.PASS
    assert "compiles nothing" in result.summary


def test_missing_allreduce_fusion_module_warns_how_long_the_first_start_blocks(tmp_path: Path) -> None:
    result = judge(module_rows(tmp_path, "0.7.2", "120f", ["trtllm_comm"], ninja()), "here", "120f")
    assert result.status is Status.WARN
    # trtllm_comm alone: 260-340 s measured for 90a (jitcache.cost); an SM120 node's 120f was never timed
    assert "trtllm_comm not cached" in result.summary
    assert (
        "an unmeasured time (260-340 s measured with FlashInfer 0.7.2, nvcc 13.0.88, target 90a on H200; "
        "120f not timed yet)" in result.summary
    )
    assert result.data["blocking_seconds_measured"] is False
    # where the figures come from, and what a load would really do
    sources = result.data["blocking_seconds_sources"]
    assert isinstance(sources, list)
    assert any("docs/validation/2026-12-01-h200-jit-builder" in s for s in sources)
    assert "trtllm_comm: a load would build the whole module (write build.ninja, compile every source, link)" in (
        result.details
    )
    assert result.remedy.startswith("ansible-playbook site.yml --tags flashinfer_jit ")


def test_module_left_by_a_combined_prebuild_is_reported_as_rebuilding(tmp_path: Path) -> None:
    root = tmp_path / "cache"
    built_module(root, tmp_path / "src", run_in=module_dir(root).parent)
    result = judge(module_rows(root, "0.7.2", "90a", ["demo"], ninja()), "here", "90a")
    assert result.status is Status.WARN
    assert "a load would run 2 build command(s)" in result.details


def test_serving_process_value_wins_over_the_manifest() -> None:
    ctx = Context(manifest=_manifest(Path("/v"), {"FLASHINFER_WORKSPACE_BASE": "/var/cache/sm120kit"}))
    assert serving_env(ctx, {})["FLASHINFER_WORKSPACE_BASE"] == "/var/cache/sm120kit"
    assert serving_env(ctx, {"FLASHINFER_WORKSPACE_BASE": "/srv"})["FLASHINFER_WORKSPACE_BASE"] == "/srv"


def test_node_without_flashinfer_skips(tmp_path: Path) -> None:
    result = FlashinferJitCheck().run(Context(manifest=_manifest(tmp_path, {})))
    assert result.status is Status.SKIP and "not installed" in result.summary


def test_cached_module_without_ninja_on_path_is_not_usable(tmp_path: Path) -> None:
    root = tmp_path / "cache"
    built_module(root, tmp_path / "src")
    result = judge(module_rows(root, "0.7.2", "90a", ["demo"], None), "here", "90a")
    assert result.status is Status.WARN and "no `ninja` on PATH" in result.details


def test_a_prebuilt_aot_module_counts_as_cached_without_ninja(tmp_path: Path) -> None:
    # As on the H200 run: the cross-built bundle installed with `unpack --into aot` loads with no compile.
    aot = tmp_path / "site" / "flashinfer" / "data" / "aot"
    (aot / "trtllm_comm").mkdir(parents=True)
    (aot / "trtllm_comm" / "trtllm_comm.so").write_bytes(b"\x7fELF")
    result = judge(module_rows(tmp_path / "cache", "0.7.2", "90a", ["trtllm_comm"], None, [aot]), "here", "90a")
    assert result.status is Status.PASS
    modules = result.data["modules"]
    assert isinstance(modules, list) and "prebuilt (AOT)" in modules[0]["why"]


def test_a_release_without_sm120_kernels_has_nothing_to_warm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # FlashInfer 0.6.10 builds allreduce fusion for majors 9 and 10 only, and has no pcie_ipc_comm.
    monkeypatch.setattr(flashinfer_jit_check, "flashinfer_version", lambda ctx: "0.6.10")
    result = FlashinferJitCheck().run(Context(manifest=_manifest(tmp_path, {"FLASHINFER_CUDA_ARCH_LIST": "12.0f"})))
    assert result.status is Status.SKIP and "no serving JIT module for target 120f" in result.summary


def test_another_flashinfer_release_on_the_measured_target_is_said_to_be_unmeasured(tmp_path: Path) -> None:
    """The table is FlashInfer 0.7.2's: a 0.7.4 node on 90a gets the figures labelled, not passed off as its own."""
    result = judge(module_rows(tmp_path, "0.7.4", "90a", ["trtllm_comm"], ninja()), "here", "90a", "0.7.4")
    assert "an unmeasured time (260-340 s measured with FlashInfer 0.7.2" in result.summary
    assert "FlashInfer 0.7.4 not timed yet" in result.summary
    assert result.data["blocking_seconds_measured"] is False


def test_the_measured_setup_says_what_it_measured(tmp_path: Path) -> None:
    result = judge(module_rows(tmp_path, "0.7.2", "90a", ["trtllm_comm"], ninja()), "here", "90a", "0.7.2")
    assert "~260-340 s (measured with FlashInfer 0.7.2, nvcc 13.0.88, target 90a on H200)" in result.summary
    assert result.data["blocking_seconds_measured"] is True
