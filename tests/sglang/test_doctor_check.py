"""The doctor's `sglang_sm120` check: the scan as a verdict, with the patch command as remedy."""

from __future__ import annotations

import pytest
from sglang_releases import release_dir

from sm120check.doctor.checks import sglang as check_module
from sm120check.doctor.model import Context, Result, Status


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
