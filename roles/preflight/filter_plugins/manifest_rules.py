"""The stack manifest's rules, as an Ansible filter: `{{ settings | sm120kit_manifest_problems }}`.

Pure Python over plain data, so the rules are readable, unit-tested without Ansible (tests/ansible) and run
on the control node before any node is touched. Each problem names the variable and the fix.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

WHERE = " (inventory/group_vars/all/stack.yml or your inventory)"
RELEASE = re.compile(r"^[0-9]+\.[0-9]+\.[0-9]+$")
VERSION = re.compile(r"^[0-9]+(\.[0-9]+)+$")
EXACT_PIN = re.compile(r"^[0-9]+(\.[0-9]+)*((a|b|rc)[0-9]+)?(\.post[0-9]+)?(\+[A-Za-z0-9.]+)?$")
OLD_CUDA_NAME = re.compile(r"-cu1[0-2]$")
OLD_CUDA_BUILD = re.compile(r"\+cu(1[0-2]|[0-9])[0-9]$")
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
NCCL_MIN = (2, 26, 2)


def _normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _version_tuple(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split("."))


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
    if not RELEASE.match(cuda):
        problems.append(
            f"sm120kit_cuda_version: '{cuda}' is not a full release number; write MAJOR.MINOR.PATCH, e.g. \"13.0.1\""
            + WHERE
        )
    elif not cuda.startswith("13."):
        problems.append(
            f"sm120kit_cuda_version: '{cuda}' is not CUDA 13; SM120 JIT needs CUDA 13 and the torch, FlashInfer and "
            f'SGLang pins are CUDA 13 builds: use "13.0.1"{WHERE}'
        )

    for name, version in (s.get("cuda_components") or {}).items():
        version = str(version)
        if OLD_CUDA_NAME.search(name):
            problems.append(
                f"sm120kit_cuda_components: '{name}' is a CUDA 12 (or older) wheel in the CUDA 13 stack; "
                f"use the unsuffixed CUDA 13 wheel{WHERE}"
            )
        elif not VERSION.match(version):
            problems.append(
                f"sm120kit_cuda_components['{name}']: '{version}' is not an exact version such as \"13.0.88\"{WHERE}"
            )
        elif not version.startswith("13."):
            problems.append(
                f"sm120kit_cuda_components['{name}']: '{version}' is not a CUDA 13 component; CUDA 13.0.1 uses "
                f"13.0.88 (13.0.85 for cccl){WHERE}"
            )

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
        if OLD_CUDA_NAME.search(_normalize(name)):
            problems.append(
                f"python package '{name}' ({source}) is a CUDA 12 wheel; mixing it with CUDA 13 torch breaks the "
                "ABI: remove it or use its CUDA 13 build"
            )
        elif _normalize(name) == "sgl-kernel":
            problems.append(
                f"python package '{name}' ({source}) is SGLang's CUDA 12 kernel package; use 'sglang-kernel' "
                "(0.4.x, CUDA 13)"
            )
        elif not EXACT_PIN.match(version):
            problems.append(
                f"python package '{name}': '{version}' is not an exact version; sm120kit pins exactly "
                f'(e.g. "2.14.1"), ranges and operators are not allowed ({source})'
            )
        elif OLD_CUDA_BUILD.search(version):
            problems.append(
                f"python package '{name}': '{version}' is a CUDA 12 (or older) build; use a CUDA 13 build "
                f"(no local tag on PyPI, or +cu130) ({source})"
            )

    nccl = str(s.get("nccl_version", ""))
    if not RELEASE.match(nccl):
        problems.append(f"sm120kit_nccl_version: '{nccl}' is not an exact version such as \"2.30.7\"{WHERE}")
    elif _version_tuple(nccl) < NCCL_MIN:
        problems.append(
            f"sm120kit_nccl_version: '{nccl}' is older than 2.26.2, which SM120 needs (older NCCL fails with "
            f"'ncclMaxSharedMem ... exceeds'); use \"2.30.7\"{WHERE}"
        )

    driver = str(s.get("driver_min", ""))
    if not VERSION.match(driver):
        problems.append(f"sm120kit_driver_min: '{driver}' is not a driver version such as \"580.65.06\"{WHERE}")

    for var in ("venv", "cuda_home"):
        if not str(s.get(var, "")).startswith("/"):
            problems.append(f"sm120kit_{var}: '{s.get(var, '')}' must be an absolute path")
    wheelhouse = str(s.get("wheelhouse") or "")
    if wheelhouse and not wheelhouse.startswith("/"):
        problems.append(
            f"sm120kit_wheelhouse: '{wheelhouse}' must be an absolute path on the node (or empty to use package "
            "indexes)"
        )
    for name in s.get("env_overrides") or {}:
        if not ENV_NAME.match(str(name)):
            problems.append(f"sm120kit_env_overrides: '{name}' is not a valid environment variable name")
    return problems


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {"sm120kit_manifest_problems": manifest_problems}
