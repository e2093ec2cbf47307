"""The NVIDIA driver through NVML: loaded, new enough, which kernel module, device nodes, persistence."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import ClassVar

from sm120check import bounded, versions
from sm120check.doctor import child, facts, nvml_api, remedies
from sm120check.doctor.model import Context, Result, Status

CUDA13_DRIVER_MIN = "580.65.06"  # CUDA 13.0's minimum Linux driver
NVML_PROBE = facts.NVML_PROBE
PROC_VERSION = Path("/proc/driver/nvidia/version")
_PROC_DRIVER = re.compile(r"Kernel Module(?: for \S+)?\s+(\d+\.\d+(?:\.\d+)?)")


def module_flavour(proc_text: str) -> str:
    """'open' or 'proprietary' from /proc/driver/nvidia/version, '' when the text says neither."""
    first = proc_text.strip().splitlines()[0] if proc_text.strip() else ""
    if "Open Kernel Module" in first:
        return "open"
    return "proprietary" if "Kernel Module" in first else ""


def proc_driver_version(proc_text: str) -> str:
    match = _PROC_DRIVER.search(proc_text)
    return match.group(1) if match else ""


def gpu_rows(info: nvml_api.NvmlInfo) -> list[dict[str, object]]:
    return [
        {
            "index": g.index,
            "name": g.name,
            "cc": f"{g.cc[0]}.{g.cc[1]}",
            "persistence": g.persistence,
            "bus_id": g.bus_id,
        }
        for g in info.gpus
    ]


def driver_verdict(
    info: nvml_api.NvmlInfo | None,
    nvml_error: str,
    proc_text: str | None,
    driver_min: str,
    min_source: str,
) -> Result:
    """The verdict on the driver from NVML's answer (or its error) and /proc/driver/nvidia/version."""
    flavour = module_flavour(proc_text or "")
    if info is None:
        if proc_text is None:
            return Result(
                "driver",
                Status.SKIP,
                "no NVIDIA driver",
                details=f"{PROC_VERSION} is absent and NVML does not load ({nvml_error})",
                remedy=remedies.DRIVER,
            )
        return Result(
            "driver",
            Status.FAIL,
            f"the kernel module {proc_driver_version(proc_text)} is loaded but NVML fails",
            details=f"{nvml_error}\n{proc_text.strip().splitlines()[0]}",
            remedy=remedies.DRIVER_LIBRARY_MISMATCH,
        )
    gpus = gpu_rows(info)
    data: dict[str, object] = {
        "driver": info.driver,
        "driver_min": driver_min,
        "module": flavour or "unknown",
        "cuda_driver": info.cuda_driver,
        "gpu_count": len(info.gpus),
        "gpus": gpus,
        "nvml": info.backend,
    }
    described = ", ".join(f"{g.index}: {g.name} (cc {g.cc[0]}.{g.cc[1]})" for g in info.gpus) or "no GPUs"
    cuda = f"{info.cuda_driver // 1000}.{info.cuda_driver % 1000 // 10}"
    summary = f"driver {info.driver} ({flavour or 'module type unknown'}), CUDA {cuda}; {described}"
    details = f"minimum {driver_min} ({min_source})" + (f"\n{proc_text.strip().splitlines()[0]}" if proc_text else "")
    if not versions.at_least(info.driver, driver_min):
        return Result(
            "driver",
            Status.FAIL,
            f"driver {info.driver} is older than {driver_min}: {summary}",
            details=details,
            remedy=remedies.DRIVER,
            data=data,
        )
    if not info.gpus:
        return Result(
            "driver",
            Status.WARN,
            f"driver {info.driver} is loaded but shows no GPUs",
            details=details,
            remedy=remedies.DRIVER_NO_GPU,
            data=data,
        )
    blackwell = [g for g in info.gpus if g.cc[0] >= 10]
    if blackwell and flavour == "proprietary":
        return Result(
            "driver",
            Status.WARN,
            f"proprietary kernel module with Blackwell GPUs: {summary}",
            details=details,
            remedy=remedies.DRIVER_OPEN_MODULES,
            data=data,
        )
    return Result("driver", Status.PASS, summary, details=details, data=data)


def nvml_probe_verdict(problem: str, step: str, stderr_tail: str, proc_text: str | None) -> Result:
    """The verdict when the NVML probe hung or died (timeout, signal, no JSON): always a FAIL, whether or not
    /proc shows a driver, since a library that hangs or crashes on load also hangs or crashes what uses it."""
    during = f" during {step}" if step else ""
    evidence = [f"the NVML probe (python -m {NVML_PROBE}) {problem}{during}"]
    if proc_text:
        evidence.append(proc_text.strip().splitlines()[0])
    lines = [line for line in stderr_tail.strip().splitlines() if not line.startswith(child.STEP_MARK)]
    if lines:
        evidence.append("\n".join(lines[-10:]))
    hung = "hung" if "timed out" in problem else ("crashed" if "killed by" in problem else "failed")
    return Result(
        "driver",
        Status.FAIL,
        f"NVML {hung}{during}: the probe {problem}",
        details="\n".join(evidence),
        remedy=remedies.NVML_HANG,
    )


