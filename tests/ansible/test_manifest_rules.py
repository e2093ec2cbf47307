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
        "cuda_apt_version": stack["sm120kit_cuda_apt_version"],
        "extra_python_packages": stack["sm120kit_extra_python_packages"],
        "nccl_version": stack["sm120kit_nccl_version"],
        "driver_min": stack["sm120kit_driver_min"],
        "venv": stack["sm120kit_venv"],
        "cuda_home": stack["sm120kit_cuda_home"],
        "wheelhouse": stack["sm120kit_wheelhouse"],
        "env": stack["sm120kit_env"],
        "env_overrides": stack["sm120kit_env_overrides"],
        "doctor_level": stack["sm120kit_doctor_level"],
        "pip_index_url": stack["sm120kit_pip_index_url"],
        "pip_extra_index_urls": stack["sm120kit_pip_extra_index_urls"],
        "allow_insecure_http": stack["sm120kit_allow_insecure_http"],
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
    # Reliability probe section 10 (A11-A24) and section 2 (A15, A16): each of these passed before.
    ("extra_python_packages", {"torch": "2.14.1+cpu"}, "'2.14.1+cpu' is not a CUDA 13 build (local tag '+cpu'"),
    ("profiles.full.python_packages.torch", "2.14.1+rocm6.4", "'2.14.1+rocm6.4' is not a CUDA 13 build"),
    ("extra_python_packages", {"torch": "2.14.1\n"}, "python package 'torch': '2.14.1\\n' is not an exact version"),
    (
        "extra_python_packages",
        {"x\n--extra-index-url http://attacker.invalid/simple\ny": "1.0"},
        "python package 'x\\n--extra-index-url http://attacker.invalid/simple\\ny' (sm120kit_profiles.full",
    ),
    ("extra_python_packages", {"--extra-index-url=http://a.invalid": "1.0"}, "is a pip option, not a package name"),
    ("extra_python_packages", {"-e": "1.0"}, "is a pip option, not a package name"),
    ("extra_python_packages", {"--index-url": "1.0"}, "set indexes with sm120kit_pip_index_url"),
    ("extra_python_packages", {"torch ": "2.14.1"}, "is not a package name (PEP 508"),
    ("extra_python_packages", {"torch;os_name=='nt'": "2.14.1"}, "is not a package name (PEP 508"),
    (
        "cuda_components",
        {"nvidia-cuda-nvcc;touch${IFS}PWN;#": "13.0.88"},
        "sm120kit_cuda_components: 'nvidia-cuda-nvcc;touch${IFS}PWN;#' is not a package name",
    ),
    ("cuda_components", {"nvidia-cuda-nvcc $(id)": "13.0.88"}, "is not a package name"),
    ("cuda_components.nvidia-cuda-nvcc", "13.0.88\n", "'13.0.88\\n' is not an exact version"),
    ("cuda_components.nvidia-cuda-nvcc", "13.0.88 --pre", "is not an exact version"),
    ("cuda_version", "13.0.1\n", "is not a full release number"),
    ("cuda_apt_version", "13.0.1-1\nPin-Priority: 1001", "sm120kit_cuda_apt_version: '13.0.1-1\\nPin-Priority"),
    ("nccl_version", "2.30.7\n", "sm120kit_nccl_version: '2.30.7\\n' is not an exact version"),
    ("driver_min", "580.65.06\n", "is not a driver version"),
    ("venv", "/", "sm120kit_venv: '/' is a system directory"),
    ("venv", "/usr", "sm120kit_venv: '/usr' is a system directory"),
    ("venv", "/usr/local", "sm120kit_venv: '/usr/local' is a system directory"),
    ("venv", "/opt", "sm120kit_venv: '/opt' is a system directory"),
    ("venv", "/etc", "is a system directory"),
    ("venv", "/var/lib", "is a system directory"),
    ("venv", "/sm120kit", "is a system directory (or a top-level one)"),
    ("venv", "/proc/self/venv", "lies on a kernel or runtime file system"),
    ("venv", "/opt/$(id)", "sm120kit_venv: '/opt/$(id)' may hold only letters, digits"),
    ("venv", "/opt/my venv", "may hold only letters, digits"),
    ("venv", "/opt/sm120kit/venv\n", "may hold only letters, digits"),
    ("venv", "/opt/sm120kit/../../usr", "is not normalized"),
    ("venv", "/opt/sm120kit/venv/", "is not normalized"),
    ("venv", "//opt/sm120kit/venv", "is not normalized"),
    ("cuda_home", "/usr", "sm120kit_cuda_home: '/usr' is a system directory"),
    ("cuda_home", "/usr/local/bin", "sm120kit_cuda_home: '/usr/local/bin' is a system directory"),
    ("cuda_home", "/opt/cuda`id`", "sm120kit_cuda_home: '/opt/cuda`id`' may hold only"),
    ("wheelhouse", "/srv/wheels x", "sm120kit_wheelhouse: '/srv/wheels x' may hold only"),
    ("env_overrides", {"FOO\n": "1"}, "sm120kit_env_overrides: 'FOO\\n' is not a valid environment variable name"),
    ("env_overrides", {"FOO;id": "1"}, "is not a valid environment variable name"),
    ("env_overrides", {"1FOO": "1"}, "is not a valid environment variable name"),
    ("env_overrides", {"FOO": "a\nb"}, "sm120kit_env_overrides['FOO']: the value contains a newline"),
    ("env_overrides", {"FOO": "a\rb"}, "the value contains a newline"),
    ("env_overrides", {"FOO": "a\0b"}, "sm120kit_env_overrides['FOO']: the value contains a NUL byte"),
    ("env_overrides", {"FOO": {"a": 1}}, "the value is a dict"),
    ("env_overrides", {"FOO": True}, "the value is a YAML boolean"),
    ("env_overrides", ["FOO=1"], "sm120kit_env_overrides: must be a mapping"),
    ("env.BAD-NAME", "1", "sm120kit_env: 'BAD-NAME' is not a valid environment variable name"),
    ("env.CUDA_DEVICE_ORDER", "PCI_BUS_ID\n", "sm120kit_env['CUDA_DEVICE_ORDER']: the value contains a newline"),
    ("doctor_level", 7, "sm120kit_doctor_level: 7 is not a doctor level; use 1 (static), 2 (one GPU) or 3"),
    ("doctor_level", 0, "sm120kit_doctor_level: 0 is not a doctor level"),
    ("doctor_level", "2; id", "is not a doctor level"),
    ("doctor_level", True, "is not a doctor level"),
    ("pip_index_url", "http://mirror.invalid/simple x", "sm120kit_pip_index_url: 'http://mirror.invalid/simple x'"),
    ("pip_index_url", "ftp://mirror.invalid/simple", "is not an http(s) index URL"),
    ("pip_extra_index_urls", ["https://ok.invalid/simple", "https://x.invalid/$(id)"], "pip_extra_index_urls[1]"),
    ("pip_extra_index_urls", "https://ok.invalid/simple", "sm120kit_pip_extra_index_urls: must be a list"),
    # Reliability probe A22 and C3: plain http is refused unless sm120kit_allow_insecure_http is set.
    (
        "pip_index_url",
        "http://mirror.invalid/simple",
        "sm120kit_pip_index_url: 'http://mirror.invalid/simple' is plain",
    ),
    ("pip_extra_index_urls", ["http://mirror.invalid/simple"], "sm120kit_pip_extra_index_urls[0]: 'http://mirror"),
    ("cuda_apt_mirror", "http://mirror.invalid/repos", "cuda_toolkit_apt_mirror: 'http://mirror.invalid/repos' is"),
    ("cuda_apt_mirror", "https://m.invalid/r\nx", "cuda_toolkit_apt_mirror: 'https://m.invalid/r\\nx' is not an"),
]


