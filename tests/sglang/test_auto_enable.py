"""Auto-enable gates that turn FlashInfer fusion on for SM120 by themselves (0.5.4.post3 to 0.5.7, sglang#15650).

Those releases switch fusion on under `is_blackwell_supported()` (majors 10 and 12 by their own definition) and have
no flag to switch it off; with a FlashInfer older than 0.6.17 (no SM120 kernels) the server fails at start. The scan
reports it and the patch narrows the condition to SM100. Real release sources from PyPI.
"""

from __future__ import annotations

import ast
import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from lab.sglang_releases import release_dir, run_cli
from sm120check.sglang import fusion_gates
from sm120check.sglang.textedit import MARK
from sm120check.sglang.tree import SourceTree

pytestmark = pytest.mark.slow
SERVER_ARGS = "srt/server_args.py"
CRASHING = {
    "0.5.4.post3": "is_blackwell_supported()",
    "0.5.7": "is_sm90_supported() or is_blackwell_supported()",
}


def _scan(version: str | Path, flashinfer: str) -> dict[str, Any]:
    source = release_dir(version) if isinstance(version, str) else version
    args = ("--json", "--cc", "12.0", "--flashinfer-version", flashinfer, "--source", str(source))
    return json.loads(run_cli("scan", *args)[1])  # type: ignore[no-any-return,unused-ignore]


def _auto(scan: dict[str, Any]) -> list[dict[str, Any]]:
    return [f for f in scan["findings"] if str(f["id"]).startswith("fusion-auto-enable:")]


def _fusion_conditions(text: str) -> list[ast.expr]:
    """The conditions of the blocks that set enable_flashinfer_allreduce_fusion = True (as the scan reads them)."""
    return [
        node.test
        for node in ast.walk(ast.parse(text))
        if isinstance(node, ast.If)
        and fusion_gates._sets_fusion_on(node.body)
        and fusion_gates._blackwell_term(node.test)
    ]


@pytest.mark.parametrize("version", sorted(CRASHING))
def test_blackwell_definition_admits_sm120(version: str) -> None:
    assert fusion_gates.blackwell_majors(SourceTree(release_dir(version) / "sglang")) == (10, 12)


@pytest.mark.parametrize("version", sorted(CRASHING))
def test_auto_enable_with_an_old_flashinfer_is_a_patchable_finding(version: str) -> None:
    found = _auto(_scan(version, "0.5.3"))
    assert len(found) == 1 and found[0]["patchable"] and not found[0]["ok"]
    assert CRASHING[version] in str(found[0]["summary"]) and "sglang#15650" in str(found[0]["summary"])


@pytest.mark.parametrize("version", sorted(CRASHING))
def test_with_flashinfer_for_sm120_it_is_only_a_note(version: str) -> None:
    assert _auto(_scan(version, "0.7.2")) == []


def test_releases_that_gate_on_sm90_or_sm100_have_no_finding() -> None:
    assert _auto(_scan("0.5.9", "0.5.3")) == []


@pytest.mark.parametrize("version", sorted(CRASHING))
def test_patch_narrows_the_condition_to_sm100_and_reverts(version: str, tmp_path: Path) -> None:
    copy = tmp_path / "sglang"
    shutil.copytree(release_dir(version) / "sglang", copy)
    original = (copy / SERVER_ARGS).read_text(encoding="utf-8")
    args = ("--source", str(copy), "--cc", "12.0", "--flashinfer-version", "0.5.3", "--json")
    status, out = run_cli("patch", *args)
    assert status == 0, out
    patched = (copy / SERVER_ARGS).read_text(encoding="utf-8")
    assert _fusion_conditions(patched) == []  # no block turns fusion on under is_blackwell_supported() any more
    edited = [line for line in patched.splitlines() if "is_sm100_supported()" in line and MARK in line]
    assert edited and all("sglang#15650" in line for line in edited)
    # On an SM120 GPU (every capability helper false but Blackwell's), the condition was true and is now false.
    before = _fusion_conditions(original)
    helpers = {"is_blackwell_supported": lambda: True, "is_sm90_supported": lambda: False}
    after_helpers = {"is_sm100_supported": lambda: False, "is_sm90_supported": lambda: False}
    for cond in before:
        term = fusion_gates._blackwell_term(cond)
        assert term is not None
        text = ast.unparse(term)
        assert eval(text, dict(helpers)) is True
        assert eval(text.replace("is_blackwell_supported()", "is_sm100_supported()"), dict(after_helpers)) is False
    assert _auto(_scan(copy, "0.5.3")) == []
    assert run_cli("patch", "--revert", "--source", str(copy), "--json")[0] == 0
    assert (copy / SERVER_ARGS).read_text(encoding="utf-8") == original
