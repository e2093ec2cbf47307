"""The login-shell environment (roles/cuda_env/templates/profile.sh.j2) keeps every value exactly and runs nothing.

The template is rendered by a real `ansible-playbook` (connection local, the `template` module, the role's own
vars/main.yml), then sourced by dash (`sh`) and bash from an empty environment; the exported values are read back
by a child Python. Hostile values try to run `touch <marker>`: the marker file must never appear. The venv hook
(sm120kit_env.py.j2) is rendered from the same values and must hold the same environment. No container, no root.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
SHELLS = [s for s in ("/bin/sh", "/bin/dash", "/bin/bash") if Path(s).exists()]
READ_ENV = "import json, os, sys; sys.stdout.write(json.dumps(dict(os.environ)))"


def _hostile_values(marker: Path) -> dict[str, Any]:
    touch = f"touch {marker}"
    return {
        "TORCH_CUDA_ARCH_LIST": "9.0 12.0",
        "SM120KIT_T_BRACE": f"x}}$({touch})",
        "SM120KIT_T_BRACE_QUOTED": f"'x}}$({touch})'",
        "SM120KIT_T_BACKTICK": f"`{touch}`",
        "SM120KIT_T_SEMICOLON": f"; {touch}; #",
        "SM120KIT_T_QUOTES": "it's \"quoted\" '' \"\" '\\''",
        "SM120KIT_T_DOLLAR": "$HOME ${HOME} $$ $0 ${HOME:-x} $(( 1 + 1 ))",
        "SM120KIT_T_BACKSLASH": "a\\b\\\\c \\n \\t \\",
        "SM120KIT_T_NEWLINES": f"line one\nline two\n$({touch})\n",
        "SM120KIT_T_UNICODE": "ünïcødé ✓ 日本語 \u00a0 \u2028",
        "SM120KIT_T_GLOB": "* ? [a-z] ~root ~",
        "SM120KIT_T_EMPTY": "",
        "SM120KIT_T_SPACES": "  leading and trailing  ",
        "SM120KIT_T_INT": 1,
        "SM120KIT_T_REMOVED": None,
    }


@pytest.fixture(scope="module")
def rendered(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Render both templates once with ansible-playbook; return the paths and the values used."""
    if not (BIN / "ansible-playbook").exists() and not shutil.which("ansible-playbook"):
        pytest.fail("ansible-playbook is not installed; run `make dev`")
    tmp = tmp_path_factory.mktemp("profile")
    marker = tmp / "pwned"
    cuda_home = f"{tmp}/cu da$(touch {marker})'\"`touch {marker}`"
    values = _hostile_values(marker)
    extra = {
        "cuda_env_vars": values,
        "cuda_env_cuda_home": cuda_home,
        "cuda_env_venv": "/opt/sm120kit/venv",
        "cuda_env_module": "sm120kit_env",
        "out_dir": str(tmp),
        "role_dir": str(ROOT / "roles/cuda_env"),
        "ansible_python_interpreter": sys.executable,
    }
    (tmp / "extra.json").write_text(json.dumps(extra))
    playbook = tmp / "render.yml"
    playbook.write_text(
        """---
- name: Render the cuda_env templates
  hosts: localhost
  connection: local
  gather_facts: false
  vars_files:
    - "{{ role_dir }}/vars/main.yml"
  tasks:
    - name: Render profile.sh
      ansible.builtin.template:
        src: "{{ role_dir }}/templates/profile.sh.j2"
        dest: "{{ out_dir }}/profile.sh"
        mode: "0644"
    - name: Render the venv hook
      ansible.builtin.template:
        src: "{{ role_dir }}/templates/sm120kit_env.py.j2"
        dest: "{{ out_dir }}/sm120kit_env.py"
        mode: "0644"
"""
    )
    ansible = str(BIN / "ansible-playbook") if (BIN / "ansible-playbook").exists() else "ansible-playbook"
    result = subprocess.run(
        [ansible, "-i", "localhost,", "-e", f"@{tmp / 'extra.json'}", str(playbook)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
        env={**os.environ, "ANSIBLE_NOCOLOR": "1", "ANSIBLE_RETRY_FILES_ENABLED": "0"},
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    assert not marker.exists(), "rendering ran a command"
    return {"dir": tmp, "marker": marker, "values": values, "cuda_home": cuda_home}


def _source(shell: str, script: Path, cwd: Path, env: dict[str, str] | None = None) -> dict[str, str]:
    """The environment a child sees after `shell` sources `script` from an (almost) empty environment."""
    result = subprocess.run(
        [
            "env",
            "-i",
            "PATH=/usr/bin:/bin",
            *(f"{k}={v}" for k, v in (env or {}).items()),
            shell,
            "-c",
            '. "$1" && exec "$2" -c "$3"',
            shell,
            str(script),
            sys.executable,
            READ_ENV,
        ],
        cwd=cwd,
        capture_output=True,
        check=False,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr.decode(errors="replace")
    assert result.stderr == b"", result.stderr.decode(errors="replace")
    environ: dict[str, str] = json.loads(result.stdout)
    return environ


def _expected(values: dict[str, Any]) -> dict[str, str]:
    return {name: str(value) for name, value in values.items() if value is not None}


@pytest.mark.parametrize("shell", SHELLS)
def test_profile_parses(rendered: dict[str, Any], shell: str) -> None:
    script = rendered["dir"] / "profile.sh"
    result = subprocess.run([shell, "-n", str(script)], capture_output=True, text=True, check=False, timeout=60)
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize("shell", SHELLS)
def test_every_value_round_trips_and_nothing_runs(rendered: dict[str, Any], shell: str) -> None:
    environ = _source(shell, rendered["dir"] / "profile.sh", rendered["dir"])
    for name, value in _expected(rendered["values"]).items():
        assert environ.get(name) == value, f"{name}: {environ.get(name)!r} != {value!r}"
    assert "SM120KIT_T_REMOVED" not in environ
    assert environ["PATH"].split(":")[0] == rendered["cuda_home"] + "/bin"
    assert environ["PATH"].endswith(":/usr/bin:/bin")
    assert not rendered["marker"].exists(), f"sourcing profile.sh in {shell} ran a command"


@pytest.mark.parametrize("shell", SHELLS)
def test_values_already_set_win_and_path_is_not_doubled(rendered: dict[str, Any], shell: str) -> None:
    cuda_bin = rendered["cuda_home"] + "/bin"
    preset = {"TORCH_CUDA_ARCH_LIST": "12.0", "SM120KIT_T_DOLLAR": "mine", "PATH": f"/usr/bin:{cuda_bin}:/bin"}
    # `env -i PATH=... NAME=...`: the later PATH wins.
    environ = _source(shell, rendered["dir"] / "profile.sh", rendered["dir"], env=preset)
    assert environ["TORCH_CUDA_ARCH_LIST"] == "12.0"
    assert environ["SM120KIT_T_DOLLAR"] == "mine"
    assert environ["PATH"] == f"/usr/bin:{cuda_bin}:/bin"
    # As today (`${NAME:=...}`): an empty value counts as unset and gets the node's value.
    environ = _source(shell, rendered["dir"] / "profile.sh", rendered["dir"], env={"TORCH_CUDA_ARCH_LIST": ""})
    assert environ["TORCH_CUDA_ARCH_LIST"] == "9.0 12.0"
    assert not rendered["marker"].exists()


def test_sourcing_twice_changes_nothing(rendered: dict[str, Any]) -> None:
    script = rendered["dir"] / "profile.sh"
    result = subprocess.run(
        [
            "env",
            "-i",
            "PATH=/usr/bin:/bin",
            "/bin/sh",
            "-c",
            '. "$1" && . "$1" && printf %s "$PATH"',
            "sh",
            str(script),
        ],
        capture_output=True,
        check=False,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.decode() == rendered["cuda_home"] + "/bin:/usr/bin:/bin"


def test_venv_hook_holds_the_same_environment(rendered: dict[str, Any]) -> None:
    hook = rendered["dir"] / "sm120kit_env.py"
    result = subprocess.run(
        [
            "env",
            "-i",
            "PATH=/usr/bin:/bin",
            sys.executable,
            "-c",
            f"import runpy; runpy.run_path({str(hook)!r}); {READ_ENV}",
        ],
        capture_output=True,
        check=False,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr.decode(errors="replace")
    environ = json.loads(result.stdout)
    for name, value in _expected(rendered["values"]).items():
        assert environ.get(name) == value, f"{name}: {environ.get(name)!r} != {value!r}"
    assert "SM120KIT_T_REMOVED" not in environ
    assert rendered["cuda_home"] + "/bin" in environ["PATH"].split(":")
    assert not rendered["marker"].exists()
