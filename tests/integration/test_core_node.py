"""What a user finds on a node after a core converge, verified inside the node with testinfra (podman:// backend)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

# The tests run on the controller's Python >= 3.11; mypy checks everything as 3.10, the nodes' oldest.
import tomllib  # type: ignore[import-not-found,unused-ignore]
import yaml

from lab.playbook import REPO_ROOT

pytestmark = pytest.mark.container

MANIFEST = yaml.safe_load((REPO_ROOT / "inventory/group_vars/all/stack.yml").read_text())
CUDA_VERSION = MANIFEST["sm120kit_cuda_version"]
PREFIX = f"/opt/cuda-{CUDA_VERSION}"
CUDA_HOME = MANIFEST["sm120kit_cuda_home"]
VENV = MANIFEST["sm120kit_venv"]
NVRTC_SNIPPET = (Path(__file__).parent / "nvrtc_sm120.py").read_text()
# A clean environment (Debian's default PATH, no shell profile): what a service started by systemd sees.
CLEAN = "env -i PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def test_toolkit_prefix_has_the_cuda_home_layout(core_host: Any) -> None:
    for tool in ("bin/nvcc", "bin/ptxas"):
        assert core_host.file(f"{PREFIX}/{tool}").mode & 0o111, tool
    assert core_host.file(f"{PREFIX}/include/cuda_runtime.h").is_file
    for library in ("libnvrtc.so.13", "libcudart.so.13"):
        assert core_host.file(f"{PREFIX}/lib/{library}").exists, library
    assert core_host.file(f"{PREFIX}/lib64").linked_to == f"{PREFIX}/lib"


def test_stable_cuda_home_points_at_the_versioned_prefix(core_host: Any) -> None:
    link = core_host.file(CUDA_HOME)
    assert link.is_symlink
    assert link.linked_to == PREFIX


def test_nvcc_is_the_pinned_release(core_host: Any) -> None:
    nvcc = MANIFEST["sm120kit_cuda_components"]["nvidia-cuda-nvcc"]
    out = core_host.check_output(f"{CUDA_HOME}/bin/nvcc --version")
    assert f"V{nvcc}" in out


@pytest.mark.parametrize(
    ("path", "mode"),
    [
        ("/etc/ld.so.conf.d/sm120kit-cuda.conf", 0o644),
        ("/etc/profile.d/sm120kit.sh", 0o644),
        # It holds the env values, which may be tokens (reliability probe C4): root and its group only.
        ("/etc/sm120kit/manifest.json", 0o640),
    ],
)
def test_configuration_files_are_root_owned_and_not_writable_by_others(core_host: Any, path: str, mode: int) -> None:
    config = core_host.file(path)
    assert config.is_file
    assert (config.user, config.group, config.mode) == ("root", "root", mode)


def test_loader_cache_finds_nvrtc_in_the_toolkit(core_host: Any) -> None:
    assert f"{CUDA_HOME}/lib64" in core_host.file("/etc/ld.so.conf.d/sm120kit-cuda.conf").content_string.splitlines()
    cache = core_host.check_output("ldconfig -p")
    assert f"libnvrtc.so.13 (libc6,x86-64) => {CUDA_HOME}/lib64/libnvrtc.so.13" in cache


def test_loader_cache_finds_nccl(core_host: Any) -> None:
    assert "libnccl.so.2 " in core_host.check_output("ldconfig -p")


def test_any_process_opens_libnvrtc_by_soname(core_host: Any) -> None:
    result = core_host.run(f"{CLEAN} /usr/bin/python3 -c 'import ctypes; ctypes.CDLL(\"libnvrtc.so.13\")'")
    assert result.rc == 0, result.stderr


def test_nvrtc_compiles_a_kernel_for_sm_120_without_a_gpu(core_host: Any) -> None:
    result = core_host.run(f"{CLEAN} /usr/bin/python3 -c %s sm_120", NVRTC_SNIPPET)
    assert result.rc == 0, result.stdout + result.stderr
    report = json.loads(result.stdout)
    assert report["nvrtc_version"] == ".".join(CUDA_VERSION.split(".")[:2])
    assert (report["cubin_machine"], report["cubin_sm"]) == (190, 120), report
    assert report["kernel_in_cubin"], report


def test_fresh_venv_interpreter_gets_the_cuda_environment(core_host: Any) -> None:
    out = core_host.check_output(f"{CLEAN} {VENV}/bin/python -c 'import json, os; print(json.dumps(dict(os.environ)))'")
    environment = json.loads(out)
    expected = json.loads(core_host.file("/etc/sm120kit/manifest.json").content_string)["env"]
    assert {name: environment.get(name) for name in expected} == expected
    assert environment["CUDA_HOME"] == CUDA_HOME
    assert f"{CUDA_HOME}/bin" in environment["PATH"].split(":")


def test_system_interpreter_is_left_alone(core_host: Any) -> None:
    out = core_host.check_output(f'{CLEAN} /usr/bin/python3 -c \'import os; print(os.environ.get("CUDA_HOME", ""))\'')
    assert out == ""


def test_login_shell_gets_the_cuda_environment(core_host: Any) -> None:
    assert core_host.check_output(f"{CLEAN} bash -lc 'echo $CUDA_HOME'") == CUDA_HOME


def test_venv_holds_the_exact_pins_and_no_cuda12_wheel(core_host: Any) -> None:
    frozen = core_host.check_output(f"{VENV}/bin/python -m pip freeze --all").splitlines()
    pins = MANIFEST["sm120kit_profiles"]["core"]["python_packages"]
    for name, version in pins.items():
        assert f"{name}=={version}" in frozen
    assert f"nvidia-nccl-cu13=={MANIFEST['sm120kit_nccl_version']}" in frozen
    assert not [line for line in frozen if "-cu12" in line]


def test_sm120check_reports_its_version(core_host: Any) -> None:
    project = tomllib.loads((REPO_ROOT / "python/sm120check/pyproject.toml").read_text())["project"]
    assert core_host.file("/usr/local/bin/sm120check").linked_to == f"{VENV}/bin/sm120check"
    result = core_host.run(f"{CLEAN} sm120check --version")
    assert result.rc == 0, result.stderr
    assert result.stdout.strip() == f"sm120check {project['version']}"


def test_node_manifest_records_the_core_profile(core_host: Any) -> None:
    manifest = json.loads(core_host.file("/etc/sm120kit/manifest.json").content_string)
    assert manifest["profile"] == "core"
    assert manifest["cuda"]["version"] == CUDA_VERSION
    assert manifest["nccl"]["version"] == MANIFEST["sm120kit_nccl_version"]
    assert manifest["python_packages"] == MANIFEST["sm120kit_profiles"]["core"]["python_packages"]
