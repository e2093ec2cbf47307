"""The doctor's torch check and preflight hold NCCL to the one floor of doctor/nccl_floor.json."""

from __future__ import annotations

from pathlib import Path

import pytest

from sm120check.doctor import nccl_floor
from sm120check.doctor.gpu import load
from sm120check.doctor.model import Status
from sm120check.doctor.python_stack import torch as torch_check
from sm120check.doctor.python_stack.torch_info_payload import TorchInfo


def _torch(nccl: str) -> TorchInfo:
    return TorchInfo(True, version="2.14.1", cuda="13.0", arch_list=("sm_90", "sm_120"), nccl=nccl, cuda_available=True)


def test_the_torch_check_without_a_manifest_refuses_a_known_bad_nccl_with_its_reason() -> None:
    assert torch_check.NCCL_MIN == nccl_floor.floor() == "2.27.3"
    bad = torch_check.torch_verdict(_torch("2.26.2"), "", gpus_expected=False)
    assert bad.status is Status.FAIL and "NCCL 2.26.2 is a known-bad release on SM120" in bad.summary
    assert "floor 2.27.3" in bad.summary and "NVIDIA/nccl#2418" in bad.summary
    old = torch_check.torch_verdict(_torch("2.21.5"), "", gpus_expected=False)
    assert old.status is Status.FAIL and "no SM120 support" in old.summary


@pytest.mark.parametrize("nccl", ["2.27.3", "2.28.9", "2.30.7"])
def test_the_torch_check_accepts_releases_at_or_above_the_floor(nccl: str) -> None:
    assert torch_check.torch_verdict(_torch(nccl), "", gpus_expected=False).status is Status.PASS


def test_the_table_is_shipped_as_package_data() -> None:
    pyproject = Path(__file__).resolve().parents[3] / "python/sm120check/pyproject.toml"
    assert '"doctor/nccl_floor.json"' in pyproject.read_text(encoding="utf-8")
    assert nccl_floor.TABLE.is_file() and nccl_floor.KNOWN_BAD


def test_nvrtc_is_also_looked_for_in_the_cuda_13_wheels(tmp_path: Path) -> None:
    wheel = tmp_path / "nvidia" / "cu13" / "lib"
    wheel.mkdir(parents=True)
    (wheel / "libnvrtc.so.13").write_bytes(b"")  # a stand-in file: only the search is tested
    assert load.nvrtc_candidates([str(tmp_path)])[0] == str(wheel / "libnvrtc.so.13")
