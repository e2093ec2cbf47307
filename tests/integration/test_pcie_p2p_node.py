"""roles/pcie_p2p converged into a lab node (a container, no NVIDIA GPU in its sysfs): it says so and changes
nothing, on a first run, a second run and in check mode."""

from __future__ import annotations

from pathlib import Path

import pytest

from lab.playbook import playbook_argv, run_playbook, write_inventory
from lab.podman import node_diff, node_exec, running_node

pytestmark = pytest.mark.container

PLAY = "- name: Set PCIe up for peer-to-peer\n  hosts: all\n  gather_facts: false\n  roles: [pcie_p2p]\n"


def test_pcie_p2p_on_a_node_without_gpus_changes_nothing(lab: str, tmp_path: Path) -> None:
    (tmp_path / "pcie.yml").write_text(PLAY)
    with running_node("pcie", lab) as node:
        vendors = node_exec(node, ["sh", "-c", "cat /sys/bus/pci/devices/*/vendor 2>/dev/null || true"]).stdout.split()
        if "0x10de" in vendors:
            pytest.skip("this host's sysfs shows NVIDIA devices inside the container: not a GPU-less node")
        inventory = write_inventory(tmp_path / "inventory", [node])
        before = node_diff(node)
        runs = {
            "first": run_playbook(playbook_argv(tmp_path / "pcie.yml", inventory), timeout=600),
            "second": run_playbook(playbook_argv(tmp_path / "pcie.yml", inventory), timeout=600),
            "check": run_playbook(playbook_argv(tmp_path / "pcie.yml", inventory, check=True, diff=True), timeout=600),
        }
        for name, run in runs.items():
            assert run.rc == 0, f"{name} run:\n{run.tail()}"
            assert run.host(node.name).changed == 0, f"{name} run changed:\n" + "\n".join(run.changed_tasks)
            assert "No NVIDIA GPU in /sys/bus/pci/devices" in run.output, run.tail()
        assert node_diff(node).changes_since(before) == []
        for path in ("/etc/default/grub.d/99-sm120kit-pcie.cfg", "/var/lib/sm120kit/pcie-p2p.json"):
            assert node_exec(node, ["test", "-e", path]).returncode == 1, path
