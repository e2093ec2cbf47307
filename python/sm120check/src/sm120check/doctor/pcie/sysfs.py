"""NVIDIA GPUs on the PCI bus, their IOMMU groups and the bridges above them, from sysfs under an injectable root.

- `<root>/sys/bus/pci/devices/<bdf>/{vendor,class}`: NVIDIA is vendor 0x10de; a GPU is class 0x0300xx (VGA) or
  0x0302xx (3D controller); the GPU's HDMI audio function (0x0403xx) is not one.
- The realpath of `<root>/sys/bus/pci/devices/<bdf>` is `.../devices/pci0000:40/0000:40:01.1/0000:41:00.0`: the
  BDFs between the host bridge and the device are its upstream bridges, the first one its root port; the directory
  before them (`pci0000:40`, domain and root bus) is the host bridge, the root complex the GPU sits behind.
- `<bdf>/iommu_group` links to `<root>/sys/kernel/iommu_groups/<n>`, whose `type` is "identity" (passthrough),
  "DMA" or "DMA-FQ" (translated), "blocked" or "unmanaged" (a VFIO user).
- `<root>/sys/class/iommu/*`: `dmar<N>` units are Intel VT-d, `ivhd<N>` AMD-Vi.
Everything is bounded (entries listed, chain depth, file size); a link that leaves the root is not followed.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from sm120check.bounded import Unreadable, read_text

NVIDIA = "0x10de"
GPU_CLASSES = ("0x0300", "0x0302")
MAX_DEVICES = 1 << 16  # PCI functions listed (a big server has a few hundred; only names are read past them)
MAX_DEPTH = 32  # bridges between a device and its host bridge
ATTRIBUTE_BYTES = 64 << 10  # sysfs attributes are one page; /proc/cmdline is at most a few KiB
_BDF = re.compile(r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")
_GROUP = re.compile(r"^[0-9]{1,6}$")
_HOST_BRIDGE = re.compile(r"^pci[0-9a-f]{4,8}:[0-9a-f]{2}$")


def is_bdf(text: str) -> bool:
    return bool(_BDF.match(text))


@dataclass(frozen=True)
class IommuUnit:
    name: str  # dmar0, ivhd0, ...
    kind: str  # "Intel VT-d", "AMD-Vi" or "other"

    def to_json(self) -> dict[str, object]:
        return {"name": self.name, "kind": self.kind}


def unit_kind(name: str) -> str:
    if name.startswith("dmar"):
        return "Intel VT-d"
    if name.startswith("ivhd"):
        return "AMD-Vi"
    return "other"


@dataclass(frozen=True)
class SysGpu:
    """One NVIDIA GPU function as sysfs shows it."""

    bdf: str
    device: str  # "0x2bb1"
    pci_class: str  # "0x030200"
    bridges: tuple[str, ...]  # upstream bridges, nearest first; the last is the root port ("" chain: on a root bus)
    host_bridge: str = ""  # the root complex: "pci0000:40" ("" when the sysfs path names none)
    iommu_group: str = ""  # "" when the device has none
    group_type: str = ""  # the group's type, "" when unreadable or no group
    problem: str = ""  # why part of it could not be read

    def to_json(self) -> dict[str, object]:
        return {
            "bdf": self.bdf,
            "device": self.device,
            "class": self.pci_class,
            "bridges": list(self.bridges),
            "host_bridge": self.host_bridge,
            "iommu_group": self.iommu_group,
            "group_type": self.group_type,
            "problem": self.problem,
        }


@dataclass(frozen=True)
class SysfsView:
    """What sysfs says: `error` when there is no PCI bus to read (no sysfs: a container without /sys)."""

    gpus: tuple[SysGpu, ...] = ()
    units: tuple[IommuUnit, ...] = ()
    error: str = ""
    skipped: tuple[str, ...] = ()  # device entries that could not be read, with the reason

    def to_json(self) -> dict[str, object]:
        return {
            "gpus": [g.to_json() for g in self.gpus],
            "units": [u.to_json() for u in self.units],
            "error": self.error,
            "skipped": list(self.skipped),
        }


def _inside(path: str, root: Path) -> bool:
    base = os.path.realpath(root)
    return path == base or path.startswith(base.rstrip("/") + "/")


def _listdir(path: Path, limit: int = MAX_DEVICES) -> list[str]:
    names: list[str] = []
    with os.scandir(path) as entries:
        for entry in entries:
            names.append(entry.name)
            if len(names) >= limit:
                break
    return sorted(names)


def placement(root: Path, bdf: str) -> tuple[tuple[str, ...], str]:
    """(the upstream bridges of `bdf`, nearest first and its root port last; its host bridge, "" when the path
    names none), from the realpath of its sysfs entry. Raises Unreadable when the entry does not resolve inside
    `root` or is too deep."""
    real = os.path.realpath(root / "sys" / "bus" / "pci" / "devices" / bdf)
    if not _inside(real, root):
        raise Unreadable(f"{bdf}: its sysfs entry leads outside {root}")
    names = Path(real).parts
    parts = [p for p in names if is_bdf(p)]
    if not parts or parts[-1] != bdf:
        raise Unreadable(f"{bdf}: its sysfs path {real} does not end in the device")
    upstream = parts[:-1]
    if len(upstream) > MAX_DEPTH:
        raise Unreadable(f"{bdf}: more than {MAX_DEPTH} bridges above it")
    first = names.index(parts[0])
    host = names[first - 1] if first > 0 and _HOST_BRIDGE.match(names[first - 1]) else ""
    return tuple(reversed(upstream)), host


def bridge_chain(root: Path, bdf: str) -> tuple[str, ...]:
    """The upstream bridges of `bdf`, nearest first (its root port last); see `placement`."""
    return placement(root, bdf)[0]


def _group(root: Path, device: Path) -> tuple[str, str, str]:
    """(group number, its type, problem) of a device ("" group: none)."""
    link = device / "iommu_group"
    if not os.path.lexists(link):
        return "", "", ""
    real = os.path.realpath(link)
    number = Path(real).name
    if not _inside(real, root) or not _GROUP.match(number):
        return "", "", f"iommu_group link to {real} is not an IOMMU group"
    try:
        kind = read_text(root / "sys" / "kernel" / "iommu_groups" / number / "type", ATTRIBUTE_BYTES).strip()
    except Unreadable as exc:
        return number, "", str(exc)
    if len(kind) > 32 or not kind.replace("-", "").isalnum():
        return number, "", f"iommu group {number} type {kind[:32]!r} is not a group type"
    return number, kind, ""


def units(root: Path) -> tuple[IommuUnit, ...]:
    try:
        names = _listdir(root / "sys" / "class" / "iommu", limit=256)
    except OSError:
        return ()
    return tuple(IommuUnit(name, unit_kind(name)) for name in names)


def read(root: Path = Path("/")) -> SysfsView:
    """The NVIDIA GPUs on the bus, their groups and bridges, and the IOMMU units, under `root`."""
    bus = root / "sys" / "bus" / "pci" / "devices"
    try:
        names = _listdir(bus, MAX_DEVICES + 1)
    except OSError as exc:
        return SysfsView(units=units(root), error=f"{bus}: {exc.strerror or exc} (no PCI bus in sysfs: a container?)")
    gpus: list[SysGpu] = []
    skipped: list[str] = []
    if len(names) > MAX_DEVICES:  # said, so a GPU listed past them is not taken for no GPU
        names = names[:MAX_DEVICES]
        skipped.append(f"{bus}: more than {MAX_DEVICES} entries; only {MAX_DEVICES} of them were read")
    for name in names:
        if not is_bdf(name):
            continue
        device = bus / name
        try:
            vendor = read_text(device / "vendor", 64).strip().lower()
            if vendor != NVIDIA:
                continue
            pci_class = read_text(device / "class", 64).strip().lower()
            if not pci_class.startswith(GPU_CLASSES):
                continue
            device_id = read_text(device / "device", 64).strip().lower()
            bridges, host = placement(root, name)
        except Unreadable as exc:
            skipped.append(str(exc))
            continue
        number, kind, problem = _group(root, device)
        gpus.append(SysGpu(name, device_id[:16], pci_class[:16], bridges, host, number, kind, problem))
    return SysfsView(tuple(gpus), units(root), skipped=tuple(skipped))
