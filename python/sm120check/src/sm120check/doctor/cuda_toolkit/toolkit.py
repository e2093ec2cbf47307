"""The CUDA toolkit FlashInfer and torch extensions will use: where, which nvcc, and whether it targets sm_120."""

from __future__ import annotations

import os
import re
import tempfile
import time
from pathlib import Path
from typing import ClassVar

from sm120check import versions
from sm120check.doctor import child, remedies
from sm120check.doctor.facts import CudaHome
from sm120check.doctor.model import Context, Result, Status

_NVCC_VERSION = re.compile(r"release (\d+\.\d+), V(\d+\.\d+\.\d+)")


def parse_nvcc_version(text: str) -> tuple[str, str] | None:
    """`nvcc --version` output -> (release, full version): ("13.0", "13.0.88")."""
    match = _NVCC_VERSION.search(text)
    return (match.group(1), match.group(2)) if match else None


NVCC_QUERY_TIMEOUT = 20.0  # `nvcc --version` and `--list-gpu-code` together, at most (and never above --timeout)


def _run(cmd: list[str], timeout: float = NVCC_QUERY_TIMEOUT) -> tuple[int, str]:
    """Run nvcc in its own process group (killed whole at the timeout or when the doctor stops)."""
    done = child.run_command(cmd, timeout=timeout)
    if done.cut:  # an nvcc that wrote without end: its first lines and why it was stopped
        return done.returncode, f"{done.stdout[:500]}\n[...]\n{done.stderr}"
    return done.returncode, done.text


def toolkit_verdict(
    home: CudaHome,
    version_out: tuple[int, str] | None,
    gpu_codes: str,
    want_nvcc: str,
    want_home: str,
    want_version: str = "",
) -> Result:
    """Verdict from the resolved home, `nvcc --version` (rc, text) and `nvcc --list-gpu-code` output.

    The wants are the manifest's cuda.nvcc, cuda.home and cuda.version ("" when there is no manifest).
    """
    data: dict[str, object] = {"cuda_home": home.path, "source": home.source}
    if not home.path:
        return Result(
            "toolkit",
            Status.FAIL,
            "no CUDA toolkit: CUDA_HOME, CUDA_PATH unset, no nvcc on PATH, no /usr/local/cuda",
            remedy=remedies.TOOLKIT,
            data=data,
        )
    nvcc = f"{home.path}/bin/nvcc"
    where = f"CUDA_HOME {home.path} (from {home.source})"
    if version_out is None or version_out[0] != 0:
        return Result(
            "toolkit",
            Status.FAIL,
            f"{nvcc} does not run; {where}",
            details=version_out[1].strip() if version_out else "",
            remedy=remedies.TOOLKIT,
            data=data,
        )
    parsed = parse_nvcc_version(version_out[1])
    if parsed is None:
        return Result(
            "toolkit",
            Status.FAIL,
            f"{nvcc} --version printed no release",
            details=version_out[1],
            remedy=remedies.TOOLKIT,
        )
    release, full = parsed
    data.update(nvcc=full, release=release)
    codes = gpu_codes.split()
    data["sm_120"] = "sm_120" in codes
    summary = f"nvcc {full} at {where}"
    if not release.startswith("13."):
        return Result(
            "toolkit",
            Status.FAIL,
            f"nvcc is CUDA {release}, not 13: {summary}",
            details="FlashInfer reads the CUDA version from $CUDA_HOME/bin/nvcc and a cu130 torch needs CUDA 13",
            remedy=remedies.TOOLKIT,
            data=data,
        )
    if want_version and not versions.same_release(release, want_version):
        return Result(
            "toolkit",
            Status.FAIL,
            f"nvcc is CUDA {release} but the manifest's toolkit is CUDA {want_version}: {summary}",
            remedy=remedies.TOOLKIT_VERSION,
            data=data,
        )
    if want_nvcc and full != want_nvcc:
        return Result(
            "toolkit",
            Status.FAIL,
            f"nvcc {full} but the manifest pins {want_nvcc}: {summary}",
            remedy=remedies.TOOLKIT_VERSION,
            data=data,
        )
    if "sm_120" not in codes:
        return Result(
            "toolkit",
            Status.FAIL,
            f"nvcc cannot target sm_120: {summary}",
            details=f"nvcc --list-gpu-code: {' '.join(codes) or '(nothing)'}",
            remedy=remedies.TOOLKIT,
            data=data,
        )
    if want_home and os.path.realpath(home.path) != os.path.realpath(want_home):
        return Result(
            "toolkit",
            Status.WARN,
            f"{summary}; the manifest's toolkit is {want_home}",
            details="FlashInfer and torch extensions will build with the toolkit above, not the provisioned one",
            remedy=remedies.cuda_home(want_home),
            data=data,
        )
    return Result("toolkit", Status.PASS, f"{summary}, targets sm_120", data=data)


