"""FlashInfer release knowledge: which releases have SM120 fusion kernels, and where the JIT cache keeps them."""

from __future__ import annotations

from pathlib import Path

import pytest

from sm120check.jitcache import flashinfer_release, layout


@pytest.mark.parametrize(
    ("version", "majors"),
    [("0.6.3", (9, 10)), ("0.6.16", (9, 10)), ("0.6.17", (9, 10, 12)), ("0.7.2+cu130", (9, 10, 12))],
)
def test_sm120_kernels_arrive_in_0_6_17(version: str, majors: tuple[int, ...]) -> None:
    assert flashinfer_release.trtllm_comm_majors(flashinfer_release.parse_version(version)) == majors


def test_sm120_node_with_0_6_12_fails_with_the_upgrade() -> None:
    gate = flashinfer_release.fusion_support("0.6.12", ["12.0", "12.0"], multicast=False)
    assert not gate.ok
    assert "no SM120 allreduce-fusion kernels" in gate.summary
    assert gate.remedy == "pip install 'flashinfer-python>=0.6.17'"


def test_the_manifest_pin_is_the_remedy_when_known() -> None:
    gate = flashinfer_release.fusion_support("0.6.3", ["12.0"], multicast=False, pin="0.7.2")
    assert "flashinfer-python==0.7.2" in gate.remedy and "python_stack" in gate.remedy


def test_sm120_node_with_0_7_2_passes_the_gate() -> None:
    assert flashinfer_release.fusion_support("0.7.2", ["12.0", "12.0"], multicast=False).ok


def test_hopper_passes_with_old_releases_too() -> None:
    assert flashinfer_release.fusion_support("0.6.12", ["9.0", "9.0"], multicast=False).ok


def test_releases_up_to_0_6_9_need_multicast() -> None:
    gate = flashinfer_release.fusion_support("0.6.9", ["9.0", "9.0"], multicast=False)
    assert not gate.ok and "multicast" in gate.summary


def test_ampere_is_out_of_reach_but_pcie_ipc_is_mentioned_from_0_7_0() -> None:
    gate = flashinfer_release.fusion_support("0.7.2", ["8.6", "8.6"], multicast=False)
    assert not gate.ok and "PcieIpcAllReduceWorkspace" in gate.summary
    assert not flashinfer_release.has_pcie_ipc((0, 6, 17))


def test_a_version_that_is_not_one_is_named() -> None:
    with pytest.raises(ValueError, match="'latest'"):
        flashinfer_release.parse_version("latest")


@pytest.mark.parametrize(
    ("caps", "arch_list", "targets"),
    [
        (["9.0", "9.0"], None, ("90a",)),
        (["12.0", "12.0"], None, ("120f",)),
        (["12.0"], "12.0f", ("120f",)),
        (["9.0"], "9.0 12.0", ("90a", "120f")),
        (["9.0"], "12.0a", ("120a",)),
        (["12.1"], None, ("121a",)),
    ],
)
def test_jit_targets_follow_flashinfer_rules(caps: list[str], arch_list: str | None, targets: tuple[str, ...]) -> None:
    assert layout.jit_targets(caps, arch_list) == targets


def test_cache_path_honours_flashinfer_workspace_base(tmp_path: Path) -> None:
    root = layout.cache_root({"FLASHINFER_WORKSPACE_BASE": str(tmp_path)})
    library = layout.module_library(root, "0.7.2", layout.arch_dir(("90a",)), "trtllm_comm")
    assert library == tmp_path / ".cache/flashinfer/0.7.2/90a/cached_ops/trtllm_comm/trtllm_comm.so"


def test_cache_defaults_to_home(tmp_path: Path) -> None:
    assert layout.cache_root({}, home=tmp_path) == tmp_path / ".cache" / "flashinfer"


def test_bad_arch_list_names_the_variable() -> None:
    with pytest.raises(ValueError, match="FLASHINFER_CUDA_ARCH_LIST"):
        layout.jit_targets([], "sm_120")
