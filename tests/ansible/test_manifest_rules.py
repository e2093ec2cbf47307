"""The manifest rules (roles/preflight/filter_plugins/manifest_rules.py) on the shipped manifest and on bad inputs.

The same rules stop `ansible-playbook site.yml` before any change; tests/integration proves that end to end on a
container node. Here each bad input is checked fast, without Ansible.
"""

from __future__ import annotations

import copy
import importlib.util
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]


def _rules() -> ModuleType:
    path = ROOT / "roles/preflight/filter_plugins/manifest_rules.py"
    spec = importlib.util.spec_from_file_location("manifest_rules", path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


manifest_problems = _rules().manifest_problems


def shipped_settings(profile: str = "full") -> dict[str, Any]:
    """The settings exactly as the provision play passes them, from the shipped manifest."""
    stack = yaml.safe_load((ROOT / "inventory/group_vars/all/stack.yml").read_text())
    return {
        "profile": profile,
        "profiles": stack["sm120kit_profiles"],
        "cuda_version": stack["sm120kit_cuda_version"],
        "cuda_components": stack["sm120kit_cuda_components"],
        "extra_python_packages": stack["sm120kit_extra_python_packages"],
        "nccl_version": stack["sm120kit_nccl_version"],
        "driver_min": stack["sm120kit_driver_min"],
        "venv": stack["sm120kit_venv"],
        "cuda_home": stack["sm120kit_cuda_home"],
        "wheelhouse": stack["sm120kit_wheelhouse"],
        "env_overrides": stack["sm120kit_env_overrides"],
    }


@pytest.mark.parametrize("profile", ["core", "full"])
def test_shipped_manifest_is_valid(profile: str) -> None:
    assert manifest_problems(shipped_settings(profile)) == []


def _with(path: str, value: Any) -> dict[str, Any]:
    settings = copy.deepcopy(shipped_settings())
    target = settings
    *parents, leaf = path.split(".")
    for key in parents:
        target = target[key]
    target[leaf] = value
    return settings


BAD_INPUTS = [
    ("profile", "bogus", "sm120kit_profile: 'bogus' is not a profile; use one of: core, full"),
    ("cuda_version", "13.0", "sm120kit_cuda_version: '13.0' is not a full release number"),
    ("cuda_version", "13.0.x", "sm120kit_cuda_version: '13.0.x' is not a full release number"),
    ("cuda_version", "12.8.1", "sm120kit_cuda_version: '12.8.1' is not CUDA 13"),
    ("cuda_components.nvidia-cuda-nvrtc-cu12", "12.8.93", "'nvidia-cuda-nvrtc-cu12' is a CUDA 12 (or older) wheel"),
    (
        "cuda_components.nvidia-cuda-nvcc",
        "12.8.93",
        "sm120kit_cuda_components['nvidia-cuda-nvcc']: '12.8.93' is not a CUDA 13",
    ),
    ("cuda_components.nvidia-cuda-nvcc", "latest", "'latest' is not an exact version"),
    ("extra_python_packages", {"nvidia-cuda-nvrtc-cu12": "12.8.93"}, "'nvidia-cuda-nvrtc-cu12'"),
    ("extra_python_packages", {"sgl_kernel": "0.3.21"}, "use 'sglang-kernel'"),
    ("extra_python_packages", {"torch": ">=2.0"}, "python package 'torch': '>=2.0' is not an exact version"),
    ("extra_python_packages", {"torch": "2.9.1+cu128"}, "'2.9.1+cu128' is a CUDA 12 (or older) build"),
    ("extra_python_packages", ["tiktoken"], "sm120kit_extra_python_packages: must be a mapping"),
    ("nccl_version", "2.21.5", "sm120kit_nccl_version: '2.21.5' is older than 2.26.2"),
    ("nccl_version", "2.30", "sm120kit_nccl_version: '2.30' is not an exact version"),
    ("nccl_version", "v2.30.7", "sm120kit_nccl_version: 'v2.30.7' is not an exact version"),
    ("driver_min", "580", "sm120kit_driver_min: '580' is not a driver version"),
    ("venv", "opt/venv", "sm120kit_venv: 'opt/venv' must be an absolute path"),
    ("wheelhouse", "wheels", "sm120kit_wheelhouse: 'wheels' must be an absolute path"),
    ("env_overrides", {"NCCL-P2P": "SYS"}, "sm120kit_env_overrides: 'NCCL-P2P' is not a valid environment variable"),
]


@pytest.mark.parametrize(("path", "value", "message"), BAD_INPUTS, ids=[f"{p}={v}" for p, v, _ in BAD_INPUTS])
def test_bad_input_is_named_with_its_fix(path: str, value: Any, message: str) -> None:
    problems = manifest_problems(_with(path, value))
    assert len(problems) == 1, problems
    assert message in problems[0]


def test_every_problem_is_reported_at_once() -> None:
    settings = _with("profile", "bogus")
    settings["cuda_version"] = "12.8.1"
    settings["nccl_version"] = "2.18.1"
    problems = manifest_problems(settings)
    assert [p.split(":")[0] for p in problems] == [
        "sm120kit_profile",
        "sm120kit_cuda_version",
        "sm120kit_nccl_version",
    ]
