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


def test_preflight_and_the_doctor_read_one_nccl_floor() -> None:
    """One table (doctor/nccl_floor.json): preflight's floor is the doctor's, the shipped pin passes both,
    and a known-bad release is refused with its reason, the floor and the fix."""
    from sm120check.doctor import nccl_floor

    rules = _rules()
    assert rules.NCCL_TABLE.resolve() == nccl_floor.TABLE.resolve()
    assert rules.NCCL_MIN == nccl_floor.FLOOR and nccl_floor.floor() == "2.27.3"
    pinned = shipped_settings()["nccl_version"]
    assert nccl_floor.judge_nccl(pinned).status == "pass" and nccl_floor.parse(pinned) >= nccl_floor.FLOOR  # type: ignore[operator]
    settings = copy.deepcopy(shipped_settings())
    settings["nccl_version"] = "2.26.2"
    (problem,) = manifest_problems(settings)
    doctor = nccl_floor.judge_nccl("2.26.2")
    assert doctor.status == "fail"
    for bad in nccl_floor.known_bad((2, 26, 2)):  # both name every known-bad range 2.26.2 is in, and why
        assert bad.problem in problem and bad.problem in doctor.details
    assert "NVIDIA/nccl#2418" in problem and "the floor 2.27.3" in problem and 'use "2.30.7"' in problem


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
    ("nccl_version", "2.21.5", "sm120kit_nccl_version: '2.21.5' is older than the floor 2.27.3"),
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
    # Reliability probe A24: a CUDA release the pinned components do not belong to.
    (
        "cuda_version",
        "13.9.99",
        "sm120kit_cuda_version: '13.9.99' is CUDA 13.9, but the pinned sm120kit_cuda_components are CUDA 13.0",
    ),
    ("cuda_version", "13.1.0", "Set sm120kit_cuda_version to the release the components belong to"),
    ("cuda_components.nvidia-cuda-cccl", "13.1.20", "the components belong to different CUDA releases (13.0: "),
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


# --- reliability probe A24 with the apt method, and section 10's role variables set directly ---------------------


def test_the_apt_pin_must_be_the_cuda_release() -> None:
    settings = {**_with("cuda_version", "13.0.2"), "cuda_toolkit_method": "apt"}
    problems = manifest_problems(settings)
    assert len(problems) == 1, problems
    assert "sm120kit_cuda_version: '13.0.2' differs from sm120kit_cuda_apt_version '13.0.1-1'" in problems[0]
    assert manifest_problems({**settings, "cuda_apt_version": "13.0.2-1"}) == []
    assert manifest_problems({**settings, "cuda_toolkit_method": "wheels"}) == []  # the wheels method has no apt pin


# The values the roles' defaults render to with the shipped manifest (a real run: test_preflight_role_vars.py).
SHIPPED_ROLE_VARS: dict[str, Any] = {
    "python_stack_venv": "/opt/sm120kit/venv",
    "python_stack_python": "/usr/bin/python3",
    "python_stack_state_dir": "/opt/sm120kit",
    "python_stack_wheelhouse": "",
    "python_stack_index_url": "",
    "python_stack_extra_index_urls": [],
    "cuda_toolkit_version": "13.0.1",
    "cuda_toolkit_home": "/opt/cuda",
    "cuda_toolkit_prefix": "/opt/cuda-13.0.1",
    "cuda_toolkit_pip_python": "/opt/sm120kit/venv/bin/python",
    "cuda_toolkit_apt_mirror": "https://developer.download.nvidia.com/compute/cuda/repos",
    "cuda_toolkit_apt_key_name": "3bf863cc.pub",
    "nccl_version": "2.30.7",
    "nccl_venv": "/opt/sm120kit/venv",
    "cuda_env_cuda_home": "/opt/cuda",
    "cuda_env_module": "sm120kit_env",
    "cuda_env_profile_script": "/etc/profile.d/sm120kit.sh",
    "cuda_env_ld_conf": "/etc/ld.so.conf.d/sm120kit-cuda.conf",
    "sm120check_source": "/work/main/roles/preflight/../../python/sm120check",
    "sm120check_build_dir": "/work/main/roles/preflight/../../build/dist",
    "sm120check_dist_dir": "/opt/sm120kit/dist",
    "sm120check_bin_link": "/usr/local/bin/sm120check",
    "sm120check_manifest_dir": "/etc/sm120kit",
    "sglang_sm120_source": "",
    "flashinfer_jit_bundle_dir": "/home/a user/.cache/sm120kit/flashinfer-jit",
    "flashinfer_jit_node_bundle_dir": "/var/cache/sm120kit/flashinfer-jit",
}


def _with_role_vars(**role_vars: Any) -> dict[str, Any]:
    return {**shipped_settings(), "role_vars": {**SHIPPED_ROLE_VARS, **role_vars}}


