"""The kernel command line's IOMMU and ACS parameters (/proc/cmdline).

Parameters (Documentation/admin-guide/kernel-parameters.txt): `iommu=pt|off|force|...`, `intel_iommu=on|off[,...]`,
`amd_iommu=on|off|pt[,...]`, `iommu.passthrough=0|1`, `pci=...,noacs,...` (comma lists). The last occurrence wins,
as the kernel parses them in order.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

MAX_TOKENS = 4096  # a real command line has tens


@dataclass(frozen=True)
class KernelParams:
    raw: str  # the command line as read (stripped)
    iommu: str = ""  # the last iommu= value
    intel_iommu: str = ""  # first item of the last intel_iommu= list
    amd_iommu: str = ""  # first item of the last amd_iommu= list
    iommu_passthrough: str = ""  # iommu.passthrough=
    pci: tuple[str, ...] = ()  # every pci= option, in order

    @property
    def passthrough(self) -> bool:
        """The command line asks for identity (passthrough) domains."""
        return self.iommu == "pt" or self.iommu_passthrough == "1" or self.amd_iommu == "pt"

    @property
    def off(self) -> bool:
        """The command line turns the IOMMU off."""
        return "off" in (self.iommu, self.intel_iommu, self.amd_iommu)

    @property
    def noacs(self) -> bool:
        return "noacs" in self.pci

    @property
    def tokens(self) -> tuple[str, ...]:
        return tuple(self.raw.split()[:MAX_TOKENS])

    @property
    def relevant(self) -> tuple[str, ...]:
        """The tokens that bear on P2P: every iommu-ish parameter and pci=."""
        return tuple(t for t in self.tokens if "iommu" in t.split("=", 1)[0] or t.startswith("pci="))

    def has(self, param: str) -> bool:
        """`param` ("iommu=pt", "pci=noacs") is on the command line (pci= options matched one by one)."""
        if param.startswith("pci=") and "," not in param:
            return param[len("pci=") :] in self.pci
        return param in self.tokens

    def to_json(self) -> dict[str, object]:
        return {
            "raw": self.raw,
            "iommu": self.iommu,
            "intel_iommu": self.intel_iommu,
            "amd_iommu": self.amd_iommu,
            "iommu_passthrough": self.iommu_passthrough,
            "pci": list(self.pci),
            "relevant": list(self.relevant),
        }


def parse(text: str) -> KernelParams:
    """/proc/cmdline text -> its IOMMU and ACS parameters (unknown tokens ignored, never an error)."""
    raw = " ".join(text.split()[:MAX_TOKENS])
    values: dict[str, str] = {}
    pci: list[str] = []
    for token in raw.split():
        key, sep, value = token.partition("=")
        if not sep:
            continue
        if key == "pci":
            pci.extend(v for v in value.split(",") if v)
        elif key in ("iommu", "iommu.passthrough"):
            values[key] = value
        elif key in ("intel_iommu", "amd_iommu"):
            values[key] = value.split(",", 1)[0]
    return KernelParams(
        raw,
        values.get("iommu", ""),
        values.get("intel_iommu", ""),
        values.get("amd_iommu", ""),
        values.get("iommu.passthrough", ""),
        tuple(pci),
    )


@dataclass(frozen=True)
class IommuMode:
    """How the IOMMU treats DMA between devices, from sysfs and the kernel command line."""

    mode: str  # "off", "passthrough", "translated", "unknown"
    evidence: str

    @property
    def blocks_p2p(self) -> bool:
        """A translating IOMMU redirects peer-to-peer DMA through the root complex: NCCL can hang."""
        return self.mode == "translated"


def iommu_mode(text: str, group_types: Sequence[str] = ()) -> IommuMode:
    """The IOMMU mode from /proc/cmdline `text` and the GPUs' /sys/bus/pci/devices/<bdf>/iommu_group/type values
    ("identity" = passthrough, "DMA" / "DMA-FQ" = translated): the group types are the truth when present, the
    command line's parameters (`parse`) the evidence otherwise."""
    types = sorted(set(group_types))
    if types:
        translated = [t for t in types if t.startswith("DMA")]
        if translated:
            return IommuMode("translated", f"GPU IOMMU group type {', '.join(types)}")
        if all(t == "identity" for t in types):
            return IommuMode("passthrough", "GPU IOMMU group type identity")
    params = parse(text)
    shown = " ".join(t for t in params.relevant if not t.startswith("pci="))
    if params.passthrough:
        return IommuMode("passthrough", shown)
    if params.off:
        return IommuMode("off", shown)
    if "on" in (params.intel_iommu, params.amd_iommu) or params.iommu == "force":
        return IommuMode("translated", shown)
    return IommuMode("unknown", shown or "no iommu parameter on the kernel command line")
