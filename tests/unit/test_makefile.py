"""What the make targets a newcomer types really run (`make -n`, nothing executed)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _dry_run(tmp_path: Path, *args: str) -> list[str]:
    make = shutil.which("make")
    if make is None:
        pytest.fail("make is not installed (apt-get install make)", pytrace=False)
    # A venv that does not exist yet: the dry run prints every step a fresh checkout would take.
    result = subprocess.run(
        [make, "-n", *args, f"VENV={tmp_path / 'venv'}"], cwd=ROOT, capture_output=True, text=True, check=True
    )
    return result.stdout.splitlines()


def test_provision_passes_the_profile_to_ansible_playbook(tmp_path: Path) -> None:
    playbook_lines = [line for line in _dry_run(tmp_path, "provision", "PROFILE=full") if "ansible-playbook" in line]
    assert len(playbook_lines) == 1, playbook_lines
    assert playbook_lines[0].split()[1:] == ["site.yml", "-e", "sm120kit_profile=full"]


def test_provision_defaults_to_the_core_profile(tmp_path: Path) -> None:
    playbook_lines = [line for line in _dry_run(tmp_path, "provision") if "ansible-playbook" in line]
    assert playbook_lines[0].endswith("-e sm120kit_profile=core")


def test_provision_installs_no_developer_tools(tmp_path: Path) -> None:
    lines = _dry_run(tmp_path, "provision")
    installs = [line for line in lines if "pip install" in line]
    assert any("-r requirements.txt" in line for line in installs), installs
    assert not any("requirements-dev.txt" in line for line in lines), lines


def test_the_test_command_gets_every_developer_requirement(tmp_path: Path) -> None:
    lines = _dry_run(tmp_path, "test-fast")
    assert any("-r requirements-dev.txt" in line for line in lines), lines
    # The developer file carries the provisioning one, so the suite also has Ansible.
    assert "-r requirements.txt" in (ROOT / "requirements-dev.txt").read_text().splitlines()


def test_provisioning_requirements_hold_ansible_and_no_test_tools() -> None:
    names = [
        line.split("==")[0].strip()
        for line in (ROOT / "requirements.txt").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    assert names == ["ansible"]
