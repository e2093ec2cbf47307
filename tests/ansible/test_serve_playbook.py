"""docs/bench.md's recipe starts its servers with `ansible-playbook playbooks/serve.yml ...`: the commands run as
written (here rendering into a temporary directory instead of /etc and systemd)."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ANSIBLE = str(Path(sys.executable).parent / "ansible-playbook")


def _recipe_commands() -> list[list[str]]:
    text = (ROOT / "docs" / "bench.md").read_text()
    recipe = text.split("## From a provisioned node to a decision", 1)[1].split("```sh", 1)[1].split("```", 1)[0]
    return [shlex.split(line.split("#", 1)[0]) for line in recipe.splitlines() if line.startswith("ansible-playbook ")]


def _run(argv: list[str], tmp_path: Path) -> subprocess.CompletedProcess[str]:
    (tmp_path / "units").mkdir(exist_ok=True)
    (tmp_path / "doctor.json").write_text(json.dumps({"schema": "sm120check.doctor/1", "results": []}))
    rendering = {
        "sglang_server_python": "/bin/true",
        "sglang_server_config_dir": str(tmp_path / "etc"),
        "sglang_server_unit_dir": str(tmp_path / "units"),
        "sglang_server_doctor_report": str(tmp_path / "doctor.json"),
        "sglang_server_start": False,
        "ansible_python_interpreter": sys.executable,
    }
    (tmp_path / "vars.json").write_text(json.dumps(rendering))
    return subprocess.run(
        [ANSIBLE, *argv[1:], "-i", "localhost,", "-c", "local", "-e", f"@{tmp_path / 'vars.json'}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
        env={**os.environ, "ANSIBLE_NOCOLOR": "1"},
    )


def test_recipe_names_the_serve_playbook_twice() -> None:
    commands = _recipe_commands()
    assert [argv[1] for argv in commands] == ["playbooks/serve.yml", "playbooks/serve.yml"]
    result = subprocess.run(
        [ANSIBLE, "--syntax-check", "playbooks/serve.yml"], cwd=ROOT, capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_recipe_base_then_eagle3_launch_commands(tmp_path: Path) -> None:
    base, spec = _recipe_commands()
    launches = []
    for argv in (base, spec):
        result = _run(argv, tmp_path)
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
        launches.append((tmp_path / "etc" / "launch-command.txt").read_text())
    assert "--model-path /models/target" in launches[0]
    assert "--speculative-algorithm" not in launches[0]
    assert re.search(r"--speculative-algorithm EAGLE3\b", launches[1])
    assert "--speculative-draft-model-path /models/eagle3-draft" in launches[1]