@pytest.mark.parametrize("method", ["wheels", "apt"])
def test_the_shipped_role_defaults_pass(method: str) -> None:
    assert manifest_problems({**_with_role_vars(), "cuda_toolkit_method": method}) == []


ROLE_BAD_INPUTS = [
    ("python_stack_venv", "/usr", "python_stack_venv: '/usr' is a system directory"),
    ("python_stack_venv", "/opt/$(id)", "python_stack_venv: '/opt/$(id)' may hold only letters"),
    ("nccl_venv", "/", "nccl_venv: '/' is a system directory"),
    ("cuda_env_venv", "relative/venv", "cuda_env_venv: 'relative/venv' must be an absolute path"),
    ("sm120check_venv", "/etc", "sm120check_venv: '/etc' is a system directory"),
    ("sglang_sm120_venv", "/opt/x;id", "sglang_sm120_venv: '/opt/x;id' may hold only"),
    ("flashinfer_jit_venv", "/opt/venv/", "flashinfer_jit_venv: '/opt/venv/' is not normalized"),
    ("python_stack_python", "/usr/bin/python3 -c id", "python_stack_python: '/usr/bin/python3 -c id' may hold only"),
    ("python_stack_state_dir", "/var/lib", "python_stack_state_dir: '/var/lib' is a system directory"),
    ("python_stack_wheelhouse", "/srv/w x", "python_stack_wheelhouse: '/srv/w x' may hold only"),
    ("python_stack_index_url", "https://x.invalid/$(id)", "python_stack_index_url: 'https://x.invalid/$(id)' is not"),
    ("python_stack_extra_index_urls", ["http://m.invalid/s"], "python_stack_extra_index_urls[0]: 'http://m.invalid/s'"),
    ("python_stack_extra_index_urls", "https://m.invalid/s", "python_stack_extra_index_urls: must be a list"),
    ("cuda_toolkit_prefix", "/usr", "cuda_toolkit_prefix: '/usr' is a system directory"),
    ("cuda_toolkit_prefix", "/opt/cuda $(id)", "cuda_toolkit_prefix: '/opt/cuda $(id)' may hold only"),
    ("cuda_toolkit_home", "/usr/local", "cuda_toolkit_home: '/usr/local' is a system directory"),
    ("cuda_toolkit_pip_python", "/opt/x`id`/python", "cuda_toolkit_pip_python: '/opt/x`id`/python' may hold only"),
    ("cuda_toolkit_version", "13.9.99", "cuda_toolkit_version: '13.9.99' is CUDA 13.9, but the pinned"),
    ("cuda_toolkit_version", "12.8.1", "cuda_toolkit_version: '12.8.1' is not CUDA 13"),
    ("cuda_toolkit_version", "13.0.1\n", "cuda_toolkit_version: '13.0.1\\n' is not a full release number"),
    ("nccl_version", "2.21.5", "nccl_version: '2.21.5' is older than the floor 2.27.3"),
    ("nccl_index_url", "ftp://m.invalid/simple", "nccl_index_url: 'ftp://m.invalid/simple' is not an http(s) URL"),
    ("cuda_env_cuda_home", "/usr", "cuda_env_cuda_home: '/usr' is a system directory"),
    ("cuda_env_module", "os;import x", "cuda_env_module: 'os;import x' is not a Python module name"),
    ("cuda_env_profile_script", "/etc/profile.d", "cuda_env_profile_script: '/etc/profile.d' is a system directory"),
    ("cuda_env_ld_conf", "/etc/ld.so.conf.d/a b.conf", "cuda_env_ld_conf: '/etc/ld.so.conf.d/a b.conf' may hold"),
    ("sm120check_source", "/src/my checkout", "sm120check_source: '/src/my checkout' may hold only"),
    ("sm120check_build_dir", "build/dist", "sm120check_build_dir: 'build/dist' must be an absolute path"),
    ("sm120check_dist_dir", "/opt", "sm120check_dist_dir: '/opt' is a system directory"),
    ("sm120check_bin_link", "/usr/local/bin", "sm120check_bin_link: '/usr/local/bin' is a system directory"),
    ("sm120check_manifest_dir", "/etc", "sm120check_manifest_dir: '/etc' is a system directory"),
    ("sglang_sm120_source", "sglang", "sglang_sm120_source: 'sglang' must be an absolute path"),
    ("flashinfer_jit_bundle_dir", "cache/jit", "flashinfer_jit_bundle_dir: 'cache/jit' must be an absolute path"),
    ("flashinfer_jit_bundle_dir", "/tmp/a\nb", "flashinfer_jit_bundle_dir: '/tmp/a\\nb' contains a newline"),
    ("flashinfer_jit_node_bundle_dir", "/var/cache", "flashinfer_jit_node_bundle_dir: '/var/cache' is a system"),
    ("flashinfer_jit_node_bundle_dir", "/proc/x", "lies on a kernel or runtime file system"),
]


