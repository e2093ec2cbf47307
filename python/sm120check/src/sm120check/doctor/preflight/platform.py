"""Platform: what this node is (OS, kernel, Python, glibc)."""

from __future__ import annotations

import os
import platform as _platform
import sys
from pathlib import Path
from typing import ClassVar

from sm120check import bounded, versions
from sm120check.doctor import remedies
from sm120check.doctor.model import Context, Result, Status

MIN_PYTHON = (3, 10)
MIN_GLIBC = "2.28"  # torch and the CUDA wheels are manylinux_2_28


def os_release(path: Path = Path("/etc/os-release")) -> dict[str, str]:
    fields: dict[str, str] = {}
    try:
        text = bounded.read_text(path, 64 << 10, lenient=True)
    except bounded.Unreadable:
        return fields
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep:
            fields[key.strip()] = value.strip().strip('"')
    return fields


def glibc_version() -> str:
    try:
        text = os.confstr("CS_GNU_LIBC_VERSION") or ""
    except (ValueError, OSError):
        text = ""
    return text.split()[-1] if text.startswith("glibc") else ""


def platform_verdict(
    system: str, machine: str, python: tuple[int, int], glibc: str, os_name: str, kernel: str
) -> Result:
    data = {"os": os_name, "kernel": kernel, "python": f"{python[0]}.{python[1]}", "glibc": glibc, "machine": machine}
    summary = f"{os_name or system}, kernel {kernel}, Python {python[0]}.{python[1]}, glibc {glibc or '?'}, {machine}"
    if system != "Linux":
        return Result("platform", Status.FAIL, f"{system} is not supported: CUDA serving nodes run Linux", data=data)
    if python < MIN_PYTHON:
        return Result(
            "platform",
            Status.FAIL,
            f"Python {python[0]}.{python[1]} is older than 3.10: {summary}",
            remedy=remedies.PYTHON_TOO_OLD,
            data=data,
        )
    if not glibc or not versions.at_least(glibc, MIN_GLIBC):
        return Result(
            "platform",
            Status.FAIL,
            f"glibc {glibc or 'unknown'} is older than {MIN_GLIBC}: {summary}",
            details="torch and the CUDA 13 wheels are manylinux_2_28 builds and will not install or load",
            remedy=remedies.GLIBC_TOO_OLD,
            data=data,
        )
    if machine not in ("x86_64", "aarch64"):
        return Result("platform", Status.WARN, f"{machine} has no CUDA 13 wheels: {summary}", data=data)
    return Result("platform", Status.PASS, summary, data=data)


class PlatformCheck:
    """OS, kernel, Python and glibc are ones the CUDA 13 wheels support."""

    id: ClassVar[str] = "platform"
    family: ClassVar[str] = "preflight"
    level: ClassVar[int] = 1
    requires: ClassVar[tuple[str, ...]] = ()
    uses: ClassVar[tuple[str, ...]] = ()

    def run(self, ctx: Context) -> Result:
        return platform_verdict(
            _platform.system(),
            _platform.machine(),
            sys.version_info[:2],
            glibc_version(),
            os_release().get("PRETTY_NAME", ""),
            _platform.release(),
        )


CHECKS = (PlatformCheck,)
