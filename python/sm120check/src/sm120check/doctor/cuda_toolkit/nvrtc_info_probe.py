"""Probe (child process): open libnvrtc.so.13 by soname, report its file, version and architectures;
with --compile, also compile the test kernel for each given architecture. Prints one JSON line and
announces each step on stderr first.

    python -m sm120check.doctor.cuda_toolkit.nvrtc_info_probe [--compile sm_120,sm_120a,sm_120f]

NVRTC is dlopen'ed here, not in the doctor, so that a library whose constructor blocks or that
segfaults ends as a verdict instead of hanging or killing the doctor.
"""

from __future__ import annotations

import argparse
from dataclasses import replace

from sm120check.doctor import nvrtc_api
from sm120check.doctor.child import emit, step


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--compile", default="", help="comma-separated architectures to compile the test kernel for")
    args = parser.parse_args()
    step(f"dlopen {nvrtc_api.SONAME}")
    try:
        opened = nvrtc_api.Nvrtc.open()
    except OSError as exc:
        emit(nvrtc_api.NvrtcInfo(open_error=str(exc)).to_json())
        return
    report = nvrtc_api.NvrtcInfo(path=opened.path)
    where = opened.path or nvrtc_api.SONAME
    try:
        step(f"nvrtcVersion in {where}")
        report = replace(report, version=opened.version())
        step(f"nvrtcGetSupportedArchs in {where}")
        report = replace(report, archs=tuple(opened.supported_archs()))
    except (nvrtc_api.NvrtcError, AttributeError) as exc:
        report = replace(report, version_error=str(exc))
    compiled = []
    for arch in [a.strip() for a in args.compile.split(",") if a.strip()]:
        step(f"nvrtcCompileProgram for {arch} in {where}")
        compiled.append(opened.compile(arch))
    emit(replace(report, compiled=tuple(compiled)).to_json())


if __name__ == "__main__":
    main()
