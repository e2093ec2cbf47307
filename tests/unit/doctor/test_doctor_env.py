"""env: the sm120kit_env .pth hook in a fresh interpreter of a real venv; a shadowed sitecustomize is named."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from sm120check.doctor.cuda_env.env import EnvCheck
from sm120check.doctor.model import Context, Status
from sm120check.manifest import CudaPins, Manifest, NcclPins

HOOK = """import os as _os
ENV = {"TORCH_CUDA_ARCH_LIST": "12.0", "NCCL_NVLS_ENABLE": "0"}
for _name, _value in ENV.items():
    _os.environ.setdefault(_name, _value)
_os.environ["SM120KIT_ENV"] = __file__
"""
DEBIAN_PYTHON = Path("/usr/bin/python3")
# The toolkit and NCCL pins: the env check reads none of them.
NO_CUDA, NO_NCCL = CudaPins("", "", "", "", ""), NcclPins("", "")


def _venv(tmp_path: Path, python: str = sys.executable) -> tuple[Path, Path]:
    subprocess.run([python, "-m", "venv", "--without-pip", str(tmp_path / "venv")], check=True, timeout=60)
    (site,) = (tmp_path / "venv").glob("lib/python3*/site-packages")
    return tmp_path / "venv", site


def _ctx(venv: Path, env: dict[str, str]) -> Context:
    manifest = Manifest(Path("m.json"), "core", NO_CUDA, NO_NCCL, "580.65.06", str(venv), {}, env, raw={})
    return Context(manifest=manifest)


def _install_hook(site: Path) -> None:
    (site / "sm120kit_env.py").write_text(HOOK, encoding="utf-8")
    (site / "sm120kit_env.pth").write_text("import sm120kit_env\n", encoding="utf-8")


def test_pth_hook_setting_the_manifest_env_passes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", "9.0")  # the doctor's own env must not mask a broken hook
    venv, site = _venv(tmp_path)
    _install_hook(site)
    result = EnvCheck().run(_ctx(venv, {"TORCH_CUDA_ARCH_LIST": "12.0", "NCCL_NVLS_ENABLE": "0"}))
    assert result.status is Status.PASS, result
    assert str(site / "sm120kit_env.py") in result.summary


def test_missing_hook_fails_with_the_cuda_env_tag(tmp_path: Path) -> None:
    venv, _ = _venv(tmp_path)
    result = EnvCheck().run(_ctx(venv, {"TORCH_CUDA_ARCH_LIST": "12.0"}))
    assert result.status is Status.FAIL and "not active" in result.summary
    assert "--tags cuda_env" in result.remedy


def test_hook_value_different_from_the_manifest_fails_naming_the_variable(tmp_path: Path) -> None:
    venv, site = _venv(tmp_path)
    _install_hook(site)
    result = EnvCheck().run(_ctx(venv, {"TORCH_CUDA_ARCH_LIST": "12.0a"}))
    assert result.status is Status.FAIL
    assert "TORCH_CUDA_ARCH_LIST: wants '12.0a', a fresh interpreter sees '12.0'" in result.details


@pytest.mark.skipif(not Path("/usr/lib/python3/dist-packages").exists(), reason="needs Debian's python3")
def test_debian_sitecustomize_shadowing_the_venvs_is_named(tmp_path: Path) -> None:
    venv, site = _venv(tmp_path, str(DEBIAN_PYTHON))
    _install_hook(site)
    (site / "sitecustomize.py").write_text("import sm120kit_env\n", encoding="utf-8")
    result = EnvCheck().run(_ctx(venv, {"NCCL_NVLS_ENABLE": "0"}))
    if not Path("/usr/lib/python3.11/sitecustomize.py").exists():
        pytest.skip("this Debian python has no sitecustomize of its own")
    assert result.status is Status.WARN
    assert f"{site / 'sitecustomize.py'} never runs: /usr/lib/python3.11/sitecustomize.py" in result.details


def test_values_of_credential_names_never_reach_the_report() -> None:
    """A token in sm120kit_env_overrides that differs on the node is named, but its value is not printed."""
    from sm120check.doctor.cuda_env.env import env_verdict

    seen = {"hook": "/v/lib/python3.11/site-packages/sm120kit_env.pth", "env": {"HF_TOKEN": "hf_seen_secret"}}
    result = env_verdict(seen, {"HF_TOKEN": "hf_wanted_secret", "CUDA_HOME": "/opt/cuda"}, [], ["sm120kit_env.pth"])
    assert result.status.value == "fail" and "HF_TOKEN" in result.summary
    assert "hf_seen_secret" not in result.details and "hf_wanted_secret" not in result.details
    assert "<redacted, 16 characters>" in result.details and "'/opt/cuda'" in result.details