@pytest.mark.parametrize(("path", "value", "message"), BAD_INPUTS, ids=[f"{p}={v}" for p, v, _ in BAD_INPUTS])
def test_bad_input_is_named_with_its_fix(path: str, value: Any, message: str) -> None:
    problems = manifest_problems(_with(path, value))
    assert len(problems) == 1, problems
    assert message in problems[0]


GOOD_INPUTS = [
    ("extra_python_packages", {"torch": "2.14.1+cu130"}),
    ("extra_python_packages", {"tiktoken": "0.12.0", "zope.interface": "7.2", "ruamel_yaml": "0.18.6"}),
    ("venv", "/opt/sm120kit/venv-2"),
    ("venv", "/srv/ml/sm120kit+test/venv"),
    ("cuda_home", "/usr/local/cuda"),
    ("cuda_home", "/opt/cuda-13.0"),
    ("wheelhouse", "/wheels"),
    ("env_overrides", {"TORCH_CUDA_ARCH_LIST": "9.0 12.0", "FLAGS": "x}$(id) `id` '\"\\", "NCCL_IB_DISABLE": 1}),
    ("env_overrides", {"CUDA_DEVICE_ORDER": None, "_PRIVATE": "ünïcødé"}),
    ("doctor_level", "3"),
    ("doctor_level", 1),
    ("pip_index_url", "https://user:tok%40en@mirror.example/simple/"),
    ("pip_extra_index_urls", ["https://download.pytorch.org/whl/cu130"]),
    ("cuda_apt_mirror", "https://mirror.example.internal/nvidia-cuda"),
    ("env_overrides", {"HF_TOKEN": "a warning, not a problem"}),
]


@pytest.mark.parametrize(("path", "value"), GOOD_INPUTS, ids=[f"{p}={v}" for p, v in GOOD_INPUTS])
def test_good_input_passes(path: str, value: Any) -> None:
    assert manifest_problems(_with(path, value)) == []


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


def test_plain_http_passes_only_with_the_explicit_opt_in() -> None:
    settings = _with("pip_index_url", "http://mirror.invalid/simple")
    settings["cuda_apt_mirror"] = "http://mirror.invalid/repos"
    assert [p.split(":")[0] for p in manifest_problems(settings)] == [
        "sm120kit_pip_index_url",
        "cuda_toolkit_apt_mirror",
    ]
    for opt_in in (True, "true"):
        assert manifest_problems({**settings, "allow_insecure_http": opt_in}) == []
    for not_opted_in in (False, "false", "no", None, ""):
        assert len(manifest_problems({**settings, "allow_insecure_http": not_opted_in})) == 2
