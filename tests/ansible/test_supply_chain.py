"""Supply chain and secrets at rest (reliability probe section 18, C3 and C4; A22 of section 10).

- preflight refuses plain http:// indexes and apt mirrors unless sm120kit_allow_insecure_http is set, and warns
  about secret-looking names in the node-wide environment (pure Python, the filter plugin);
- cuda_toolkit installs the apt signing key only when its fingerprint is cuda_toolkit_apt_key_fingerprint: a real
  `ansible-playbook` (connection local, no container) runs the key tasks against a temporary directory, the keys
  served by a 127.0.0.1 HTTP server and made by gpg in a temporary GNUPGHOME;
- sm120check writes manifest.json (which carries the env values) 0640 and logs none of them.
"""

from __future__ import annotations

import functools
import http.server
import importlib.util
import json
import os
import shutil
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from lab.loopback import serve, url
from lab.stand_ins import nccl_stand_in_venv

ROOT = Path(__file__).resolve().parents[2]
ANSIBLE = str(Path(sys.executable).parent / "ansible-playbook")
sys.path.insert(0, str(Path(__file__).parent))
from test_manifest_rules import _rules, shipped_settings  # noqa: E402

RULES = _rules()
NVIDIA_FINGERPRINT = "EB693B3035CD5710E231E123A4B469963BF863CC"
needs_gpg = pytest.mark.skipif(shutil.which("gpg") is None, reason="gpg makes the test keys")
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="the key and manifest tasks chown to root")


# --- preflight: plain http and secret-looking names -----------------------------------------------------------


@pytest.mark.parametrize(
    ("key", "value", "var"),
    [
        ("pip_index_url", "http://mirror.invalid/simple", "sm120kit_pip_index_url"),
        ("pip_extra_index_urls", ["https://ok.invalid/simple", "http://x.invalid/simple"], "pip_extra_index_urls[1]"),
        ("cuda_apt_mirror", "http://mirror.invalid/cuda/repos", "cuda_toolkit_apt_mirror"),
    ],
)
def test_plain_http_is_refused_naming_the_variable_and_the_opt_in(key: str, value: Any, var: str) -> None:
    problems = RULES.manifest_problems({**shipped_settings(), key: value})
    assert len(problems) == 1, problems
    assert problems[0].startswith(var) or f"{var}:" in problems[0]
    assert "is plain http" in problems[0] and "sm120kit_allow_insecure_http=true" in problems[0]
    assert "not hash-checked" in problems[0]
    # The explicit opt-in lets it through.
    assert RULES.manifest_problems({**shipped_settings(), key: value, "allow_insecure_http": True}) == []


def test_the_shipped_manifest_refuses_http_by_default() -> None:
    stack = yaml.safe_load((ROOT / "inventory/group_vars/all/stack.yml").read_text())
    assert stack["sm120kit_allow_insecure_http"] is False
    assert RULES.manifest_problems({**shipped_settings(), "allow_insecure_http": False}) == []


def test_the_http_message_hides_an_index_password() -> None:
    problems = RULES.manifest_problems(
        {**shipped_settings(), "pip_index_url": "http://bob:s3cr3t@mirror.invalid/simple"}
    )
    assert len(problems) == 1 and "bob:***@mirror.invalid" in problems[0]
    assert "s3cr3t" not in problems[0]


def test_an_apt_mirror_with_shell_or_newline_characters_is_refused() -> None:
    problems = RULES.manifest_problems(
        {**shipped_settings(), "cuda_apt_mirror": "https://m.invalid/x\nSigned-By: /tmp/mine.asc"}
    )
    assert len(problems) == 1 and problems[0].startswith("cuda_toolkit_apt_mirror:")


def test_https_indexes_and_mirrors_pass() -> None:
    settings = {
        **shipped_settings(),
        "pip_index_url": "https://user:tok%40en@mirror.example/simple/",
        "pip_extra_index_urls": ["https://download.pytorch.org/whl/cu130"],
        "cuda_apt_mirror": "https://developer.download.nvidia.com/compute/cuda/repos",
    }
    assert RULES.manifest_problems(settings) == []


