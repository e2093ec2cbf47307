"""Role variables set directly, and a CUDA release the components do not belong to, in a real preflight run.

Reliability probe section 10 (role variables bypassed the sm120kit_* rules) and A24 (`sm120kit_cuda_version=13.9.99`
passed): `site.yml --check --tags preflight_validate` on this machine, asserts on the control node only, no change.
The rules themselves are unit-tested in test_manifest_rules.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
ANSIBLE = str(Path(sys.executable).parent / "ansible-playbook")


def _preflight(tmp: Path, variables: dict[str, Any], inventory: str = "inventory/localhost.yml") -> str:
    (tmp / "vars.json").write_text(json.dumps(variables))
    # validation only: the node facts (gathered under any tags) would reach for the example inventories' hosts
    command = [ANSIBLE, "-i", inventory, "site.yml", "--check", "--tags", "preflight_validate"]
    command += ["--skip-tags", "preflight_node"]
    result = subprocess.run(
        [*command, "-e", f"@{tmp / 'vars.json'}"],
        cwd=ROOT, capture_output=True, text=True, check=False, timeout=300, env={**os.environ, "ANSIBLE_NOCOLOR": "1"},
    )  # fmt: skip
    return f"rc={result.returncode}\n{result.stdout}"


def test_hostile_role_variables_and_a_cuda_release_without_components_are_refused_by_name(tmp_path: Path) -> None:
    out = _preflight(
        tmp_path,
        {
            "python_stack_venv": "/usr",
            "cuda_toolkit_method": "apt",
            "cuda_toolkit_apt_mirror": "http://x/$(id)",
            "sm120check_bin_link": "/usr/local/bin",
            "flashinfer_jit_node_bundle_dir": "/var/cache",
            "sm120kit_cuda_version": "13.9.99",
        },
    )
    assert not out.startswith("rc=0"), out[-3000:]
    assert "nothing was changed" in out
    for message in (
        "python_stack_venv: '/usr' is a system directory",
        "see roles/python_stack/README.md",
        "cuda_toolkit_apt_mirror: 'http://x/$(id)' is not an http(s) URL",
        "sm120check_bin_link: '/usr/local/bin' is a system directory",
        "flashinfer_jit_node_bundle_dir: '/var/cache' is a system directory",
        "sm120kit_cuda_version: '13.9.99' is CUDA 13.9, but the pinned sm120kit_cuda_components are CUDA 13.0",
        "sm120kit_cuda_version: '13.9.99' differs from sm120kit_cuda_apt_version '13.0.1-1'",
    ):
        assert message in out, message + "\n" + out[-4000:]


def test_the_shipped_inventories_pass_with_the_role_defaults(tmp_path: Path) -> None:
    for inventory in ("inventory/localhost.yml", "inventory/example-pcie-8gpu.yml"):
        for method in ("wheels", "apt"):
            out = _preflight(tmp_path, {"cuda_toolkit_method": method}, inventory)
            assert out.startswith("rc=0"), f"{inventory} {method}\n" + out[-3000:]


def test_the_play_shows_the_resolvers_warning_about_a_cache_it_cannot_use(tmp_path: Path) -> None:
    """Probe 3 PF4: with the resolution cache unusable (a file where its directory should be, as one `sudo` run leaves
    a root-owned one), the play resolved and passed, but the warning naming the fix went to stderr, which the task
    never showed: the user was not told that nothing is cached."""
    blocker = tmp_path / "cache"
    blocker.write_text("a file where the cache directory should be")
    result = subprocess.run(
        [ANSIBLE, "-i", "inventory/localhost.yml", "site.yml", "--check", "--tags", "preflight"],
        cwd=ROOT, capture_output=True, text=True, check=False, timeout=600,
        env={**os.environ, "ANSIBLE_NOCOLOR": "1", "SM120KIT_CACHE": str(blocker)},
    )  # fmt: skip
    out = result.stdout
    assert result.returncode == 0, out[-3000:]
    assert "TASK [preflight : Say what the resolver warned about]" in out, out[-3000:]
    assert f"the resolution cache {blocker} cannot be written" in " ".join(out.split()), out[-3000:]
