"""The stack manifest's rules, as an Ansible filter: `{{ settings | sm120kit_manifest_problems }}`.

Pure Python over plain data, so the rules are readable, unit-tested without Ansible (tests/ansible) and run
on the control node before any node is touched. Each problem names the variable and the fix.

Every pattern is matched whole (`fullmatch`): `re.match` with `$` lets a trailing newline through. Names and
paths reach shell tasks, pip requirement files and profile.d, so only characters that need no quoting there pass.
"""

from __future__ import annotations

import json
import posixpath
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

WHERE = " (inventory/group_vars/all/stack.yml or your inventory)"
RELEASE = re.compile(r"[0-9]+\.[0-9]+\.[0-9]+")
VERSION = re.compile(r"[0-9]+(\.[0-9]+)+")
# One exact PEP 440 version: release, pre-release, post, dev, local label (`2.14.1`, `0.5.24.dev0`, `2.15.0+cu130`,
# `0.7.4rc1`, `0.5.24.dev3+g1a2b3c4`).
EXACT_PIN = re.compile(
    r"[0-9]+(\.[0-9]+)*((a|b|rc)[0-9]+)?(\.post[0-9]+)?(\.dev[0-9]+)?(\+[A-Za-z0-9]+(\.[A-Za-z0-9]+)*)?"
)
DEV_OR_PRE = re.compile(r"((a|b|rc)[0-9]+|\.dev[0-9]+)(\+|\Z)")
OLD_CUDA_NAME = re.compile(r"-cu1[0-2]\Z")
OLD_CUDA_BUILD = re.compile(r"\+cu(1[0-2]|[0-9])[0-9]\Z")
CUDA13_BUILD = re.compile(r"\+cu13[0-9]\Z")
# Local labels that name a build for another device: refused, with the device they name.
OTHER_DEVICE_BUILD = {
    "cpu": "a CPU-only build",
    "rocm": "a ROCm (AMD GPU) build",
    "xpu": "an Intel GPU (XPU) build",
    "hpu": "a Gaudi (HPU) build",
}
# PEP 508 names: no spaces, no shell characters, no pip options, no newlines.
PACKAGE_NAME = re.compile(r"[A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?")
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# Path characters that need no quoting in a shell word, a pip line, PATH or a systemd unit.
PATH_CHARS = re.compile(r"/[A-Za-z0-9._+/-]*")
URL = re.compile(r"https?://[A-Za-z0-9._~:/?#\[\]@!%+,;=-]+")
# Directories of the operating system that a venv or CUDA_HOME (a symlink) must never be.
SYSTEM_DIRS = frozenset(
    """
    /bin /boot /dev /etc /home /lib /lib32 /lib64 /libx32 /media /mnt /opt /proc /root /run /sbin /snap /srv /sys
    /tmp /usr /var /usr/bin /usr/include /usr/lib /usr/lib32 /usr/lib64 /usr/libexec /usr/local /usr/sbin /usr/share
    /usr/src /usr/local/bin /usr/local/etc /usr/local/include /usr/local/lib /usr/local/sbin /usr/local/share
    /usr/local/src /var/cache /var/lib /var/local /var/log /var/opt /var/spool /var/tmp /etc/alternatives
    /etc/profile.d /etc/systemd
    """.split()  # noqa: SIM905 (a word list reads better than 50 quoted strings)
)
# Kernel and runtime file systems: nothing of the stack belongs under them.
VIRTUAL_ROOTS = ("/dev/", "/proc/", "/run/", "/sys/")
DOCTOR_LEVELS = (1, 2, 3)
APT_VERSION = re.compile(r"[0-9]+\.[0-9]+\.[0-9]+-[0-9]+")
# The one NCCL table (floor, known-bad releases and why), shipped in the sm120check package, which the doctor's torch
# check reads too: the roles live in the same repository, so it is found relative to this file.
NCCL_TABLE = Path(__file__).resolve().parents[3] / "python/sm120check/src/sm120check/doctor/nccl_floor.json"


