"""The answer of comm/topology_probe.py: raw evidence about the paths between the GPUs (NVML P2P status per pair,
`nvidia-smi topo -m` and `topo -p2p r` text, the kernel command line, IOMMU group types, ACS control from lspci).
The `topology` check parses the text with sm120check.doctor.comm.topology_parse and judges it."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from sm120check.doctor.collective_payload import texts
from sm120check.doctor.comm.topology_parse import AcsPort
from sm120check.doctor.payload import Fields, PayloadError

PROBE = "topology"


@dataclass(frozen=True)
class CommandText:
    """One command's output: its stdout when it ran (`ok`), else why not."""

    ok: bool
    text: str = ""
    error: str = ""

    def to_json(self) -> dict[str, object]:
        return {"ok": True, "text": self.text} if self.ok else {"ok": False, "error": self.error}

    @classmethod
    def from_json(cls, f: Fields) -> CommandText:
        return cls(True, text=f.text("text")) if f.flag("ok") else cls(False, error=f.text("error"))


@dataclass(frozen=True)
class NvmlDevice:
    index: int
    name: str
    bus_id: str  # NVML's "00000000:18:00.0"

    def to_json(self) -> dict[str, object]:
        return {"index": self.index, "name": self.name, "bus_id": self.bus_id}

    @classmethod
    def from_json(cls, f: Fields) -> NvmlDevice:
        return cls(f.integer("index"), f.text("name"), f.text("bus_id"))


@dataclass(frozen=True)
class NvmlPair:
    """NVML's P2P status of one GPU pair, as the codes `nvidia-smi topo -p2p` prints ("OK", "GNS", ... or
    "error: ..."), and the common ancestor as `topo -m` writes it ("PHB")."""

    pair: tuple[int, int]
    read: str
    write: str
    nvlink: str
    atomics: str
    ancestor: str

    def to_json(self) -> dict[str, object]:
        return {
            "pair": list(self.pair),
            "read": self.read,
            "write": self.write,
            "nvlink": self.nvlink,
            "atomics": self.atomics,
            "ancestor": self.ancestor,
        }

    @classmethod
    def from_json(cls, f: Fields) -> NvmlPair:
        pair = f.integers("pair")
        if len(pair) != 2:
            raise PayloadError(f.probe, f.at("pair"), f"expected [gpu, gpu], got {list(pair)}")
        return cls(
            (pair[0], pair[1]), f.text("read"), f.text("write"), f.text("nvlink"), f.text("atomics"), f.text("ancestor")
        )


@dataclass(frozen=True)
class NvmlEvidence:
    ok: bool
    error: str = ""  # why NVML could not answer
    devices: tuple[NvmlDevice, ...] = ()
    pairs: tuple[NvmlPair, ...] = ()

    def to_json(self) -> dict[str, object]:
        if not self.ok:
            return {"ok": False, "error": self.error}
        return {"ok": True, "devices": [d.to_json() for d in self.devices], "pairs": [p.to_json() for p in self.pairs]}

    @classmethod
    def from_json(cls, f: Fields) -> NvmlEvidence:
        if not f.flag("ok"):
            return cls(False, error=f.text("error"))
        devices = tuple(NvmlDevice.from_json(d) for d in f.objects("devices"))
        return cls(True, devices=devices, pairs=tuple(NvmlPair.from_json(p) for p in f.objects("pairs")))


def _port_json(port: AcsPort) -> dict[str, object]:
    return {"address": port.address, "name": port.name, "redirect": port.redirect, "flags": port.flags}


def _port(f: Fields) -> AcsPort:
    return AcsPort(f.text("address"), f.text("name"), f.flag("redirect"), f.text("flags"))


@dataclass(frozen=True)
class AcsEvidence:
    """ACS control of every PCIe port `lspci -vvv` shows; `readable` False when lspci could not read capabilities
    (not root)."""

    ok: bool
    readable: bool = False
    ports: tuple[AcsPort, ...] = ()
    error: str = ""

    def to_json(self) -> dict[str, object]:
        if not self.ok:
            return {"ok": False, "error": self.error}
        return {"ok": True, "readable": self.readable, "ports": [_port_json(p) for p in self.ports]}

    @classmethod
    def from_json(cls, f: Fields) -> AcsEvidence:
        if not f.flag("ok"):
            return cls(False, error=f.text("error"))
        return cls(True, f.flag("readable"), tuple(_port(p) for p in f.objects("ports")))


@dataclass(frozen=True)
class TopologyEvidence:
    gpus: tuple[int, ...]  # the GPU indices looked at
    nvml: NvmlEvidence
    topo_m: CommandText  # `nvidia-smi topo -m`
    topo_p2p_r: CommandText  # `nvidia-smi topo -p2p r`
    cmdline: str  # /proc/cmdline
    acs: AcsEvidence
    iommu_group_types: Mapping[str, str] = field(default_factory=dict)  # sysfs address -> "identity", "DMA", ...

    def to_json(self) -> dict[str, object]:
        return {
            "gpus": list(self.gpus),
            "nvml": self.nvml.to_json(),
            "topo_m": self.topo_m.to_json(),
            "topo_p2p_r": self.topo_p2p_r.to_json(),
            "cmdline": self.cmdline,
            "iommu_group_types": dict(self.iommu_group_types),
            "acs": self.acs.to_json(),
        }

    @classmethod
    def from_json(cls, data: object) -> TopologyEvidence:
        f = Fields(PROBE, data)
        return cls(
            f.integers("gpus"),
            NvmlEvidence.from_json(f.object("nvml")),
            CommandText.from_json(f.object("topo_m")),
            CommandText.from_json(f.object("topo_p2p_r")),
            f.text("cmdline"),
            AcsEvidence.from_json(f.object("acs")),
            texts(f, "iommu_group_types"),
        )