def test_secret_looking_env_names_are_a_warning_not_a_problem() -> None:
    overrides = {"HF_TOKEN": "hf_abc", "WANDB_API_KEY": "k", "db_password": "p", "MY_SECRET": "s", "UNSET_TOKEN": None}
    settings = {**shipped_settings(), "env_overrides": overrides}
    assert RULES.manifest_problems(settings) == []
    warnings = RULES.manifest_warnings(settings)
    assert [w.split("]")[0] for w in warnings] == [
        "sm120kit_env_overrides['HF_TOKEN'",
        "sm120kit_env_overrides['WANDB_API_KEY'",
        "sm120kit_env_overrides['db_password'",
        "sm120kit_env_overrides['MY_SECRET'",
    ]
    assert all("every user of the node can read" in w for w in warnings)
    assert not any("hf_abc" in w for w in warnings)  # names only, never values


def test_the_shipped_environment_raises_no_secret_warning() -> None:
    assert RULES.manifest_warnings(shipped_settings()) == []


# --- cuda_toolkit: the apt signing key is pinned by fingerprint -----------------------------------------------


def _fingerprints_module() -> Any:
    path = ROOT / "roles/cuda_toolkit/library/sm120kit_openpgp_fingerprints.py"
    spec = importlib.util.spec_from_file_location("sm120kit_openpgp_fingerprints", path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Two key pairs from gpg: 'right' (the pinned one) and 'wrong', armored and binary, with gpg's fingerprints."""
    if shutil.which("gpg") is None:
        pytest.skip("gpg makes the test keys")
    home = tmp_path_factory.mktemp("gnupg")
    home.chmod(0o700)
    env = {**os.environ, "GNUPGHOME": str(home)}
    out: dict[str, Any] = {"dir": home}
    for name, algo in (("right", "rsa2048"), ("wrong", "ed25519")):
        user = f"{name} <{name}@test.invalid>"
        subprocess.run(
            ["gpg", "--batch", "--passphrase", "", "--quick-gen-key", user, algo, "default", "never"],
            env=env, check=True, capture_output=True, timeout=120,
        )  # fmt: skip
        armored = subprocess.run(["gpg", "--armor", "--export", name], env=env, check=True, capture_output=True).stdout
        binary = subprocess.run(["gpg", "--export", name], env=env, check=True, capture_output=True).stdout
        (home / f"{name}.asc").write_bytes(armored)
        (home / f"{name}.gpg").write_bytes(binary)
        colons = subprocess.run(
            ["gpg", "--show-keys", "--with-colons", str(home / f"{name}.asc")], env=env, check=True, capture_output=True
        ).stdout.decode()
        out[name] = next(line.split(":")[9] for line in colons.splitlines() if line.startswith("fpr:"))
    return out


@needs_gpg
def test_the_fingerprint_module_agrees_with_gpg(keys: dict[str, Any]) -> None:
    module = _fingerprints_module()
    for name in ("right", "wrong"):
        for suffix in ("asc", "gpg"):
            assert module.fingerprints((keys["dir"] / f"{name}.{suffix}").read_bytes()) == [keys[name]]
    both = (keys["dir"] / "right.gpg").read_bytes() + (keys["dir"] / "wrong.gpg").read_bytes()
    assert module.fingerprints(both) == [keys["right"], keys["wrong"]]
    with pytest.raises(ValueError):
        module.fingerprints(b"<html>not a key</html>")


def test_the_pinned_default_is_nvidias_cuda_repository_key() -> None:
    defaults = yaml.safe_load((ROOT / "roles/cuda_toolkit/defaults/main.yml").read_text())
    assert defaults["cuda_toolkit_apt_key_fingerprint"] == NVIDIA_FINGERPRINT
    assert defaults["cuda_toolkit_apt_key_name"] == "3bf863cc.pub"
    assert NVIDIA_FINGERPRINT.lower().endswith(defaults["cuda_toolkit_apt_key_name"].split(".")[0])


@pytest.fixture(scope="module")
def server(keys: dict[str, Any]) -> Iterator[str]:
    """A 127.0.0.1 HTTP server for the key directory; yields its base URL."""
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(keys["dir"]))
    handler.log_message = lambda *args: None  # type: ignore[attr-defined]
    with serve(handler) as httpd:
        yield url(httpd) + "/"