@pytest.mark.parametrize(("name", "value", "message"), ROLE_BAD_INPUTS, ids=[f"{n}={v}" for n, v, _ in ROLE_BAD_INPUTS])
def test_a_role_variable_set_directly_is_checked_under_its_own_name(name: str, value: Any, message: str) -> None:
    problems = manifest_problems(_with_role_vars(**{name: value}))
    assert len(problems) == 1, problems
    assert problems[0].startswith(name) and message in problems[0]
    role = next(r for r in ("python_stack", "cuda_toolkit", "nccl", "cuda_env", "sm120check", "sglang_sm120",
                            "flashinfer_jit") if name.startswith(r))  # fmt: skip
    assert f"see roles/{role}/README.md" in problems[0]


@pytest.mark.parametrize(
    ("method", "name", "value"),
    [
        ("apt", "cuda_toolkit_apt_mirror", "https://m.invalid/r x"),
        ("apt", "cuda_toolkit_apt_key_name", "../key.pub"),
        ("wheels", "cuda_toolkit_prefix", "/usr"),
        ("wheels", "cuda_toolkit_pip_python", "/opt/$(id)"),
    ],
)
def test_cuda_toolkit_variables_are_checked_only_for_the_method_that_uses_them(
    method: str, name: str, value: Any
) -> None:
    settings = _with_role_vars(**{name: value})
    assert [p.split(":")[0] for p in manifest_problems({**settings, "cuda_toolkit_method": method})] == [name]
    other = "wheels" if method == "apt" else "apt"
    assert manifest_problems({**settings, "cuda_toolkit_method": other}) == []


def test_a_role_variable_left_at_its_sm120kit_default_is_reported_once_under_the_sm120kit_name() -> None:
    settings = _with("venv", "/usr")
    settings["role_vars"] = dict.fromkeys(
        ("python_stack_venv", "nccl_venv", "cuda_env_venv", "sm120check_venv"), "/usr"
    )
    problems = manifest_problems(settings)
    assert len(problems) == 1 and problems[0].startswith("sm120kit_venv: '/usr'"), problems


def test_the_role_variables_preflight_passes_are_the_ones_the_rules_check() -> None:
    names = yaml.safe_load((ROOT / "roles/preflight/vars/main.yml").read_text())["_preflight_role_var_names"]
    assert names == list(_rules().ROLE_VARS)
    for name in names:  # each is a variable of its role
        role = next(r for r in _rules().ROLES if name.startswith(r + "_"))
        assert name in yaml.safe_load((ROOT / f"roles/{role}/defaults/main.yml").read_text()), name


@pytest.mark.parametrize(
    ("version", "warning"),
    [
        ("0.5.24.dev0", "'0.5.24.dev0' is a development or pre-release build: accepted"),
        ("0.5.24rc1", "'0.5.24rc1' is a development or pre-release build: accepted"),
        ("0.5.24.dev3+g1a2b3c4", "'0.5.24.dev3+g1a2b3c4' is a local build (local tag '+g1a2b3c4'"),
        ("0.5.23+g1a2b3c4", "'0.5.23+g1a2b3c4' is a local build (local tag '+g1a2b3c4', e.g. a git build): accepted"),
    ],
)
def test_dev_and_local_builds_are_accepted_with_a_warning(version: str, warning: str) -> None:
    settings = shipped_settings()
    settings["profiles"]["full"]["python_packages"]["sglang"] = version
    assert manifest_problems(settings) == []
    warnings = _rules().manifest_warnings(settings)
    assert any(warning in w for w in warnings), warnings


@pytest.mark.parametrize(
    ("version", "reason"),
    [
        ("2.14.1+cpu", "(local tag '+cpu', a CPU-only build)"),
        ("2.14.1+rocm6.4", "(local tag '+rocm6.4', a ROCm (AMD GPU) build)"),
        ("2.14.1+xpu", "(local tag '+xpu', an Intel GPU (XPU) build)"),
    ],
)
def test_a_build_for_another_device_is_refused_with_the_device_it_names(version: str, reason: str) -> None:
    settings = shipped_settings()
    settings["profiles"]["full"]["python_packages"]["torch"] = version
    problems = manifest_problems(settings)
    assert any(f"'{version}' is not a CUDA 13 build {reason}" in p for p in problems), problems


def test_release_and_cuda_13_pins_raise_no_version_warning() -> None:
    settings = shipped_settings()
    settings["profiles"]["full"]["python_packages"]["torch"] = "2.14.1+cu130"
    assert _rules().manifest_warnings(settings) == []