def _nccl_table() -> dict[str, Any]:
    try:
        table: dict[str, Any] = json.loads(NCCL_TABLE.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise RuntimeError(
            f"preflight cannot read the NCCL floor table {NCCL_TABLE} ({exc}): run Ansible from a full sm120kit "
            "checkout (roles/ beside python/)"
        ) from None
    return table


NCCL = _nccl_table()
NCCL_MIN = tuple(int(part) for part in str(NCCL["floor"]).split("."))
IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
FILE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]*")

# Role variables with paths, URLs and names that reach the node (or the control node's shell): what each must be,
# and the sm120kit_* setting it defaults to (a value equal to that setting is already checked under its own name).
# Kinds: dir (a directory of its own, never a system one), file (a file path, e.g. under /usr/local/bin), opt_dir (a
# directory anywhere, or empty), control (a control-node path: absolute, no shell characters), url / urls (http(s)
# index URLs, or empty), module_path (an absolute path only Ansible modules see, never a shell: any printable
# characters), module (a Python module name), file_name (a plain file name), cuda (a CUDA 13 release),
# nccl (an NCCL release).
ROLE_VARS: dict[str, tuple[str, str | None]] = {
    "python_stack_venv": ("dir", "venv"),
    "python_stack_python": ("file", None),
    "python_stack_state_dir": ("dir", None),
    "python_stack_wheelhouse": ("opt_dir", "wheelhouse"),
    "python_stack_index_url": ("url", "pip_index_url"),
    "python_stack_extra_index_urls": ("urls", "pip_extra_index_urls"),
    "cuda_toolkit_version": ("cuda", "cuda_version"),
    "cuda_toolkit_home": ("dir", "cuda_home"),
    "cuda_toolkit_prefix": ("dir", None),
    "cuda_toolkit_pip_python": ("file", None),
    "cuda_toolkit_wheelhouse": ("opt_dir", "wheelhouse"),
    "cuda_toolkit_index_url": ("url", "pip_index_url"),
    "cuda_toolkit_extra_index_urls": ("urls", "pip_extra_index_urls"),
    "cuda_toolkit_apt_mirror": ("url", "cuda_apt_mirror"),
    "cuda_toolkit_apt_key_name": ("file_name", None),
    "nccl_version": ("nccl", "nccl_version"),
    "nccl_venv": ("dir", "venv"),
    "nccl_wheelhouse": ("opt_dir", "wheelhouse"),
    "nccl_index_url": ("url", "pip_index_url"),
    "nccl_extra_index_urls": ("urls", "pip_extra_index_urls"),
    "cuda_env_venv": ("dir", "venv"),
    "cuda_env_cuda_home": ("dir", "cuda_home"),
    "cuda_env_module": ("module", None),
    "cuda_env_profile_script": ("file", None),
    "cuda_env_ld_conf": ("file", None),
    "sm120check_venv": ("dir", "venv"),
    "sm120check_source": ("control", None),
    "sm120check_build_dir": ("control", None),
    "sm120check_dist_dir": ("dir", None),
    "sm120check_bin_link": ("file", None),
    "sm120check_manifest_dir": ("dir", None),
    "sglang_sm120_venv": ("dir", "venv"),
    "sglang_sm120_source": ("opt_dir", None),
    "flashinfer_jit_venv": ("dir", "venv"),
    "flashinfer_jit_bundle_dir": ("module_path", None),
    "flashinfer_jit_node_bundle_dir": ("dir", None),
}
# Used only by one cuda_toolkit method (cuda_toolkit_method): the other method's variables are not checked.
CUDA_WHEELS_ONLY = frozenset(
    {"cuda_toolkit_prefix", "cuda_toolkit_pip_python", "cuda_toolkit_wheelhouse", "cuda_toolkit_index_url",
     "cuda_toolkit_extra_index_urls"}
)  # fmt: skip
CUDA_APT_ONLY = frozenset({"cuda_toolkit_apt_mirror", "cuda_toolkit_apt_key_name"})


