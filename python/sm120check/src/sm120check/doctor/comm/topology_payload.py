"""The answer of comm/topology_probe.py: raw evidence about the paths between the GPUs that needs NVML or the GPU
(NVML P2P status per pair, `nvidia-smi topo -m` and `topo -p2p r` text). The `topology` check parses the text with
sm120check.doctor.comm.topology_parse and judges it with the run's PCIe facts (IOMMU mode and group types, ACS on
the bridges above the GPUs: doctor/pcie/node.py, read once by the facts step)."""

from __future__ import annotations

from dataclasses import dataclass

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


@dataclass(frozen=True)
class TopologyEvidence:
    gpus: tuple[int, ...]  # the GPU indices looked at
    nvml: NvmlEvidence
    topo_m: CommandText  # `nvidia-smi topo -m`
    topo_p2p_r: CommandText  # `nvidia-smi topo -p2p r`

    def to_json(self) -> dict[str, object]:
        return {
            "gpus": list(self.gpus),
            "nvml": self.nvml.to_json(),
            "topo_m": self.topo_m.to_json(),
            "topo_p2p_r": self.topo_p2p_r.to_json(),
        }

    @classmethod
    def from_json(cls, data: object) -> TopologyEvidence:
        f = Fields(PROBE, data)
        return cls(
            f.integers("gpus"),
            NvmlEvidence.from_json(f.object("nvml")),
            CommandText.from_json(f.object("topo_m")),
            CommandText.from_json(f.object("topo_p2p_r")),
        )
