"""NVRTC: libnvrtc.so.13 resolves by soname (as sgl_kernel loads it), is 13.x and supports sm_120."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import ClassVar

from sm120check.doctor import loader, nvrtc_api, remedies, stackenv
from sm120check.doctor.cuda_toolkit.nvrtc_verdict import nvrtc_probe_verdict
from sm120check.doctor.model import Context, Result, Status

NVRTC_TIMEOUT = 30.0  # opening NVRTC and asking its version takes milliseconds

# Where the PyPI CUDA wheels put NVRTC, relative to site-packages (CUDA 13 and CUDA 12 layouts).
WHEEL_COPIES = ("nvidia/cu13/lib/libnvrtc.so.13", "nvidia/cuda_nvrtc/lib/libnvrtc.so.12")


def wheel_copies(site_dirs: Sequence[Path]) -> list[str]:
    return [str(d / rel) for d in site_dirs for rel in WHEEL_COPIES if (d / rel).exists()]


def nvrtc_verdict(
    opened: nvrtc_api.Opened | None,
    open_error: str,
    version: tuple[int, int] | None,
    archs: Sequence[int],
    copies: Sequence[str],
    want_lib_dir: str,
    want_version: str,
) -> Result:
    data: dict[str, object] = {"wheel_copies": list(copies)}
    found = f"copies on disk: {', '.join(copies)}" if copies else "no NVRTC wheel in the stack venv"
    if opened is None:
        return Result(
            "nvrtc",
            Status.FAIL,
            f"{nvrtc_api.SONAME} does not load by soname",
            details=f"{open_error}\n{found}",
            remedy=remedies.NVRTC_LOADER,
            data=data,
        )
    path = opened.path or "(path unknown)"
    data.update(path=path, supported_archs=list(archs))
    if version is None:
        return Result("nvrtc", Status.FAIL, f"nvrtcVersion failed in {path}", remedy=remedies.NVRTC_LOADER, data=data)
    data.update(version=f"{version[0]}.{version[1]}")
    summary = f"NVRTC {version[0]}.{version[1]} from {path}"
    if version[0] != 13:
        return Result("nvrtc", Status.FAIL, f"{summary} is not CUDA 13", remedy=remedies.NVRTC_LOADER, data=data)
    if 120 not in archs:
        return Result(
            "nvrtc",
            Status.FAIL,
            f"{summary} cannot target sm_120",
            details=f"supported: {', '.join(map(str, archs))}",
            remedy=remedies.NVRTC_NO_SM120,
            data=data,
        )
    if want_version and want_version.split(".")[:2] != [str(version[0]), str(version[1])]:
        return Result(
            "nvrtc",
            Status.FAIL,
            f"{summary}; the manifest pins {want_version}",
            remedy=remedies.NVRTC_LOADER,
            data=data,
        )
    if want_lib_dir and opened.path and not loader.same_file(str(Path(opened.path).parent), want_lib_dir):
        return Result(
            "nvrtc",
            Status.WARN,
            f"{summary}, not from the manifest's lib_dir {want_lib_dir}",
            details=f"archs {', '.join(map(str, archs))}; {found}",
            remedy=remedies.NVRTC_LOADER,
            data=data,
        )
    return Result(
        "nvrtc",
        Status.PASS,
        f"{summary}, supports sm_120",
        details=f"archs {', '.join(map(str, archs))}; {found}",
        data=data,
    )


class NvrtcCheck:
    """libnvrtc.so.13 loads by soname, is NVRTC 13.x, lists 120 among its architectures; shows which file it is."""

    id: ClassVar[str] = "nvrtc"
    family: ClassVar[str] = "cuda_toolkit"
    level: ClassVar[int] = 1
    requires: ClassVar[tuple[str, ...]] = ()
    uses: ClassVar[tuple[str, ...]] = ()

    def run(self, ctx: Context) -> Result:
        copies = wheel_copies(stackenv.site_packages(ctx.facts.venv))
        m = ctx.manifest
        want_dir = m.cuda.lib_dir if m else ""
        want_version = m.cuda.nvrtc if m else ""
        answer = nvrtc_api.probe(min(ctx.timeout, NVRTC_TIMEOUT))
        if answer.problem:
            return nvrtc_probe_verdict(self.id, answer.problem, answer.step, answer.stderr_tail, copies)
        opened = answer.opened
        if opened is None:
            return nvrtc_verdict(None, answer.open_error, None, (), copies, want_dir, want_version)
        return nvrtc_verdict(opened, "", opened.version, opened.archs, copies, want_dir, want_version)


CHECKS = (NvrtcCheck,)
