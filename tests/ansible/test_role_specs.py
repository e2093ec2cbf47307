"""Every role documents every variable: defaults and meta/argument_specs.yml agree, and each role has its rooms."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
ROLES = sorted(p for p in (ROOT / "roles").iterdir() if p.is_dir())


def _yaml(path: Path) -> Any:
    return yaml.safe_load(path.read_text()) if path.exists() else None


@pytest.mark.parametrize("role", ROLES, ids=[r.name for r in ROLES])
def test_role_has_its_rooms(role: Path) -> None:
    for room in ("defaults/main.yml", "meta/argument_specs.yml", "meta/main.yml", "tasks/main.yml", "README.md"):
        assert (role / room).is_file(), f"{role.name} lacks {room}"


@pytest.mark.parametrize("role", ROLES, ids=[r.name for r in ROLES])
def test_argument_spec_documents_every_default_with_its_value(role: Path) -> None:
    defaults = _yaml(role / "defaults/main.yml") or {}
    options = _yaml(role / "meta/argument_specs.yml")["argument_specs"]["main"]["options"]
    undocumented = sorted(set(defaults) - set(options))
    assert not undocumented, f"{role.name}: defaults without a spec entry: {undocumented}"
    for name, value in defaults.items():
        assert "default" in options[name], f"{role.name}: {name} has a default but its spec gives none"
        assert options[name]["default"] == value, f"{role.name}: {name} default differs between spec and defaults"
    for name, spec in options.items():
        assert spec.get("description"), f"{role.name}: {name} has no description"
        if "default" in spec and not spec.get("required"):
            assert name in defaults or not name.startswith(role.name), f"{role.name}: {name} in spec, not in defaults"


@pytest.mark.parametrize("role", ROLES, ids=[r.name for r in ROLES])
def test_role_variables_carry_the_role_prefix(role: Path) -> None:
    defaults = _yaml(role / "defaults/main.yml") or {}
    foreign = [name for name in defaults if not name.startswith(f"{role.name}_")]
    assert not foreign, f"{role.name}: public variables must be named {role.name}_*: {foreign}"
    internal = _yaml(role / "vars/main.yml") or {}
    wrong = [name for name in internal if not name.startswith(f"_{role.name}_")]
    assert not wrong, f"{role.name}: internal variables must be named _{role.name}_*: {wrong}"


def test_role_readmes_show_the_current_argument_specs() -> None:
    result = subprocess.run(
        [sys.executable, str(ROOT / "scripts/role_readme.py"), "--check"], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr
