"""Probe (child process): open libnvrtc.so.13 by soname, report its file, version and architectures;
with --compile, also compile the test kernel for each given architecture. Prints one JSON line and
announces each step on stderr first.

    python -m sm120check.doctor.probes.nvrtc_info [--compile sm_120,sm_120a,sm_120f]

NVRTC is dlopen'ed here, not in the doctor, so that a library whose constructor blocks or that
segfaults ends as a verdict instead of hanging or killing the doctor.
"""

from __future__ import annotations

import argparse
import base64

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
        emit({"open_error": str(exc)})
        return
    report: dict[str, object] = {"path": opened.path}
    where = opened.path or nvrtc_api.SONAME
    try:
        step(f"nvrtcVersion in {where}")
        report["version"] = list(opened.version())
        step(f"nvrtcGetSupportedArchs in {where}")
        report["archs"] = opened.supported_archs()
    except (nvrtc_api.NvrtcError, AttributeError) as exc:
        report["version_error"] = str(exc)
    compiled = []
    for arch in [a.strip() for a in args.compile.split(",") if a.strip()]:
        step(f"nvrtcCompileProgram for {arch} in {where}")
        c = opened.compile(arch)
        compiled.append(
            {
                "arch": c.arch,
                "ok": c.ok,
                "code": c.code,
                "cubin": base64.b64encode(c.cubin).decode(),
                "log": c.log[-4000:],
                "seconds": c.seconds,
            }
        )
    if compiled:
        report["compiled"] = compiled
    emit(report)


if __name__ == "__main__":
    main()