def _normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _nccl_problem(name: str, version: str) -> str:
    """`version` is below the floor: the value, the floor, each known-bad range it is in and why, and the fix."""
    parsed = _version_tuple(version)
    reasons = [
        f"{bad['problem']} ({bad['evidence']})"
        for bad in NCCL["known_bad"]
        if _version_tuple(str(bad["first"])) <= parsed <= _version_tuple(str(bad["last"]))
    ]
    why = f": {'; '.join(reasons)}" if reasons else ""
    return (
        f"{name}: '{version}' is older than the floor {NCCL['floor']}{why}; use \"{NCCL['suggested']}\" "
        f"({NCCL['confirmed_good']} is confirmed on NVIDIA/nccl#2418)"
    )


def _version_tuple(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split("."))


def _path_problem(text: str, *, example: str = "/opt/sm120kit/venv", system_ok: bool = False) -> str | None:
    """Why `text` is not a safe absolute path on the node, or None."""
    if not text.startswith("/"):
        return "must be an absolute path"
    if not PATH_CHARS.fullmatch(text):
        return (
            "may hold only letters, digits and . _ + - / (no spaces, quotes, $, ;, newlines or other shell characters)"
        )
    if posixpath.normpath(text) != text or text.startswith("//"):
        return f"is not normalized (no '.', '..', '//' or trailing '/'): write '{posixpath.normpath(text)}'"
    if system_ok:
        return None
    if text in SYSTEM_DIRS or text.count("/") < 2:
        return "is a system directory (or a top-level one); use a directory of its own such as " + example
    if text.startswith(VIRTUAL_ROOTS):
        return "lies on a kernel or runtime file system (/dev, /proc, /run, /sys)"
    return None


def _name_problem(name: object) -> str | None:
    """Why `name` is not a PEP 508 package name, or None."""
    text = str(name)
    if PACKAGE_NAME.fullmatch(text):
        return None
    if text.lstrip().startswith("-"):
        return (
            "is a pip option, not a package name; set indexes with sm120kit_pip_index_url and "
            "sm120kit_pip_extra_index_urls"
        )
    return "is not a package name (PEP 508: letters, digits, '.', '_', '-'; no spaces, options or newlines)"


def _env_value_problem(value: object) -> str | None:
    """Why `value` cannot be an environment value in profile.d, the venv hook and the manifest, or None."""
    if value is None:
        return None
    if isinstance(value, bool):
        return 'is a YAML boolean; quote the value the program expects, e.g. "1" or "true"'
    if not isinstance(value, (str, int, float)):
        return f"is a {type(value).__name__}; an environment value is a string (or null to remove the variable)"
    text = str(value)
    if "\0" in text:
        return "contains a NUL byte, which no environment variable can hold"
    if "\n" in text or "\r" in text:
        return "contains a newline; environment values are one line (login shells, systemd and the doctor)"
    return None