def nvml_answer(data: Mapping[str, object]) -> tuple[nvml_api.NvmlInfo | None, str]:
    """The NVML probe's JSON -> (info, "") when NVML answered, (None, why) when it could not be loaded."""
    answer = facts.nvml_facts(data)
    return answer.info, answer.error


class DriverCheck:
    """The NVIDIA driver is loaded, >= the manifest's driver_min; NVML lists the GPUs and compute capabilities."""

    id: ClassVar[str] = "driver"
    family: ClassVar[str] = "preflight"
    level: ClassVar[int] = 1
    requires: ClassVar[tuple[str, ...]] = ()
    uses: ClassVar[tuple[str, ...]] = ()

    def run(self, ctx: Context) -> Result:
        try:
            proc_text: str | None = bounded.read_text(PROC_VERSION, 64 << 10, lenient=True)
        except bounded.Unreadable:
            proc_text = None
        nvml = ctx.facts.nvml or facts.read_nvml(ctx.timeout)  # asked once, before the checks (facts.gather)
        if nvml.problem:
            return nvml_probe_verdict(nvml.problem, nvml.step, nvml.stderr_tail, proc_text)
        info, error = nvml.info, nvml.error
        if ctx.manifest is not None and ctx.manifest.driver_min:
            driver_min, source = ctx.manifest.driver_min, f"manifest {ctx.manifest.path}"
        else:
            driver_min, source = CUDA13_DRIVER_MIN, "CUDA 13.0 minimum; no manifest"
        return driver_verdict(info, error, proc_text, driver_min, source)


def nodes_verdict(present: Sequence[str]) -> Result:
    """Device nodes CUDA opens: /dev/nvidiactl, at least one /dev/nvidiaN, /dev/nvidia-uvm."""
    names = set(present)
    gpus = sorted(n for n in names if re.fullmatch(r"nvidia\d+", n))
    data = {"nodes": sorted(names)}
    if "nvidiactl" not in names or not gpus:
        missing = [n for n, ok in (("nvidiactl", "nvidiactl" in names), ("nvidia<N>", bool(gpus))) if not ok]
        return Result(
            "gpu_nodes",
            Status.FAIL,
            f"/dev lacks {', '.join('/dev/' + m for m in missing)}: CUDA cannot open the GPUs",
            remedy=remedies.DEVICE_NODES,
            data=data,
        )
    if "nvidia-uvm" not in names:
        return Result(
            "gpu_nodes",
            Status.WARN,
            "/dev/nvidia-uvm is missing: CUDA initialisation will fail unless it is created",
            details="on a host the first CUDA call creates it through the setuid nvidia-modprobe; in a container "
            "it must be passed in",
            remedy=remedies.UVM_NODE,
            data=data,
        )
    return Result("gpu_nodes", Status.PASS, f"/dev/nvidiactl, /dev/nvidia-uvm and {len(gpus)} GPU node(s)", data=data)


class GpuNodesCheck:
    """The device nodes CUDA needs exist: /dev/nvidiactl, /dev/nvidiaN and /dev/nvidia-uvm."""

    id: ClassVar[str] = "gpu_nodes"
    family: ClassVar[str] = "preflight"
    level: ClassVar[int] = 1
    requires: ClassVar[tuple[str, ...]] = ("driver",)
    uses: ClassVar[tuple[str, ...]] = ()

    def run(self, ctx: Context) -> Result:
        dev = Path("/dev")
        return nodes_verdict([p.name for p in dev.glob("nvidia*")])


def persistence_verdict(gpus: Sequence[nvml_api.Gpu]) -> Result:
    off = [str(g.index) for g in gpus if g.persistence is False]
    unknown = [str(g.index) for g in gpus if g.persistence is None]
    data = {"off": len(off), "unknown": len(unknown)}
    if off:
        return Result(
            "gpu_persistence",
            Status.WARN,
            f"persistence mode is off on GPU {', '.join(off)}",
            details="without it the driver tears GPU state down when the last process exits; every start pays the "
            "initialisation again and a crash can leave GPUs in a slow first-use state",
            remedy=remedies.PERSISTENCE_MODE,
            data=data,
        )
    if unknown:
        return Result(
            "gpu_persistence", Status.PASS, f"persistence mode not reported for GPU {', '.join(unknown)}", data=data
        )
    return Result("gpu_persistence", Status.PASS, f"persistence mode on for all {len(gpus)} GPU(s)", data=data)


class PersistenceCheck:
    """Persistence mode is on for every GPU (faster, steadier process starts)."""

    id: ClassVar[str] = "gpu_persistence"
    family: ClassVar[str] = "preflight"
    level: ClassVar[int] = 1
    requires: ClassVar[tuple[str, ...]] = ("driver",)
    uses: ClassVar[tuple[str, ...]] = ()

    def run(self, ctx: Context) -> Result:
        return persistence_verdict(ctx.facts.gpus or ())  # `driver` passed or warned: NVML listed the GPUs


CHECKS = (DriverCheck, GpuNodesCheck, PersistenceCheck)
