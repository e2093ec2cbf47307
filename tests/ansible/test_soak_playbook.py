"""playbooks/soak.yml: soaks a rack node by node with `sm120check soak`, and passes Ansible's syntax check."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
ANSIBLE = str(Path(sys.executable).parent / "ansible-playbook")
PLAYBOOK = ROOT / "playbooks" / "soak.yml"


def test_soak_playbook_passes_the_syntax_check() -> None:
    result = subprocess.run(
        [ANSIBLE, "--syntax-check", str(PLAYBOOK)], cwd=ROOT, capture_output=True, text=True, check=False, timeout=300
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_soak_playbook_goes_one_node_at_a_time_and_runs_the_soak() -> None:
    (play,) = yaml.safe_load(PLAYBOOK.read_text())
    assert play["serial"] == 1
    soak = next(t for t in play["tasks"] if t["name"] == "Soak the node")
    argv = soak["ansible.builtin.command"]["argv"]
    assert argv[0] == "timeout" and argv[5:7] == ["soak", "--url"]
    assert {"--concurrency", "--duration", "--out"} <= set(argv)
    fleet = next(t for t in play["tasks"] if t["name"] == "Show the fleet view so far")
    assert "--fleet" in fleet["ansible.builtin.command"]["argv"] and fleet["delegate_to"] == "localhost"