def manifest_problems(s: Mapping[str, Any]) -> list[str]:
    """Every problem with the manifest settings `s` (the sm120kit_* variables without their prefix)."""
    problems: list[str] = []
    profiles = s.get("profiles") or {}
    profile = str(s.get("profile", ""))
    if profile not in profiles:
        problems.append(
            f"sm120kit_profile: '{profile}' is not a profile; use one of: {', '.join(sorted(profiles))}{WHERE}"
        )

    cuda = str(s.get("cuda_version", ""))
    if not RELEASE.fullmatch(cuda):
        problems.append(
            f'sm120kit_cuda_version: {cuda!r} is not a full release number; write MAJOR.MINOR.PATCH, e.g. "13.0.1"'
            + WHERE
        )
    elif not cuda.startswith("13."):
        problems.append(
            f"sm120kit_cuda_version: '{cuda}' is not CUDA 13; SM120 JIT needs CUDA 13 and the torch, FlashInfer and "
            f'SGLang pins are CUDA 13 builds: use "13.0.1"{WHERE}'
        )

    component_releases: dict[str, list[str]] = {}
    for name, version in (s.get("cuda_components") or {}).items():
        version = str(version)
        name_problem = _name_problem(name)
        if name_problem:
            problems.append(f"sm120kit_cuda_components: {name!r} {name_problem}{WHERE}")
        elif OLD_CUDA_NAME.search(name):
            problems.append(
                f"sm120kit_cuda_components: '{name}' is a CUDA 12 (or older) wheel in the CUDA 13 stack; "
                f"use the unsuffixed CUDA 13 wheel{WHERE}"
            )
        elif not VERSION.fullmatch(version):
            problems.append(
                f"sm120kit_cuda_components['{name}']: {version!r} is not an exact version such as \"13.0.88\"{WHERE}"
            )
        elif not version.startswith("13."):
            problems.append(
                f"sm120kit_cuda_components['{name}']: '{version}' is not a CUDA 13 component; CUDA 13.0.1 uses "
                f"13.0.88 (13.0.85 for cccl){WHERE}"
            )
        else:
            component_releases.setdefault(_major_minor(version), []).append(str(name))
    apt_version = str(s.get("cuda_apt_version", "")) if s.get("cuda_toolkit_method") == "apt" else ""
    problems += _cuda_release_problems("sm120kit_cuda_version", cuda, component_releases, apt_version)

    extra = s.get("extra_python_packages")
    if not isinstance(extra, Mapping):
        problems.append(
            "sm120kit_extra_python_packages: must be a mapping of package name to exact version, "
            'e.g. {"tiktoken": "0.12.0"}'
        )
        extra = {}
    pins = {**((profiles.get(profile) or {}).get("python_packages") or {}), **extra}
    source = f"sm120kit_profiles.{profile}.python_packages or sm120kit_extra_python_packages"
    for name, version in pins.items():
        version = str(version)
        name_problem = _name_problem(name)
        if name_problem:
            problems.append(f"python package {str(name)!r} ({source}) {name_problem}")
        elif OLD_CUDA_NAME.search(_normalize(name)):
            problems.append(
                f"python package '{name}' ({source}) is a CUDA 12 wheel; mixing it with CUDA 13 torch breaks the "
                "ABI: remove it or use its CUDA 13 build"
            )
        elif _normalize(name) == "sgl-kernel":
            problems.append(
                f"python package '{name}' ({source}) is SGLang's CUDA 12 kernel package; use 'sglang-kernel' "
                "(0.4.x, CUDA 13)"
            )
        elif not EXACT_PIN.fullmatch(version):
            problems.append(
                f"python package '{name}': {version!r} is not an exact version; sm120kit pins exactly "
                f'(e.g. "2.14.1"), ranges and operators are not allowed ({source})'
            )
        elif OLD_CUDA_BUILD.search(version):
            problems.append(
                f"python package '{name}': '{version}' is a CUDA 12 (or older) build; use a CUDA 13 build "
                f"(no local tag on PyPI, or +cu130) ({source})"
            )
        elif "+" in version and _other_device(version):
            problems.append(
                f"python package '{name}': '{version}' is not a CUDA 13 build (local tag "
                f"'+{version.split('+', 1)[1]}', {_other_device(version)}); use the PyPI build without a local tag "
                f"or +cu130 ({source})"
            )

    nccl = str(s.get("nccl_version", ""))
    if not RELEASE.fullmatch(nccl):
        problems.append(f'sm120kit_nccl_version: {nccl!r} is not an exact version such as "2.30.7"{WHERE}')
    elif _version_tuple(nccl) < NCCL_MIN:
        problems.append(_nccl_problem("sm120kit_nccl_version", nccl) + WHERE)

    if "cuda_apt_version" in s and not APT_VERSION.fullmatch(str(s.get("cuda_apt_version"))):
        problems.append(
            f"sm120kit_cuda_apt_version: {str(s.get('cuda_apt_version'))!r} is not an apt version such as "
            f'"13.0.1-1"{WHERE}'
        )

    driver = str(s.get("driver_min", ""))
    if not VERSION.fullmatch(driver):
        problems.append(f'sm120kit_driver_min: {driver!r} is not a driver version such as "580.65.06"{WHERE}')

    for var in ("venv", "cuda_home"):
        path_problem = _path_problem(str(s.get(var, "")), example={"venv": "/opt/sm120kit/venv"}.get(var, "/opt/cuda"))
        if path_problem:
            problems.append(f"sm120kit_{var}: {str(s.get(var, ''))!r} {path_problem}{WHERE}")
    wheelhouse = str(s.get("wheelhouse") or "")
    path_problem = _path_problem(wheelhouse, system_ok=True) if wheelhouse else None
    if path_problem:
        problems.append(
            f"sm120kit_wheelhouse: {wheelhouse!r} {path_problem}; it must be an absolute path on the node (or empty "
            "to use package indexes)"
        )

    for source in ("env", "env_overrides"):
        variables = s.get(source) or {}
        if not isinstance(variables, Mapping):
            problems.append(f"sm120kit_{source}: must be a mapping of variable name to value{WHERE}")
            continue
        for name, value in variables.items():
            if source == "env" and name in (s.get("env_overrides") or {}):
                continue  # the override wins: only its value reaches the node
            if not ENV_NAME.fullmatch(str(name)):
                problems.append(
                    f"sm120kit_{source}: {str(name)!r} is not a valid environment variable name (a shell "
                    "identifier: letters, digits and _, not starting with a digit)"
                )
                continue
            value_problem = _env_value_problem(value)
            if value_problem:
                problems.append(f"sm120kit_{source}['{name}']: the value {value_problem}{WHERE}")

    if "doctor_level" in s:
        level = s.get("doctor_level")
        if isinstance(level, bool) or str(level).strip() not in {str(n) for n in DOCTOR_LEVELS}:
            problems.append(
                f"sm120kit_doctor_level: {level!r} is not a doctor level; use 1 (static), 2 (one GPU) or "
                f"3 (multi-GPU){WHERE}"
            )
    urls = [("sm120kit_pip_index_url", s.get("pip_index_url") or "")]
    extra_urls = s.get("pip_extra_index_urls") or []
    if isinstance(extra_urls, (str, Mapping)) or not isinstance(extra_urls, (list, tuple)):
        problems.append(f"sm120kit_pip_extra_index_urls: must be a list of index URLs{WHERE}")
        extra_urls = []
    urls += [(f"sm120kit_pip_extra_index_urls[{i}]", url) for i, url in enumerate(extra_urls)]
    for var, url in urls:
        if url and not URL.fullmatch(str(url)):
            problems.append(
                f"{var}: {str(url)!r} is not an http(s) index URL (no spaces, quotes, newlines or shell "
                f"characters){WHERE}"
            )
        elif url:
            problems += _http_problems(var, str(url), s)
    mirror = s.get("cuda_apt_mirror") or ""
    if mirror and not URL.fullmatch(str(mirror)):
        problems.append(
            f"cuda_toolkit_apt_mirror: {str(mirror)!r} is not an http(s) URL (no spaces, quotes, newlines or shell "
            "characters)"
        )
    elif mirror:
        problems += _http_problems("cuda_toolkit_apt_mirror", str(mirror), s)
    problems += _role_var_problems(s, component_releases)
    return problems


