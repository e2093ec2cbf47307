"""The playbooks parse and the whole Ansible tree passes ansible-lint's production profile."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
PLAYBOOKS = ["site.yml", *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "playbooks").glob("*.yml"))]


def _tool(name: str) -> str:
    path = BIN / name
    found = str(path) if path.exists() else shutil.which(name)
    if not found:
        pytest.fail(f"{name} is not installed; run `make dev`")
    return found


@pytest.mark.parametrize("playbook", PLAYBOOKS)
def test_playbook_syntax(playbook: str) -> None:
    result = subprocess.run(
        [_tool("ansible-playbook"), "--syntax-check", playbook],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, "ANSIBLE_NOCOLOR": "1"},
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_ansible_lint_production_profile() -> None:
    result = subprocess.run(
        [_tool("ansible-lint"), "--profile", "production", "--nocolor"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-6000:]
