"""The apt install methods, as far as this machine allows: NVIDIA's repository is unreachable from here.

A check-mode run with --diff on a fresh node renders the repository source, the signing key location and the
pins exactly as a real run would write them, and changes nothing on the node. The install itself needs NVIDIA's
repository (or a mirror of it) and is not exercised here.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from lab.converge import site_argv
from lab.playbook import run_playbook, write_inventory
from lab.podman import Node, NodeFactory, node_diff

pytestmark = pytest.mark.container

APT = {
    "cuda_toolkit_method": "apt",
    "nccl_method": "apt",
    "cuda_toolkit_host_compiler_packages": [],
    "sm120kit_wheelhouse": "",
}
TAGS = ["--tags", "preflight,cuda_toolkit,nccl", "--check", "--diff"]


def _check_run(node: Node, tmp_path: Path, **extra: object) -> str:
    """The check-mode log; asserts the run succeeded and left the node's filesystem as it was."""
    inventory = write_inventory(tmp_path, [node])
    before = node_diff(node)
    run = run_playbook([*site_argv(inventory, check=False, **APT, **extra), *TAGS], timeout=600)
    assert run.rc == 0, run.tail()
    assert node_diff(node).changes_since(before) == []
    return run.output


MIRROR = "https://mirror.example.internal/nvidia-cuda"


def test_apt_method_renders_the_repository_key_and_pins_without_changing_the_node(
    make_node: NodeFactory, tmp_path: Path
) -> None:
    # One run with a site mirror: the default mirror is NVIDIA's (cuda_toolkit_apt_mirror in the argument spec).
    node = make_node("apt")
    output = _check_run(node, tmp_path, cuda_toolkit_apt_mirror=MIRROR)
    assert f"URIs: {MIRROR}/debian12/x86_64/" in output
    # The debug line may wrap in the log: look for its parts.
    assert "would download" in output and f"{MIRROR}/debian12/x86_64/3bf863cc.pub" in output
    assert "Signed-By: /usr/share/keyrings/sm120kit-cuda-archive.asc" in output
    assert re.search(r"Package: cuda-toolkit-13-0\s*\n\+?Pin: version 13\.0\.1-1\s*\n\+?Pin-Priority: 1001", output)
    assert "Pin: version 2.30.7-1+cuda13.0" in output