def _other_device(version: str) -> str:
    """What device a local label such as `+cpu` or `+rocm6.4` builds for, or "" (a CUDA or an unknown local build)."""
    label = version.split("+", 1)[1].lower() if "+" in version else ""
    return next((what for prefix, what in OTHER_DEVICE_BUILD.items() if label.startswith(prefix)), "")


def _major_minor(version: str) -> str:
    return ".".join(version.split(".")[:2])


def _cuda_release_problems(var: str, cuda: str, components: Mapping[str, list[str]], apt_version: str) -> list[str]:
    """A CUDA release the pinned components (and the apt pin) do not belong to: no such toolkit would be installed."""
    if not RELEASE.fullmatch(cuda) or not cuda.startswith("13."):
        return []  # reported as malformed or not CUDA 13 already
    if len(components) > 1:
        mixed = "; ".join(f"{release}: {', '.join(names)}" for release, names in sorted(components.items()))
        return [
            f"sm120kit_cuda_components: the components belong to different CUDA releases ({mixed}); pin every "
            f"component of one release (CUDA 13.0.1: 13.0.88, 13.0.85 for cccl){WHERE}"
        ]
    problems = []
    if components and _major_minor(cuda) not in components:
        (release,) = components
        problems.append(
            f"{var}: '{cuda}' is CUDA {_major_minor(cuda)}, but the pinned sm120kit_cuda_components are CUDA "
            f"{release} ({', '.join(components[release])}): no such toolkit would be installed. Set {var} to the "
            f'release the components belong to (e.g. "13.0.1" for 13.0.88), or pin the components of CUDA '
            f"{_major_minor(cuda)} in sm120kit_cuda_components{WHERE}"
        )
    if APT_VERSION.fullmatch(apt_version) and apt_version.rsplit("-", 1)[0] != cuda:
        problems.append(
            f"{var}: '{cuda}' differs from sm120kit_cuda_apt_version '{apt_version}' (the apt method pins that "
            f"release of cuda-toolkit-{_major_minor(cuda).replace('.', '-')}): write the same release in both, "
            f'e.g. "{cuda}-1"{WHERE}'
        )
    return problems


