"""Parse what nvidia-smi says about GPU-to-GPU paths. The IOMMU mode and ACS control the `topology` check also
judges are not read here: they come from the run's PCIe facts (doctor/pcie/, the one reader and parser, which the
level-1 `iommu` and `pcie_acs` checks read too).

All functions take text (recorded or live) and return frozen values; nothing here runs a command.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

# `nvidia-smi topo -m` link codes, nearest first.
PCIE_LINKS = ("PIX", "PXB", "PHB", "NODE", "SYS")
LINK_MEANING = {
    "PIX": "PCIe, at most one bridge",
    "PXB": "PCIe, several bridges (a PCIe switch)",
    "PHB": "PCIe through a host bridge (the CPU)",
    "NODE": "PCIe across host bridges within a NUMA node",
    "SYS": "PCIe across NUMA nodes (QPI/UPI/Infinity Fabric)",
}
# `nvidia-smi topo -p2p r|w|n|a|p` status codes.
P2P_MEANING = {
    "OK": "supported",
    "CNS": "chipset not supported",
    "GNS": "GPU not supported (the driver disables P2P on this part)",
    "TNS": "topology not supported",
    "NS": "not supported",
    "DR": "disabled by regkey",
    "U": "unknown",
}
_ANSI = re.compile(r"\x1b\[[0-9;]*m|\[[0-9;]*m")
_GPU = re.compile(r"^GPU(\d+)$")
_NVLINK = re.compile(r"^NV(\d+)$")


@dataclass(frozen=True)
class Link:
    code: str  # "NV18", "PHB", ...

    @property
    def nvlink(self) -> int:
        """Number of bonded NVLinks (0 for PCIe)."""
        match = _NVLINK.match(self.code)
        return int(match.group(1)) if match else 0

    @property
    def kind(self) -> str:
        if self.nvlink:
            return "nvlink"
        return "pcie" if self.code in PCIE_LINKS else "unknown"

    @property
    def meaning(self) -> str:
        if self.nvlink:
            return f"NVLink x{self.nvlink}"
        return LINK_MEANING.get(self.code, f"unknown link code {self.code!r}")


@dataclass(frozen=True)
class TopoMatrix:
    """`nvidia-smi topo -m`: the link between every GPU pair, and each GPU's CPU and NUMA affinity."""

    gpus: tuple[int, ...]
    links: Mapping[tuple[int, int], Link]
    cpu_affinity: Mapping[int, str]
    numa_affinity: Mapping[int, str]

    def link(self, a: int, b: int) -> Link:
        return self.links[(a, b)]

    def pairs(self) -> list[tuple[int, int]]:
        return [(a, b) for a in self.gpus for b in self.gpus if a < b]


def _cells(line: str) -> list[str]:
    line = _ANSI.sub("", line).rstrip("\n")
    if "\t" in line:
        return [cell.strip() for cell in line.split("\t")]
    return line.split()  # pasted output whose tabs became spaces: empty cells are lost


def _is_header(line: str) -> bool:
    cells = line.split()
    return cells[:1] == ["GPU0"] and cells[1:2] != ["X"]


def parse_topo_matrix(text: str) -> TopoMatrix:
    """Parse `nvidia-smi topo -m` (tab separated as printed; NIC columns and rows are ignored)."""
    lines = [_ANSI.sub("", raw) for raw in text.splitlines()]
    header_index = next((i for i, line in enumerate(lines) if _is_header(line)), None)
    if header_index is None:
        raise ValueError("no `nvidia-smi topo -m` header (a line starting with GPU0) in the text")
    header = _cells(lines[header_index])
    if header and header[0] == "":
        header = header[1:]
    # Column position (after the row label) -> GPU index; affinity columns by name.
    gpu_columns = {pos: int(m.group(1)) for pos, name in enumerate(header) if (m := _GPU.match(name))}
    cpu_col = header.index("CPU Affinity") if "CPU Affinity" in header else None
    numa_col = header.index("NUMA Affinity") if "NUMA Affinity" in header else None
    links: dict[tuple[int, int], Link] = {}
    cpu: dict[int, str] = {}
    numa: dict[int, str] = {}
    gpus: list[int] = []
    for line in lines[header_index + 1 :]:
        cells = _cells(line)
        cells = cells[1:] if cells and cells[0] == "" else cells
        if not cells or not (row := _GPU.match(cells[0])):
            if cells and cells[0].startswith("Legend"):
                break
            continue
        gpu = int(row.group(1))
        gpus.append(gpu)
        values = cells[1:]
        for pos, peer in gpu_columns.items():
            if pos < len(values) and values[pos] not in ("X", ""):
                links[(gpu, peer)] = Link(values[pos])
        if cpu_col is not None and cpu_col < len(values):
            cpu[gpu] = values[cpu_col]
        if numa_col is not None and numa_col < len(values):
            numa[gpu] = values[numa_col]
    if not gpus:
        raise ValueError("`nvidia-smi topo -m` text has a header but no GPU rows")
    return TopoMatrix(tuple(gpus), links, cpu, numa)


def parse_p2p_matrix(text: str) -> dict[tuple[int, int], str]:
    """Parse `nvidia-smi topo -p2p r` (or w/n/a/p): pair -> status code (OK, CNS, GNS, TNS, NS, DR, U)."""
    lines = [_ANSI.sub("", raw) for raw in text.splitlines()]
    header_index = next((i for i, line in enumerate(lines) if line.split()[:1] == ["GPU0"]), None)
    if header_index is None:
        raise ValueError("no `nvidia-smi topo -p2p` header (a line starting with GPU0) in the text")
    columns = [int(m.group(1)) for name in lines[header_index].split() if (m := _GPU.match(name))]
    status: dict[tuple[int, int], str] = {}
    for line in lines[header_index + 1 :]:
        cells = line.split()
        if not cells or not (row := _GPU.match(cells[0])):
            if cells and cells[0].startswith("Legend"):
                break
            continue
        gpu = int(row.group(1))
        for peer, code in zip(columns, cells[1:], strict=False):
            if code != "X":
                status[(gpu, peer)] = code
    if not status:
        raise ValueError("`nvidia-smi topo -p2p` text has no GPU pairs")
    return status


GEFORCE_P2P = re.compile(r"GeForce", re.IGNORECASE)


def driver_disables_p2p(name: str) -> bool:
    """GeForce parts (RTX 4090, RTX 5090) have P2P disabled by NVIDIA's driver; RTX PRO / data-center parts do not."""
    return bool(GEFORCE_P2P.search(name))