KEY_PLAY = """---
- name: Install the CUDA repository signing key
  hosts: localhost
  connection: local
  gather_facts: false
  tasks:
    - name: The key tasks of the apt method
      ansible.builtin.include_role:
        name: cuda_toolkit
        tasks_from: apt_key
"""


def _key_run(tmp: Path, url: str, name: str, fingerprint: str, *args: str) -> subprocess.CompletedProcess[str]:
    (tmp / "play.yml").write_text(KEY_PLAY)
    variables = {
        "ansible_python_interpreter": sys.executable,
        "_cuda_toolkit_apt_url": url,
        "_cuda_toolkit_apt_keyring": str(tmp / "keyrings/sm120kit-cuda-archive.asc"),
        "cuda_toolkit_apt_mirror": url,
        "cuda_toolkit_apt_key_name": name,
        "cuda_toolkit_apt_key_fingerprint": fingerprint,
    }
    (tmp / "vars.json").write_text(json.dumps(variables))
    return subprocess.run(
        [ANSIBLE, str(tmp / "play.yml"), "-i", "localhost,", "-e", f"@{tmp / 'vars.json'}", *args],
        cwd=ROOT, capture_output=True, text=True, check=False, timeout=300,
        env={**os.environ, "ANSIBLE_ROLES_PATH": str(ROOT / "roles"), "ANSIBLE_NOCOLOR": "1"},
    )  # fmt: skip


@needs_gpg
@needs_root
def test_a_wrong_key_is_refused_naming_the_variable_and_a_right_one_installed(
    keys: dict[str, Any], server: str, tmp_path: Path
) -> None:
    keyring = tmp_path / "keyrings/sm120kit-cuda-archive.asc"
    keyring.parent.mkdir()
    pinned = " ".join(keys["right"][i : i + 4] for i in range(0, 40, 4)).lower()  # gpg's spaced form works too

    wrong = _key_run(tmp_path, server, "wrong.asc", pinned)
    log = wrong.stdout + wrong.stderr
    assert wrong.returncode != 0, log
    assert f"is the key(s) {keys['wrong']}, not {keys['right']}" in log
    assert "(cuda_toolkit_apt_key_fingerprint); it was not installed" in log
    assert "cuda_toolkit_apt_mirror" in log
    assert not keyring.exists()

    right = _key_run(tmp_path, server, "right.asc", pinned)
    assert right.returncode == 0, right.stdout[-3000:] + right.stderr[-3000:]
    assert keyring.read_bytes() == (keys["dir"] / "right.asc").read_bytes()
    assert stat.S_IMODE(keyring.stat().st_mode) == 0o644

    again = _key_run(tmp_path, server, "right.asc", pinned, "--check")
    assert again.returncode == 0 and "changed=0" in again.stdout, again.stdout[-3000:]

    # A key already in place that is not the pinned one (planted, or left by an older run) stops the run too.
    keyring.write_bytes((keys["dir"] / "wrong.asc").read_bytes())
    planted = _key_run(tmp_path, server, "right.asc", pinned)
    assert planted.returncode != 0
    assert f"holds the key(s) {keys['wrong']}, not {keys['right']} (cuda_toolkit_apt_key_fingerprint)" in planted.stdout


@needs_gpg
def test_check_mode_downloads_and_writes_nothing(keys: dict[str, Any], server: str, tmp_path: Path) -> None:
    (tmp_path / "keyrings").mkdir()
    run = _key_run(tmp_path, server, "right.asc", keys["right"], "--check")
    assert run.returncode == 0, run.stdout[-3000:]
    assert "would download" in run.stdout and "changed=1" in run.stdout
    assert list((tmp_path / "keyrings").iterdir()) == []


