"""Platform and manifest: what this node is and which stack it was provisioned for."""

from __future__ import annotations

import os
import platform as _platform
import sys
from pathlib import Path
from typing import ClassVar

from sm120check import __version__, bounded, manifest, versions
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


class ManifestCheck:
    """The node manifest (/etc/sm120kit/manifest.json) is present and readable, and names the profile."""

    id: ClassVar[str] = "manifest"
    family: ClassVar[str] = "sm120check"
    level: ClassVar[int] = 1
    requires: ClassVar[tuple[str, ...]] = ()
    uses: ClassVar[tuple[str, ...]] = ()

    def run(self, ctx: Context) -> Result:
        m = ctx.manifest
        if m is None:
            missing = ctx.manifest_error_kind in (None, manifest.ErrorKind.MISSING)
            return Result(
                self.id,
                Status.WARN if missing else Status.FAIL,
                "no node manifest: version comparisons use built-in CUDA 13.0 defaults or are skipped"
                if missing
                else "the node manifest cannot be used",
                details=ctx.manifest_error or f"{manifest.manifest_path()} not found",
                remedy=remedies.MANIFEST_MISSING,
                data={"error": ctx.manifest_error_kind.value} if ctx.manifest_error_kind else {},
            )
        data = {"path": str(m.path), "profile": m.profile, "venv": m.venv}
        summary = f"{m.path}: profile {m.profile}, venv {m.venv}"
        # sm120kit_version: the checker installed with this manifest is the one reading it.
        if m.sm120kit_version != __version__:
            return Result(
                self.id,
                Status.WARN,
                f"{summary}; written by sm120kit {m.sm120kit_version}, doctor is {__version__}",
                remedy=remedies.MANIFEST_STALE,
                data=data,
            )
        return Result(self.id, Status.PASS, summary, data=data)


CHECKS = (PlatformCheck, ManifestCheck)
