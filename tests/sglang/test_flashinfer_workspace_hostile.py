"""FlashInfer's constants reader on hostile files (reliability probe 3, defects 11 and 15: FI1-FI3, FI5, FI6): the
files are read bounded, regular files only (a FIFO hung the scan, /dev/zero took 3.5 GB), an expression nested past
the parser's depth is said, and a constant is the value Python leaves, its last assignment (with `X *= 2` applied)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from sm120check.sglang import flashinfer_workspace as fw

MNNVL = "SIGNAL_PAD_SIZE = 2048\n"
TRTLLM_AR = (
    "MAX_COMM_SIZE = 2147483647 & ~((1 << 21) - 1)\n"
    "BarrierFlagCount = 256\n"
    f"def {fw.WORKSPACE_FUNCTION}():\n"
    "    return SymmDeviceMemory(1, enable_multicast=False)\n"
)


def _flashinfer(tmp_path: Path, mnnvl: str = MNNVL, trtllm_ar: str = TRTLLM_AR) -> Path:
    package = tmp_path / "flashinfer"
    (package / "comm").mkdir(parents=True)
    (package / fw.MNNVL).write_text(mnnvl, encoding="utf-8")
    (package / fw.TRTLLM_AR).write_text(trtllm_ar, encoding="utf-8")
    return package


def test_the_stand_in_matches_what_the_patch_was_written_for(tmp_path: Path) -> None:
    result = fw.check(_flashinfer(tmp_path), "0.7.2")
    assert result.agrees and result.constants == fw.WRITTEN_FOR


@pytest.mark.timeout(30)
def test_a_fifo_or_a_device_in_place_of_a_source_file_is_refused_naming_it(tmp_path: Path) -> None:
    package = _flashinfer(tmp_path)
    target = package / fw.TRTLLM_AR
    target.unlink()
    os.mkfifo(target)  # was a hang (killed at 60 s)
    result = fw.check(package, "0.7.2")
    assert result.differences == (f"{target}: is a FIFO (named pipe), not a regular file; reinstall FlashInfer",)
    target.unlink()
    target.symlink_to("/dev/zero")  # was a MemoryError traceback at 3.5 GB
    result = fw.check(package, "0.7.2")
    assert result.differences == (f"{target}: is a device, not a regular file; reinstall FlashInfer",)


def test_an_expression_nested_past_the_parsers_depth_is_said(tmp_path: Path) -> None:
    deep = TRTLLM_AR + "MAX_COMM_SIZE = " + "+".join(["1"] * 200_000) + "\n"  # was a RecursionError traceback
    package = _flashinfer(tmp_path, trtllm_ar=deep)
    result = fw.check(package, "0.7.2")
    assert result.constants is None and len(result.differences) == 1
    assert result.differences[0].startswith(f"{package}: ")


def test_a_huge_integer_is_not_a_constant(tmp_path: Path) -> None:
    package = _flashinfer(tmp_path, mnnvl="SIGNAL_PAD_SIZE = 0x" + "f" * 5000 + "\n")
    result = fw.check(package, "0.7.2")
    assert result.differences == (
        f"{fw.MNNVL}: SIGNAL_PAD_SIZE is not an integer expression (a literal of 5002 hex digits)",
    )
    package = _flashinfer(tmp_path / "decimal", mnnvl="SIGNAL_PAD_SIZE = " + "9" * 5000 + "\n")
    result = fw.check(package, "0.7.2")  # Python's parser refuses it
    assert result.constants is None and result.differences[0].startswith(f"{package}: not Python FlashInfer ships: ")


@pytest.mark.parametrize(
    "mnnvl", ["SIGNAL_PAD_SIZE = 2048\nSIGNAL_PAD_SIZE = 4096\n", "SIGNAL_PAD_SIZE = 2048\nSIGNAL_PAD_SIZE *= 2\n"]
)
def test_a_constant_is_its_last_value_as_python_leaves_it(tmp_path: Path, mnnvl: str) -> None:
    result = fw.check(_flashinfer(tmp_path, mnnvl=mnnvl), "0.7.2")  # was read as 2048: "match the preflight patch's"
    assert result.differences == ("mnnvl.SIGNAL_PAD_SIZE is 4096 (the patch sizes with 2048)",)
    assert "match the preflight patch" not in fw.describe(result)