# --- sm120check: manifest.json holds the env values, root only ------------------------------------------------

MANIFEST_PLAY = """---
- name: Write the node manifest
  hosts: localhost
  connection: local
  gather_facts: false
  tasks:
    - name: The manifest tasks of sm120check
      ansible.builtin.include_role:
        name: sm120check
        tasks_from: manifest
"""


@needs_root
def test_the_manifest_with_env_values_is_not_world_readable_and_not_logged(tmp_path: Path) -> None:
    stack = yaml.safe_load((ROOT / "inventory/group_vars/all/stack.yml").read_text())
    token = "hf_SECRETVALUE123"
    variables = {
        **stack,
        "sm120kit_profile": "core",
        "sm120kit_env_overrides": {"HF_TOKEN": token},
        "sm120kit_venv": str(nccl_stand_in_venv(tmp_path)),  # the manifest names NCCL's lib dir from the venv
        "sm120check_manifest_dir": str(tmp_path / "etc"),
        "ansible_python_interpreter": sys.executable,
    }
    (tmp_path / "play.yml").write_text(MANIFEST_PLAY)
    (tmp_path / "vars.json").write_text(json.dumps(variables))
    run = subprocess.run(
        [ANSIBLE, str(tmp_path / "play.yml"), "-i", "localhost,", "-e", f"@{tmp_path / 'vars.json'}", "--diff", "-v"],
        cwd=ROOT, capture_output=True, text=True, check=False, timeout=300,
        env={**os.environ, "ANSIBLE_ROLES_PATH": str(ROOT / "roles"), "ANSIBLE_NOCOLOR": "1"},
    )  # fmt: skip
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    manifest = tmp_path / "etc/manifest.json"
    info = manifest.stat()
    assert stat.S_IMODE(info.st_mode) == 0o640 and (info.st_uid, info.st_gid) == (0, 0)
    assert json.loads(manifest.read_text())["env"]["HF_TOKEN"] == token  # the doctor still compares the value
    assert token not in run.stdout + run.stderr


# --- the same rules in a real preflight run -------------------------------------------------------------------


def _preflight(tmp: Path, variables: dict[str, Any]) -> subprocess.CompletedProcess[str]:
    (tmp / "vars.json").write_text(json.dumps(variables))
    return subprocess.run(
        [ANSIBLE, "site.yml", "--check", "--tags", "preflight_validate", "-e", f"@{tmp / 'vars.json'}"],
        cwd=ROOT, capture_output=True, text=True, check=False, timeout=300, env={**os.environ, "ANSIBLE_NOCOLOR": "1"},
    )  # fmt: skip


def test_preflight_refuses_plain_http_until_opted_in_and_warns_about_secret_names(tmp_path: Path) -> None:
    insecure = {
        "sm120kit_pip_index_url": "http://mirror.invalid/simple",
        "cuda_toolkit_method": "apt",
        "cuda_toolkit_apt_mirror": "http://mirror.invalid/cuda/repos",
    }
    refused = _preflight(tmp_path, insecure)
    assert refused.returncode != 0, refused.stdout[-3000:]
    assert "nothing was changed" in refused.stdout
    assert "sm120kit_pip_index_url: 'http://mirror.invalid/simple' is plain http" in refused.stdout
    assert "cuda_toolkit_apt_mirror: 'http://mirror.invalid/cuda/repos' is plain http" in refused.stdout

    token = "hf_NOTINTHELOG42"
    opted_in = _preflight(
        tmp_path, {**insecure, "sm120kit_allow_insecure_http": True, "sm120kit_env_overrides": {"HF_TOKEN": token}}
    )
    assert opted_in.returncode == 0, opted_in.stdout[-3000:]
    # The YAML callback quotes and wraps the message: look for its parts.
    assert "Warn about secrets in the node-wide environment" in opted_in.stdout
    assert "HF_TOKEN" in opted_in.stdout and "looks like a secret" in opted_in.stdout
    assert token not in opted_in.stdout + opted_in.stderr