def _role_var_problems(s: Mapping[str, Any], component_releases: Mapping[str, list[str]]) -> list[str]:
    """Role variables set directly (inventory, -e) skip the sm120kit_* rules: the same rules, under their own name."""
    role_vars = s.get("role_vars") or {}
    if not isinstance(role_vars, Mapping):
        return []
    method = str(s.get("cuda_toolkit_method") or "wheels")
    problems: list[str] = []
    for name, (kind, base) in ROLE_VARS.items():
        if name not in role_vars:
            continue
        if (name in CUDA_WHEELS_ONLY and method != "wheels") or (name in CUDA_APT_ONLY and method != "apt"):
            continue
        value = role_vars[name]
        if base is not None and base in s and value == s[base]:
            continue  # the sm120kit_* setting it defaults to, checked (and named) above
        role = next(r for r in ROLES if name.startswith(r + "_"))
        where = f" (the {role} role's variable, set in your inventory or with -e; see roles/{role}/README.md)"
        if kind == "urls":
            if not isinstance(value, (list, tuple)):
                problems.append(f"{name}: must be a list of index URLs{where}")
                continue
            for i, url in enumerate(value):
                problems += [p + where for p in _url_problems(f"{name}[{i}]", url, s)]
            continue
        if kind == "url":
            problems += [p + where for p in _url_problems(name, value, s)]
            continue
        if kind in ("cuda", "nccl"):
            text = str(value)
            if not RELEASE.fullmatch(text):
                problems.append(f'{name}: {text!r} is not a full release number such as "13.0.1"{where}')
            elif kind == "cuda":
                if len(component_releases) == 1:  # mixed components are reported under sm120kit_cuda_components
                    found = _cuda_release_problems(name, text, component_releases, "")
                    problems += [p.replace(WHERE, where) for p in found]
                if not text.startswith("13."):
                    problems.append(f"{name}: '{text}' is not CUDA 13; SM120 needs CUDA 13: use \"13.0.1\"{where}")
            elif _version_tuple(text) < NCCL_MIN:
                problems.append(_nccl_problem(name, text) + where)
            continue
        problem = _role_value_problem(kind, value)
        if problem:
            problems.append(f"{name}: {str(value)!r} {problem}{where}")
    return problems


ROLES = ("python_stack", "cuda_toolkit", "nccl", "cuda_env", "sm120check", "sglang_sm120", "flashinfer_jit")


def _role_value_problem(kind: str, value: object) -> str | None:
    """Why a role variable's `value` is not a `kind` (see ROLE_VARS), or None."""
    if not isinstance(value, str):
        return f"must be a string, not a {type(value).__name__}"
    if kind == "module":
        return None if IDENTIFIER.fullmatch(value) else "is not a Python module name (letters, digits and _)"
    if kind == "file_name":
        return None if FILE_NAME.fullmatch(value) else "is not a plain file name (letters, digits, . _ + -; no /)"
    if kind == "opt_dir":
        return _path_problem(value, system_ok=True) if value else None
    if kind == "module_path":
        if not value.startswith("/"):
            return "must be an absolute path"
        if any(ord(c) < 32 or ord(c) == 127 for c in value):
            return "contains a newline or another control character"
        return None
    if kind == "control":
        if not value.startswith("/"):
            return "must be an absolute path"
        return _path_problem(posixpath.normpath(value), system_ok=True)
    if kind == "file":
        problem = _path_problem(value, system_ok=True)
        if problem is None and (value in SYSTEM_DIRS or value.count("/") < 2):
            problem = "is a system directory (or a top-level one), not a file path"
        return problem
    return _path_problem(value)