class ToolkitCheck:
    """CUDA_HOME resolves like FlashInfer's JIT does, its nvcc is the manifest's version and can target sm_120."""

    id: ClassVar[str] = "toolkit"
    family: ClassVar[str] = "cuda_toolkit"
    level: ClassVar[int] = 1
    requires: ClassVar[tuple[str, ...]] = ()
    uses: ClassVar[tuple[str, ...]] = ()

    def run(self, ctx: Context) -> Result:
        home = ctx.facts.toolkit_home
        version_out = codes = None
        if home.path:
            nvcc = f"{home.path}/bin/nvcc"
            deadline = time.monotonic() + min(ctx.timeout, NVCC_QUERY_TIMEOUT)
            version_out = _run([nvcc, "--version"], timeout=deadline - time.monotonic())
            if version_out[0] == 0:  # a hung or broken nvcc fails the check on its own: not asked twice
                codes = _run([nvcc, "--list-gpu-code"], timeout=deadline - time.monotonic())
        m = ctx.manifest
        want_nvcc, want_home, want_version = (m.cuda.nvcc, m.cuda.home, m.cuda.version) if m else ("", "", "")
        gpu_codes = codes[1] if codes and codes[0] == 0 else ""
        return toolkit_verdict(home, version_out, gpu_codes, want_nvcc, want_home, want_version)


_PROBE_SOURCE = 'extern "C" __global__ void sm120kit_probe(unsigned *out) { out[threadIdx.x] = threadIdx.x * 3u; }\n'


def no_host_compiler(output: str) -> bool:
    """nvcc's words when neither gcc nor the -ccbin compiler exists."""
    return "Failed to preprocess host compiler properties" in output or "gcc: No such file or directory" in output


class NvccSm120Check:
    """nvcc really compiles a CUDA kernel to an sm_120 cubin."""

    id: ClassVar[str] = "nvcc_sm120"
    family: ClassVar[str] = "cuda_toolkit"
    level: ClassVar[int] = 2
    requires: ClassVar[tuple[str, ...]] = ("toolkit",)
    uses: ClassVar[tuple[str, ...]] = ()

    def run(self, ctx: Context) -> Result:
        home = ctx.facts.toolkit_home.path  # `toolkit` passed: this home's nvcc runs and targets sm_120
        with tempfile.TemporaryDirectory(prefix="sm120check-nvcc-") as tmp:
            source, cubin = Path(tmp, "probe.cu"), Path(tmp, "probe.cubin")
            source.write_text(_PROBE_SOURCE, encoding="utf-8")
            cmd = [f"{home}/bin/nvcc", "-cubin", "-arch=sm_120", "-o", str(cubin), str(source)]
            rc, out = _run(cmd, timeout=ctx.timeout)
            size = cubin.stat().st_size if cubin.exists() else 0
        if rc != 0 and no_host_compiler(out):
            return Result(
                self.id,
                Status.FAIL,
                "nvcc has no host C++ compiler: it cannot compile anything (nor can FlashInfer's or Triton's JIT)",
                details=f"{' '.join(cmd)}\n{out.strip()[-2000:]}",
                remedy=remedies.HOST_COMPILER,
            )
        if rc != 0 or size == 0:
            return Result(
                self.id,
                Status.FAIL,
                f"nvcc failed to build an sm_120 cubin (exit {rc})",
                details=f"{' '.join(cmd)}\n{out.strip()[-2000:]}",
                remedy=remedies.TOOLKIT,
            )
        return Result(self.id, Status.PASS, f"nvcc built an sm_120 cubin ({size} bytes)", data={"cubin_bytes": size})


CHECKS = (ToolkitCheck, NvccSm120Check)
