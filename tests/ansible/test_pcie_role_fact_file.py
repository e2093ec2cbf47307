"""The pcie_p2p fact file the role writes fits the one schema the doctor reads it with
(python/sm120check/src/sm120check/doctor/pcie/pcie_p2p.schema.json): the real role, run by ansible-playbook on the
fixture sysfs trees and stand-in setpci of test_pcie_p2p_role.py, writes the file in three cases (AMD with a reboot
due, Intel with the parameters booted, a node whose boot loader the role leaves alone, with an extra parameter), in one
playbook run of three plays; each file validates with the `jsonschema` package against the schema and is read, as is,
by the doctor's reader (which validates with the same file).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from test_pcie_p2p_role import ANSIBLE, ROOT, node

from sm120check.doctor.pcie import fact_file

jsonschema = pytest.importorskip("jsonschema")

SCHEMA_PATH = ROOT / "python/sm120check/src/sm120check/doctor/pcie/pcie_p2p.schema.json"
PLAY = """- name: Write the fact file as the pcie_p2p role does ({case})
  hosts: localhost
  connection: local
  gather_facts: false
  pre_tasks:
    - name: Take this case's paths and choices
      ansible.builtin.include_vars:
        file: {vars_file}
  roles: [pcie_p2p]
"""


def test_the_fact_files_the_role_writes_fit_the_schema_the_doctor_reads(tmp_path: Path) -> None:
    cases: dict[str, tuple[dict[str, Any], dict[str, object]]] = {
        "amd-reboot-due": (node(tmp_path / "amd", "amd", "BOOT_IMAGE=/vmlinuz ro quiet"), {}),
        "intel-booted": (
            node(tmp_path / "intel", "intel", "ro quiet intel_iommu=on iommu=pt pci=noacs"),
            {"pcie_p2p_pci_noacs": True},
        ),
        "grub-by-hand": (
            node(tmp_path / "manual", "amd", "ro quiet"),
            {"pcie_p2p_manage_grub": False, "pcie_p2p_extra_kernel_params": ["pcie_aspm=off"]},
        ),
    }
    # include_vars outlives its play: every case names every choice another case changes
    choices = {"pcie_p2p_pci_noacs": False, "pcie_p2p_manage_grub": True, "pcie_p2p_extra_kernel_params": []}
    plays = []
    for case, (variables, overrides) in cases.items():
        vars_file = tmp_path / f"{case}.json"
        vars_file.write_text(json.dumps({**variables, **choices, **overrides}), encoding="utf-8")
        plays.append(PLAY.format(case=case, vars_file=json.dumps(str(vars_file))))
    (tmp_path / "play.yml").write_text("".join(plays), encoding="utf-8")
    run = subprocess.run(
        [ANSIBLE, str(tmp_path / "play.yml"), "-i", "localhost,", "-e", f"ansible_python_interpreter={sys.executable}"],
        cwd=ROOT, capture_output=True, text=True, check=False, timeout=300,
        env={**os.environ, "ANSIBLE_ROLES_PATH": str(ROOT / "roles"), "ANSIBLE_NOCOLOR": "1"},
    )  # fmt: skip
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    validator = jsonschema.Draft202012Validator(json.loads(SCHEMA_PATH.read_text(encoding="utf-8")))
    written = {}
    for case, (variables, _) in cases.items():
        path = Path(variables["pcie_p2p_fact_file"])
        document = json.loads(path.read_text(encoding="utf-8"))
        assert [e.message for e in validator.iter_errors(document)] == [], case
        read = fact_file.read(path)
        assert read.error == "" and read.fact is not None, (case, read.error)
        assert read.fact.to_json() == document
        written[case] = read.fact
    assert written["amd-reboot-due"].reboot_required and written["amd-reboot-due"].kernel_params == ("iommu=pt",)
    assert not written["intel-booted"].reboot_required
    assert written["intel-booted"].kernel_params == ("intel_iommu=on", "iommu=pt", "pci=noacs")
    assert written["grub-by-hand"].kernel_params == ("iommu=pt", "pcie_aspm=off")
    assert "pcie_p2p_manage_grub is false" in written["grub-by-hand"].changes[0]
    assert written["amd-reboot-due"].acs_bridges == ("0000:00:01.1", "0000:00:03.1", "0000:02:00.0")
