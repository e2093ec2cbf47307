"""Container fleets for the fleet doctor's tests and benchmark: inventories, breaking a node, running doctor.yml.

Inventories are written as inventory/lab-fleet-*.yml (ignored by git) so the project's group_vars apply.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from lab import cache_lock
from lab.playbook import CONNECTION, NODE_PYTHON, REPO_ROOT, PlaybookRun, playbook_argv, run_playbook
from lab.podman import Node, node_exec, podman

DOCTOR_PLAYBOOK = REPO_ROOT / "playbooks" / "doctor.yml"
CACHE = REPO_ROOT / ".cache" / "fleet"
# A small real CUDA 12 wheel: installed into a node's venv, the doctor's abi_wheels check must fail on it.
CU12_WHEEL = "nvidia_cuda_runtime_cu12-12.8.90-py3-none-manylinux2014_x86_64.manylinux_2_17_x86_64.whl"
CU12_REQUIREMENT = "nvidia-cuda-runtime-cu12==12.8.90"
CU12_SHA256 = "adade8dcbd0edf427b7204d480d6066d33902cab2a4707dcfc48a2d0fd44ab90"
LD_CONF = "/etc/ld.so.conf.d/sm120kit-cuda.conf"  # roles/cuda_env: cuda_env_ld_conf
NODE_VENV = "/opt/sm120kit/venv"


@dataclass(frozen=True)
class FleetLab:
    ready: tuple[Node, Node]
    broken: Node
    bare: Node  # started, never provisioned: no sm120check
    ghost: str  # in the inventory, no container: unreachable
    inventory: Path
    runs: Path  # fleet_doctor_dir
    converge: PlaybookRun
    doctor: PlaybookRun  # the full fleet, once

    @property
    def hosts(self) -> list[str]:
        return sorted([*(n.name for n in (*self.ready, self.broken, self.bare)), self.ghost])


def write_inventory(tag: str, hosts: Sequence[str]) -> Path:
    """inventory/lab-fleet-<tag>-<pid>.yml with podman-connected hosts in sm120_nodes (a host with no container is
    unreachable, which is what a test of unreachable nodes wants)."""
    entries = {name: {"ansible_connection": CONNECTION, "ansible_python_interpreter": NODE_PYTHON} for name in hosts}
    document = {"all": {"children": {"sm120_nodes": {"hosts": entries}}}}
    path = REPO_ROOT / "inventory" / f"lab-fleet-{tag}-{os.getpid()}.yml"
    path.write_text(
        "# Written by tests/fleet/fleet_lab.py; removed after the tests.\n" + json.dumps(document, indent=2)
    )
    return path


def cu12_wheel() -> Path:
    """The CUDA 12 wheel, downloaded once from PyPI into .cache/fleet and checked against its pinned hash."""
    path = CACHE / CU12_WHEEL
    with cache_lock(CACHE / ".cu12.lock"):
        if not path.is_file():
            pip = [sys.executable, "-m", "pip", "--isolated", "download", "--no-deps", "--only-binary=:all:"]
            subprocess.run([*pip, "-q", "-d", str(CACHE), CU12_REQUIREMENT], check=True, timeout=300)
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    if digest != CU12_SHA256:
        path.unlink()
        raise RuntimeError(f"{CU12_WHEEL} has sha256 {digest}, expected {CU12_SHA256}; downloaded again next time")
    return path


def break_node(node: Node, wheel: Path) -> None:
    """Break a converged node in two ways: the loader no longer finds libnvrtc.so.13 (ld.so.conf.d entry removed,
    cache rebuilt), and a CUDA 12 wheel sits in the stack venv."""
    steps = [["rm", "-f", LD_CONF], ["ldconfig"]]
    for step in steps:
        done = node_exec(node, step)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(step)} on {node.name} failed: {done.stderr}")
    podman("cp", str(wheel), f"{node.name}:/tmp/{wheel.name}")
    pip = [f"{NODE_VENV}/bin/python", "-m", "pip", "install", "-q", "--no-deps", "--no-index", f"/tmp/{wheel.name}"]
    done = node_exec(node, pip)
    if done.returncode != 0:
        raise RuntimeError(f"installing {wheel.name} on {node.name} failed: {done.stderr}")


def doctor_argv(inventory: Path, run_dir: Path, limit: str = "", **extra_vars: object) -> list[str]:
    argv = playbook_argv(DOCTOR_PLAYBOOK, inventory, {"fleet_doctor_dir": str(run_dir), **extra_vars})
    return [*argv, "--limit", limit] if limit else argv


def run_doctor(inventory: Path, run_dir: Path, limit: str = "", **extra_vars: object) -> PlaybookRun:
    """playbooks/doctor.yml over the inventory, its runs under run_dir (run_dir/latest is the newest)."""
    return run_playbook(doctor_argv(inventory, run_dir, limit, **extra_vars), timeout=600)
