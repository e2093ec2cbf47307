"""The preflight patch's FlashInfer workspace constants, read from the real FlashInfer 0.7.2 and 0.7.4 wheels.

The wheels are downloaded once (tests/lab/wheels.py, cached outside the checkout); their comm/ sources are read from
the zip or unpacked into a site-packages beside a real SGLang 0.5.23 tree, as a node has them.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from lab.sglang_releases import release_dir, run_cli
from lab.wheels import flashinfer_wheel, read_member
from sm120check.sglang import flashinfer_workspace as fw

pytestmark = pytest.mark.slow  # downloads the two FlashInfer wheels once (pip's configured index)


def _site(tmp_path: Path, flashinfer: str, *, signal_pad: int | None = None) -> Path:
    """A site-packages with SGLang 0.5.23 and FlashInfer `flashinfer`'s comm sources (a constant changed if asked)."""
    site = tmp_path / "site-packages"
    shutil.copytree(release_dir("0.5.23") / "sglang", site / "sglang")
    wheel = flashinfer_wheel(flashinfer)
    for rel in (fw.MNNVL, fw.TRTLLM_AR):
        text = read_member(wheel, f"flashinfer/{rel}")
        if signal_pad is not None and rel == fw.MNNVL:
            text = text.replace("SIGNAL_PAD_SIZE = 2048", f"SIGNAL_PAD_SIZE = {signal_pad}")
        (site / "flashinfer" / rel).parent.mkdir(parents=True, exist_ok=True)
        (site / "flashinfer" / rel).write_text(text, encoding="utf-8")
    return site


@pytest.mark.parametrize("version", fw.CHECKED)
def test_the_checked_flashinfer_releases_have_the_constants_the_patch_sizes_with(version: str) -> None:
    wheel = flashinfer_wheel(version)
    found = fw.read(read_member(wheel, f"flashinfer/{fw.MNNVL}"), read_member(wheel, f"flashinfer/{fw.TRTLLM_AR}"))
    assert found == fw.WRITTEN_FOR
    assert found.signal_pad_size == 2048 and found.enable_multicast is False


def test_the_scan_reads_flashinfer_0_7_4_beside_sglang_and_patches(tmp_path: Path) -> None:
    site = _site(tmp_path, "0.7.4")
    args = ("--source", str(site / "sglang"), "--cc", "12.0", "--flashinfer-version", "0.7.4")
    status, text = run_cli("scan", *args)
    assert f"FlashInfer 0.7.4 workspace constants read from {site / 'flashinfer'} match the preflight patch's" in text
    scan = json.loads(run_cli("scan", *args, "--json")[1])
    finding = next(f for f in scan["findings"] if f["id"] == "fusion-preflight")
    assert finding["patchable"] and scan["flashinfer_workspace_constants"]["differences"] == []
    assert status == 1


def test_a_flashinfer_newer_than_the_newest_checked_gets_a_warning_naming_it(tmp_path: Path) -> None:
    site = _site(tmp_path, "0.7.4")
    _, text = run_cli("scan", "--source", str(site / "sglang"), "--cc", "12.0", "--flashinfer-version", "0.7.9")
    assert "warning: FlashInfer 0.7.9 is newer than 0.7.4, the newest release the preflight patch was checked" in text
    assert "its workspace constants match" in text


def test_a_flashinfer_whose_signal_pad_changed_is_not_patched(tmp_path: Path) -> None:
    site = _site(tmp_path, "0.7.4", signal_pad=4096)
    args = ("--source", str(site / "sglang"), "--cc", "12.0", "--flashinfer-version", "0.7.4", "--json")
    scan = json.loads(run_cli("scan", *args)[1])
    finding = next(f for f in scan["findings"] if f["id"] == "fusion-preflight")
    assert not finding["ok"] and not finding["patchable"]
    assert "mnnvl.SIGNAL_PAD_SIZE is 4096 (the patch sizes with 2048)" in finding["summary"]
    assert "left as is until sm120check learns the new sizes" in finding["summary"]
