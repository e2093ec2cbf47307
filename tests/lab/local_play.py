"""Run a play on this machine (connection local) with variables from a JSON file, roles from roles/: how the fast
role tests render a role's files into a temporary directory."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
ANSIBLE = str(Path(sys.executable).parent / "ansible-playbook")


def local_play(tmp: Path, play: str, variables: dict[str, Any], *args: str) -> subprocess.CompletedProcess[str]:
    """`ansible-playbook PLAY -i localhost, -e @vars.json ARGS` in `tmp`, bounded (300 s)."""
    (tmp / "play.yml").write_text(play)
    (tmp / "vars.json").write_text(json.dumps({**variables, "ansible_python_interpreter": sys.executable}))
    return subprocess.run(
        [ANSIBLE, str(tmp / "play.yml"), "-i", "localhost,", "-e", f"@{tmp / 'vars.json'}", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
        env={**os.environ, "ANSIBLE_ROLES_PATH": str(ROOT / "roles"), "ANSIBLE_NOCOLOR": "1"},
    )
