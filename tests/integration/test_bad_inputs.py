"""Bad manifests and variables stop the run before anything changes, with a message naming the variable."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from lab.converge import NODE_GROUPS, converge
from lab.playbook import REPO_ROOT, write_inventory
from lab.podman import Mount, Node, node_diff, running_node

pytestmark = pytest.mark.container

COMPONENTS = yaml.safe_load((REPO_ROOT / "inventory/group_vars/all/stack.yml").read_text())["sm120kit_cuda_components"]

# (extra vars, a piece of the message the user must see)
BAD_INPUTS = {
    "unknown profile": ({"sm120kit_profile": "bogus"}, "sm120kit_profile: 'bogus' is not a profile"),
    "malformed CUDA version": (
        {"sm120kit_cuda_version": "13.0"},
        "sm120kit_cuda_version: '13.0' is not a full release number",
    ),
    "CUDA 12 release": ({"sm120kit_cuda_version": "12.8.1"}, "sm120kit_cuda_version: '12.8.1' is not CUDA 13"),
    "CUDA 12 python package": (
        {"sm120kit_extra_python_packages": {"nvidia-cuda-nvrtc-cu12": "12.8.93"}},
        "python package 'nvidia-cuda-nvrtc-cu12' (sm120kit_profiles.core.python_packages or "
        "sm120kit_extra_python_packages) is a CUDA 12 wheel",
    ),
    "CUDA 12 toolkit component": (
        {"sm120kit_cuda_components": {**COMPONENTS, "nvidia-cuda-nvrtc-cu12": "12.8.93"}},
        "sm120kit_cuda_components: 'nvidia-cuda-nvrtc-cu12' is a CUDA 12 (or older) wheel",
    ),
    "range pin": (
        {"sm120kit_extra_python_packages": {"torch": ">=2.0"}},
        "python package 'torch': '>=2.0' is not an exact version",
    ),
    "missing wheelhouse": (
        {"sm120kit_wheelhouse": "/does/not/exist"},
        "sm120kit_wheelhouse: /does/not/exist/wheelhouse.json is missing",
    ),
    "unknown toolkit method": (
        {"cuda_toolkit_method": "conda"},
        "value of cuda_toolkit_method must be one of: wheels, apt, got: conda",
    ),
    "unknown NCCL method": ({"nccl_method": "source"}, "value of nccl_method must be one of: wheels, apt, got: source"),
    "NCCL too old for SM120": (
        {"sm120kit_nccl_version": "2.21.5"},
        "sm120kit_nccl_version: '2.21.5' is older than the floor 2.27.3",
    ),
    "relative venv path": ({"sm120kit_venv": "opt/venv"}, "sm120kit_venv: 'opt/venv' must be an absolute path"),
    "bad environment variable name": (
        {"sm120kit_env_overrides": {"BAD-NAME": "1"}},
        "sm120kit_env_overrides: 'BAD-NAME' is not a valid environment variable name",
    ),
    # Values that would have reached a shell, pip or the node's system directories (reliability probe A11-A24).
    "system directory as venv": ({"sm120kit_venv": "/usr"}, "sm120kit_venv: '/usr' is a system directory"),
    "system directory as CUDA home": (
        {"sm120kit_cuda_home": "/usr"},
        "sm120kit_cuda_home: '/usr' is a system directory",
    ),
    "CPU build of torch": (
        {"sm120kit_extra_python_packages": {"torch": "2.14.1+cpu"}},
        "python package 'torch': '2.14.1+cpu' is not a CUDA 13 build",
    ),
    "pip option as a package": (
        {"sm120kit_extra_python_packages": {"--extra-index-url=http://x": "1.0"}},
        "is a pip option, not a package name",
    ),
    "shell characters in a CUDA component": (
        {"sm120kit_cuda_components": {**COMPONENTS, "nvidia-x;id": "13.0.1"}},
        "sm120kit_cuda_components: 'nvidia-x;id' is not a package name",
    ),
    "trailing newline in a version": ({"sm120kit_cuda_version": "13.0.1\n"}, "is not a full release number"),
    "doctor level out of range": ({"sm120kit_doctor_level": 5}, "sm120kit_doctor_level: 5 is not a doctor level"),
    "multi-line environment value": (
        {"sm120kit_env_overrides": {"A": "x\ny"}},
        "sm120kit_env_overrides['A']: the value contains a newline",
    ),
    "plain-http index": (
        {"sm120kit_pip_index_url": "http://mirror.example/simple"},
        "sm120kit_pip_index_url: 'http://mirror.example/simple' is plain http",
    ),
}


@pytest.fixture(scope="module")
def fresh_node(
    lab: str, core_wheelhouse: Mount, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Node, Path]]:
    """One unconverged node for all cases: each case checks that it added nothing to the node."""
    with running_node("bad-input", lab, [core_wheelhouse]) as node:
        yield node, write_inventory(tmp_path_factory.mktemp("bad-input-inventory"), [node], NODE_GROUPS)


@pytest.mark.parametrize(("extra_vars", "message"), list(BAD_INPUTS.values()), ids=list(BAD_INPUTS))
def test_bad_input_is_rejected_before_any_change(
    fresh_node: tuple[Node, Path], extra_vars: dict[str, object], message: str
) -> None:
    node, inventory = fresh_node
    before = node_diff(node)
    run = converge(inventory, False, **extra_vars)
    assert run.rc != 0, run.tail()
    # The role's message list is shown as a Python list, quotes escaped: match the text the user reads.
    assert message in run.output.replace("\\'", "'"), run.tail()
    assert run.host(node.name).changed == 0, run.tail()
    assert node_diff(node).changes_since(before) == []
