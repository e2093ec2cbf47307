"""The doctor's `sglang_sm120` check: the scan as a verdict, with the patch command as remedy."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from lab.sglang_releases import release_dir, run_cli
from sm120check.doctor.model import Context, Result, Status
from sm120check.doctor.sglang_sm120 import sglang as check_module


def _driver_with_cc(cc: str) -> Result:
    return Result("driver", Status.PASS, "1 GPU", data={"gpus": [{"index": 0, "cc": cc}]})


def test_check_skips_when_sglang_is_not_installed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("sm120check.sglang.tree.find_installed", lambda: None)
    result = check_module.SglangSm120().run(Context())
    assert result.status is Status.SKIP and "not installed" in result.summary


@pytest.mark.slow
def test_check_fails_on_unpatched_0_5_9_for_sm120_with_the_patch_as_remedy(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("sm120check.sglang.tree.find_installed", lambda: release_dir("0.5.9") / "sglang")
    result = check_module.SglangSm120().run(Context(results={"driver": _driver_with_cc("12.0")}))
    assert result.status is Status.FAIL
    assert result.remedy.startswith("sm120check sglang patch")
    assert "eagle3:KimiK25ForConditionalGeneration" in result.data["failing"]  # type: ignore[operator]


@pytest.mark.slow
def test_check_on_0_5_23_fails_on_the_preflight_then_passes_patched_naming_models_without_eagle3(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    copy = tmp_path / "sglang"
    shutil.copytree(release_dir("0.5.23") / "sglang", copy)
    monkeypatch.setattr("sm120check.sglang.tree.find_installed", lambda: copy)
    monkeypatch.setattr("sm120check.sglang.tree.flashinfer_version", lambda root=None: ("0.7.2", "test"))
    ctx = Context(results={"driver": _driver_with_cc("12.0")})
    before = check_module.SglangSm120().run(ctx)
    assert before.status is Status.FAIL and "fusion-preflight" in before.data["failing"]  # type: ignore[operator]
    status, out = run_cli("patch", "--source", str(copy), "--cc", "12.0", "--flashinfer-version", "0.7.2", "--json")
    assert status == 0, out
    after = check_module.SglangSm120().run(ctx)
    assert after.status is Status.PASS, after.summary
    assert "EAGLE-3 not available for" in after.summary
    assert "KimiK3ForConditionalGeneration" in after.data["eagle3_unavailable"]  # type: ignore[operator]
    assert "EAGLE-3 not supported for KimiK3ForConditionalGeneration" in after.details