def _url_problems(var: str, url: object, s: Mapping[str, Any]) -> list[str]:
    """The URL checks of the sm120kit_* indexes, without the suffix naming where to set them."""
    if not url:
        return []
    if not URL.fullmatch(str(url)):
        return [f"{var}: {_redact(str(url))!r} is not an http(s) URL (no spaces, quotes, newlines or shell characters)"]
    return _http_problems(var, str(url), s)


def _http_problems(var: str, url: str, s: Mapping[str, Any]) -> list[str]:
    """Plain http lets anyone on the path swap packages (index installs are not hash-checked) or the apt key."""
    if not url.lower().startswith("http://") or s.get("allow_insecure_http") in (True, "true", "True", "yes", 1):
        return []
    return [
        f"{var}: {_redact(url)!r} is plain http: anyone on the network path can swap the packages (pip installs "
        "from an index are not hash-checked; only the wheelhouse is) or the apt signing key. Use https, a wheelhouse "
        "(sm120kit_wheelhouse), or set sm120kit_allow_insecure_http=true to accept the risk"
    ]


def _redact(url: str) -> str:
    """The URL without a password (user:pass@host), for messages."""
    return re.sub(r"(?<=://)([^/@:]*):[^/@]*@", r"\1:***@", url)


# Names of environment variables that usually hold credentials.
SECRET_NAME = re.compile(r".*(TOKEN|KEY|SECRET|PASSWORD|PASSWD|CREDENTIAL|AUTH).*", re.IGNORECASE)


def manifest_warnings(s: Mapping[str, Any]) -> list[str]:
    """Things that work but should be known: secrets in the environment every user can read, development and
    local builds among the pins."""
    warnings: list[str] = _version_warnings(s)
    for source in ("env", "env_overrides"):
        variables = s.get(source) or {}
        if not isinstance(variables, Mapping):
            continue
        for name, value in variables.items():
            if value is not None and SECRET_NAME.fullmatch(str(name)):
                warnings.append(
                    f"sm120kit_{source}['{name}'] looks like a secret: its value is written to "
                    "/etc/profile.d/sm120kit.sh and the venv's sm120kit_env.py, which every user of the node can "
                    "read (and to /etc/sm120kit/manifest.json, root only). Give secrets to the service that needs "
                    "them instead (a root-only EnvironmentFile, a credential store), not to sm120kit_env_overrides"
                )
    return warnings


def _version_warnings(s: Mapping[str, Any]) -> list[str]:
    """Exact pins that are development, pre-release or local builds: accepted (pip installs exactly them), said."""
    profiles = s.get("profiles") or {}
    profile = (profiles.get(str(s.get("profile", ""))) or {}) if isinstance(profiles, Mapping) else {}
    extra = s.get("extra_python_packages")
    pins = {**(profile.get("python_packages") or {}), **(extra if isinstance(extra, Mapping) else {})}
    warnings = []
    for name, version in pins.items():
        version = str(version)
        if not EXACT_PIN.fullmatch(version) or OLD_CUDA_BUILD.search(version) or _other_device(version):
            continue  # refused by manifest_problems
        if DEV_OR_PRE.search(version):
            warnings.append(
                f"python package '{name}': '{version}' is a development or pre-release build: accepted because the "
                "pin is exact, but no release of it has been validated with sm120kit; the index or wheelhouse must "
                "carry it (preflight's resolution says whether it does)"
            )
        if "+" in version and not CUDA13_BUILD.search(version):
            warnings.append(
                f"python package '{name}': '{version}' is a local build (local tag '+{version.split('+', 1)[1]}', "
                "e.g. a git build): accepted, but its version does not say which CUDA it was built for; the "
                "doctor's abi and torch checks read that from the installed wheel on the node"
            )
    return warnings


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {"sm120kit_manifest_problems": manifest_problems, "sm120kit_manifest_warnings": manifest_warnings}
