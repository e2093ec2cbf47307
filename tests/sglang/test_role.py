"""Role `sglang_sm120` against a copy of a real SGLang release, on this machine (connection local)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from lab.sglang_releases import REPO, release_dir, tree_hashes

pytestmark = pytest.mark.slow
VENV = Path(sys.executable).parent.parent


def _play(tmp_path: Path, source: Path, *flags: str, **extra: str) -> dict[str, object]:
    playbook = tmp_path / "play.yml"
    playbook.write_text(
        "- hosts: localhost\n  connection: local\n  gather_facts: false\n  roles: [sglang_sm120]\n", encoding="utf-8"
    )
    variables = {
        "sglang_sm120_venv": str(VENV),
        "sglang_sm120_source": str(source),
        "sglang_sm120_cc": "12.0",
        "sglang_sm120_flashinfer_version": "0.7.2",
        **extra,
    }
    env = {
        **os.environ,
        "ANSIBLE_ROLES_PATH": str(REPO / "roles"),
        "ANSIBLE_STDOUT_CALLBACK": "ansible.builtin.json",
        "ANSIBLE_LOCALHOST_WARNING": "false",
        "ANSIBLE_INVENTORY_UNPARSED_WARNING": "false",
    }
    proc = subprocess.run(
        [str(VENV / "bin" / "ansible-playbook"), str(playbook), "-e", json.dumps(variables), *flags],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    stats: dict[str, object] = json.loads(proc.stdout)["stats"]["localhost"]
    return stats


@pytest.fixture
def source(tmp_path: Path) -> Path:
    copy = tmp_path / "sglang"
    shutil.copytree(release_dir("0.5.9") / "sglang", copy)
    return copy


def test_check_mode_reports_a_change_and_changes_nothing(tmp_path: Path, source: Path) -> None:
    before = tree_hashes(source)
    assert _play(tmp_path, source, "--check", "--diff")["changed"] == 1
    assert tree_hashes(source) == before


def test_converge_changes_then_second_converge_changes_nothing(tmp_path: Path, source: Path) -> None:
    assert _play(tmp_path, source)["changed"] == 1
    assert _play(tmp_path, source)["changed"] == 0


def test_reverted_state_restores_the_release(tmp_path: Path, source: Path) -> None:
    before = tree_hashes(source)
    _play(tmp_path, source)
    assert _play(tmp_path, source, sglang_sm120_state="reverted")["changed"] == 1
    assert tree_hashes(source) == before


def test_role_skips_when_sglang_is_not_installed(tmp_path: Path) -> None:
    stats = _play(tmp_path, Path(), sglang_sm120_source="")  # the dev venv has sm120check but no SGLang
    assert stats["changed"] == 0 and stats["failures"] == 0
