"""The NVIDIA driver through NVML: loaded, new enough, which kernel module, device nodes, persistence."""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from typing import ClassVar

from sm120check.doctor import nvml_api, remedies, versions
from sm120check.doctor.model import Context, Result, Status

CUDA13_DRIVER_MIN = "580.65.06"  # CUDA 13.0's minimum Linux driver
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
            remedy="a driver/library version mismatch: reboot after a driver upgrade, or in a container start it with "
            "the NVIDIA container toolkit (--gpus / --device nvidia.com/gpu=all) so libnvidia-ml.so.1 is injected",
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
            remedy="check `nvidia-smi`; in a container pass the GPUs (--gpus all)",
            data=data,
        )
    blackwell = [g for g in info.gpus if g.cc[0] >= 10]
    if blackwell and flavour == "proprietary":
        return Result(
            "driver",
            Status.WARN,
            f"proprietary kernel module with Blackwell GPUs: {summary}",
            details=details,
            remedy="Blackwell GPUs need the open kernel modules: " + remedies.DRIVER,
            data=data,
        )
    return Result("driver", Status.PASS, summary, details=details, data=data)


class DriverCheck:
    """The NVIDIA driver is loaded, >= the manifest's driver_min; NVML lists the GPUs and compute capabilities."""

    id: ClassVar[str] = "driver"
    family: ClassVar[str] = "driver"
    level: ClassVar[int] = 1
    requires: ClassVar[tuple[str, ...]] = ()

    def run(self, ctx: Context) -> Result:
        try:
            proc_text: str | None = PROC_VERSION.read_text(encoding="utf-8", errors="replace")
        except OSError:
            proc_text = None
        info, error = None, ""
        try:
            info = nvml_api.read()
        except nvml_api.NvmlUnavailable as exc:
            error = str(exc)
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
            remedy="load the driver (`nvidia-modprobe`), or in a container pass the devices (--gpus all)",
            data=data,
        )
    if "nvidia-uvm" not in names:
        return Result(
            "gpu_nodes",
            Status.WARN,
            "/dev/nvidia-uvm is missing: CUDA initialisation will fail unless it is created",
            details="on a host the first CUDA call creates it through the setuid nvidia-modprobe; in a container "
            "it must be passed in",
            remedy="`nvidia-modprobe -u -c=0` on the host; in a container add --device /dev/nvidia-uvm",
            data=data,
        )
    return Result("gpu_nodes", Status.PASS, f"/dev/nvidiactl, /dev/nvidia-uvm and {len(gpus)} GPU node(s)", data=data)


class GpuNodesCheck:
    """The device nodes CUDA needs exist: /dev/nvidiactl, /dev/nvidiaN and /dev/nvidia-uvm."""

    id: ClassVar[str] = "gpu_nodes"
    family: ClassVar[str] = "driver"
    level: ClassVar[int] = 1
    requires: ClassVar[tuple[str, ...]] = ("driver",)

    def run(self, ctx: Context) -> Result:
        dev = Path("/dev")
        return nodes_verdict([p.name for p in dev.glob("nvidia*")])


def persistence_verdict(gpus: Sequence[dict[str, object]]) -> Result:
    off = [str(g["index"]) for g in gpus if g.get("persistence") is False]
    unknown = [str(g["index"]) for g in gpus if g.get("persistence") is None]
    data = {"off": len(off), "unknown": len(unknown)}
    if off:
        return Result(
            "gpu_persistence",
            Status.WARN,
            f"persistence mode is off on GPU {', '.join(off)}",
            details="without it the driver tears GPU state down when the last process exits; every start pays the "
            "initialisation again and a crash can leave GPUs in a slow first-use state",
            remedy="`nvidia-smi -pm 1` (or enable the nvidia-persistenced service)",
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
    family: ClassVar[str] = "driver"
    level: ClassVar[int] = 1
    requires: ClassVar[tuple[str, ...]] = ("driver",)

    def run(self, ctx: Context) -> Result:
        gpus = ctx.results["driver"].data.get("gpus", [])
        return persistence_verdict(gpus if isinstance(gpus, list) else [])


CHECKS = (DriverCheck, GpuNodesCheck, PersistenceCheck)
