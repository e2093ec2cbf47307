"""Each GPU's root port, from the sysfs bridge chain (pcie/sysfs.py), keyed by NVML index: the level-3 pair checks
name the root ports above a slow or collapsed pair."""

from __future__ import annotations

from collections.abc import Mapping

from sm120check.doctor.pcie.sysfs import SysfsView


def sysfs_bdf(nvml_bus: str) -> str:
    """NVML's "00000000:3B:00.0" as sysfs writes it, "0000:3b:00.0" (already short: unchanged but lower case)."""
    domain, _, rest = nvml_bus.strip().lower().partition(":")
    return f"{domain[-4:]}:{rest}" if rest else ""


def root_ports(view: SysfsView, buses: Mapping[int, str]) -> dict[int, str]:
    """NVML index -> the BDF of the root port above that GPU (the last bridge of its chain); a GPU sysfs does not
    list, or one on a root bus (no bridge: a VM), is left out."""
    chains = {gpu.bdf: gpu.bridges for gpu in view.gpus}
    found: dict[int, str] = {}
    for index, bus in buses.items():
        bridges = chains.get(sysfs_bdf(bus), ())
        if bridges:
            found[index] = bridges[-1]
    return found
