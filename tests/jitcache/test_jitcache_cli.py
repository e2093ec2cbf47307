"""`python -m sm120check.jitcache`: exit codes and messages a role or a person reads."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from jitcache_helpers import KEY, built_module

from sm120check.jitcache import bundle
from sm120check.jitcache.cli import main
from sm120check.jitcache.key import BuildContext

CONTEXT = BuildContext("/venv/flashinfer", "/venv/tvm_ffi", "/usr/include/python3.12", "/opt/cuda", "/c", "c++ 12.2.0")


def _bundle(tmp_path: Path) -> Path:
    root = tmp_path / "cache"
    built_module(root, tmp_path / "src")
    out = tmp_path / "demo.tar.gz"
    bundle.pack(root, KEY, CONTEXT, ["demo"], out)
    return out


def test_verify_reports_the_bundle_as_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = _bundle(tmp_path)
    assert main(["verify", "--no-key-check", "--json", str(out)]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["ok"] and report["modules"] == ["demo"] and report["key"]["arch"] == "90a"


def test_damaged_bundle_exits_1_with_the_problem(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = _bundle(tmp_path)
    out.write_bytes(out.read_bytes()[:200])
    assert main(["verify", "--no-key-check", "--json", str(out)]) == 1
    assert "copy it again" in json.loads(capsys.readouterr().out)["problem"]


def test_unknown_key_field_to_ignore_is_a_usage_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["verify", "--no-key-check", "--ignore", "pytorch", str(tmp_path / "x.tar.gz")]) == 2
    assert "--ignore pytorch: not key fields (flashinfer, cuda, arch, torch, context)" in capsys.readouterr().err


def test_key_without_flashinfer_says_which_python_to_use(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["key", "--arch-list", "12.0f"]) == 2
    assert "run with the stack venv's python" in capsys.readouterr().err


def test_default_modules_are_what_this_flashinfer_serves_for_the_key() -> None:
    # The role passes no --modules by default: the registry decides, per FlashInfer release and target.
    from dataclasses import replace

    from sm120check.jitcache.cli import default_modules

    assert default_modules(KEY) == ["trtllm_comm", "pcie_ipc_comm"]
    assert default_modules(replace(KEY, flashinfer="0.6.17", arch="120f")) == ["trtllm_comm"]
    assert default_modules(replace(KEY, flashinfer="0.6.10", arch="120f")) == []
