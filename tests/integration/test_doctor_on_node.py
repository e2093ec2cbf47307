"""`sm120check doctor` inside container nodes: a converged core node, and a copy of it broken the way users break them.

The broken node is a `podman commit` of the converged one (seconds, not another converge), then: the toolkit's
ldconfig entry removed and the cache rebuilt, and a real CUDA 12 NVRTC wheel from PyPI added to the stack venv.
"""

from __future__ import annotations

import json
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from lab.converge import ConvergedNode, site_argv
from lab.playbook import REPO_ROOT, run_playbook, write_inventory
from lab.podman import Mount, Node, node_exec, podman, running_node

pytestmark = pytest.mark.container

CUDA12_NVRTC = "nvidia-cuda-nvrtc-cu12==12.8.93"
WHEELS = REPO_ROOT / ".cache" / "wheels-cuda12"


def doctor(node: Node, *args: str) -> tuple[int, dict[str, Any]]:
    result = node_exec(node, ["sm120check", "doctor", "--level", "2", "--json", *args], timeout=300)
    assert result.returncode in (0, 1), result.stdout + result.stderr
    return result.returncode, json.loads(result.stdout)


def by_id(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {r["id"]: r for r in report["results"]}


def test_doctor_on_a_converged_core_node_passes_what_a_cpu_node_can_prove(core_node: ConvergedNode) -> None:
    rc, report = doctor(core_node.node)
    results = by_id(report)
    assert rc == 0, json.dumps(report, indent=1)[-3000:]
    for check in ("platform", "manifest", "toolkit", "nvrtc", "abi_wheels", "env", "stack", "nvcc_sm120", "sm120_jit"):
        assert results[check]["status"] == "pass", (check, results[check])
    assert "profile core" in results["manifest"]["summary"]
    assert results["nvrtc"]["summary"].startswith("NVRTC 13.0 from /opt/cuda/lib64/libnvrtc.so.13")
    assert "sm_120, sm_120a, sm_120f" in results["sm120_jit"]["summary"]
    assert results["driver"]["status"] == "skip" and "no NVIDIA driver" in results["driver"]["summary"]
    assert results["torch"]["status"] == "skip"  # the core profile has no torch


@pytest.fixture(scope="module")
def cuda12_wheel() -> Path:
    """A real CUDA 12 NVRTC wheel from PyPI, downloaded once into .cache."""
    found = sorted(WHEELS.glob("nvidia_cuda_nvrtc_cu12-*.whl"))
    if not found:
        subprocess.run(
            ["python3", "-m", "pip", "download", "--quiet", "--no-deps", "--dest", str(WHEELS), CUDA12_NVRTC],
            check=True,
            timeout=600,
        )
        found = sorted(WHEELS.glob("nvidia_cuda_nvrtc_cu12-*.whl"))
    return found[-1]


@pytest.fixture(scope="module")
def broken_node(core_node: ConvergedNode, cuda12_wheel: Path) -> Iterator[Node]:
    if core_node.first.rc != 0:
        pytest.fail(f"the core converge failed:\n{core_node.first.tail()}", pytrace=False)
    image = f"localhost/sm120kit-broken:{uuid.uuid4().hex[:8]}"
    podman("commit", "--quiet", core_node.node.name, image, timeout=600)
    try:
        with running_node("broken", image, [Mount(cuda12_wheel.parent, "/srv/cuda12")]) as node:
            for command in (
                ["rm", "/etc/ld.so.conf.d/sm120kit-cuda.conf"],
                ["ldconfig"],
                [
                    "/opt/sm120kit/venv/bin/pip",
                    "install",
                    "--quiet",
                    "--no-deps",
                    "--no-index",
                    f"/srv/cuda12/{cuda12_wheel.name}",
                ],
            ):
                done = node_exec(node, command, timeout=300)
                assert done.returncode == 0, done.stderr
            yield node
    finally:
        podman("rmi", "--force", image, check=False)


def test_broken_node_fails_with_remedies_that_name_the_fix(broken_node: Node) -> None:
    rc, report = doctor(broken_node)
    results = by_id(report)
    assert rc == 1
    nvrtc = results["nvrtc"]
    assert nvrtc["status"] == "fail" and "libnvrtc.so.13" in nvrtc["summary"]
    assert "--tags cuda_env" in nvrtc["remedy"]
    abi = results["abi_wheels"]
    assert abi["status"] == "fail" and "nvidia-cuda-nvrtc-cu12 12.8.93" in abi["summary"]
    assert "/opt/sm120kit/venv/bin/pip uninstall -y nvidia-cuda-nvrtc-cu12" in abi["remedy"]
    assert results["sm120_jit"]["status"] == "skip"  # needs nvrtc
    assert results["toolkit"]["status"] == "pass"  # nvcc itself is untouched


def test_provision_play_fails_on_a_fail_verdict_unless_told_not_to(broken_node: Node, tmp_path: Path) -> None:
    inventory = write_inventory(tmp_path, [broken_node])
    strict = run_playbook([*site_argv(inventory), "--tags", "doctor"], timeout=600)
    assert strict.rc != 0, strict.tail()
    assert "sm120check doctor reported a failure" in strict.output
    assert "FAIL nvrtc" in strict.output and "FAIL abi_wheels" in strict.output
    lenient = run_playbook(
        [*site_argv(inventory, sm120kit_doctor_fail_on_error=False), "--tags", "doctor"], timeout=600
    )
    assert lenient.rc == 0, lenient.tail()
