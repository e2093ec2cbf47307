"""Fixture PCIe fabrics for the `iommu` and `pcie_acs` tests: sysfs trees in tmp_path and an lspci stand-in.

The trees are built here (no public thread gives a whole sysfs tree or a whole `lspci -vvv -s` device block); the
ACSCtl lines and bridge names put into them are the recorded fragments of tests/fixtures/pcie (README there).
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from sm120check.doctor.pcie import lspci, node

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "pcie"
RTX_PRO = "3D controller: NVIDIA Corporation GB202GL [RTX PRO 6000 Blackwell Server Edition] (rev a1)"
GEFORCE = "VGA compatible controller: NVIDIA Corporation GB202 [GeForce RTX 5090] (rev a1)"
AMD_GPP = "PCI bridge: Advanced Micro Devices, Inc. [AMD] Starship/Matisse GPP Bridge"
INTEL_RP = "PCI bridge: Intel Corporation Device 352a (rev 04)"


def recorded(name: str) -> list[str]:
    return (FIXTURES / name).read_text(encoding="utf-8").splitlines()


def acsctl(name: str, index: int) -> str:
    """Line `index` of a recorded ACSCtl fragment (tests/fixtures/pcie/`name`)."""
    return recorded(name)[index]


PLX = recorded("nccl-19-lspci-grep-plx.txt")[0].partition(" ")[2]  # PEX 8747 switch port, as lspci names it
ACS_ON = acsctl("nccl-304-plx-acsctl-broken-then-working.txt", 0)  # ReqRedir+ CmpltRedir+
ACS_OFF = acsctl("nccl-304-plx-acsctl-broken-then-working.txt", 1)


def device_block(bdf: str, name: str, ctl: str | None, denied: bool = False) -> str:
    """An `lspci -vvv -s` block built around a recorded ACSCtl line (None: a bridge without ACS)."""
    short = bdf[5:] if bdf.startswith("0000:") else bdf
    lines = [f"{short} {name}", "\tControl: I/O+ Mem+ BusMaster+ SpecCycle- MemWINV- VGASnoop- ParErr- Stepping-"]
    if denied:
        lines.append("\tCapabilities: <access denied>")
    elif ctl is not None:
        lines += [
            "\tCapabilities: [2a0 v1] Access Control Services",
            "\t\tACSCap:\tSrcValid+ TransBlk+ ReqRedir+ CmpltRedir+ UpstreamFwd+ EgressCtrl- DirectTrans-",
            "\t\t" + ctl.strip(),
        ]
    lines.append("\tKernel driver in use: pcieport")
    return "\n".join(lines) + "\n"


@dataclass
class FakeLspci:
    """`lspci -s BDF` and `lspci -vvv -s BDF` from a table; `missing`: lspci not installed."""

    names: dict[str, str] = field(default_factory=dict)
    ctl: dict[str, str | None] = field(default_factory=dict)
    denied: bool = False
    missing: bool = False
    calls: list[list[str]] = field(default_factory=list)

    def __call__(self, args: Sequence[str]) -> lspci.CommandText:
        self.calls.append(list(args))
        if self.missing:
            return lspci.CommandText(False, error="lspci not found (install pciutils)")
        bdf = args[-1]
        name = self.names.get(bdf, "")
        if not name:
            return lspci.CommandText(True, "")
        if args[0] == "-vvv":
            return lspci.CommandText(True, device_block(bdf, name, self.ctl.get(bdf), self.denied))
        short = bdf[5:] if bdf.startswith("0000:") else bdf
        return lspci.CommandText(True, f"{short} {name}\n")


@dataclass
class Tree:
    root: Path

    def device(
        self,
        path: Sequence[str],
        vendor: str = "0x10de",
        pci_class: str = "0x030200",
        device: str = "0x2bb5",
        group: str = "",
        group_type: str = "",
    ) -> str:
        """A PCI function at sys/devices/<path...> (host bridge first, the function last), linked from
        sys/bus/pci/devices; its IOMMU group when `group`."""
        directory = self.root / "sys" / "devices" / Path(*path)
        directory.mkdir(parents=True, exist_ok=True)
        (directory / "vendor").write_text(vendor + "\n")
        (directory / "class").write_text(pci_class + "\n")
        (directory / "device").write_text(device + "\n")
        bus = self.root / "sys" / "bus" / "pci" / "devices"
        bus.mkdir(parents=True, exist_ok=True)
        link = bus / path[-1]
        if not link.is_symlink():
            link.symlink_to(os.path.relpath(directory, bus))
        if group:
            groups = self.root / "sys" / "kernel" / "iommu_groups" / group
            (groups / "devices").mkdir(parents=True, exist_ok=True)
            if group_type:
                (groups / "type").write_text(group_type + "\n")
            (directory / "iommu_group").symlink_to(os.path.relpath(groups, directory))
        return path[-1]

    def bridge(self, path: Sequence[str], vendor: str = "0x1022") -> str:
        return self.device(path, vendor=vendor, pci_class="0x060400", device="0x1483")

    def units(self, *names: str) -> None:
        for name in names:
            (self.root / "sys" / "class" / "iommu" / name).mkdir(parents=True, exist_ok=True)

    def cmdline(self, text: str) -> None:
        (self.root / "proc").mkdir(parents=True, exist_ok=True)
        (self.root / "proc" / "cmdline").write_text(text + "\n")

    def fact(self, reboot: bool, params: Sequence[str], bridges: Sequence[str] = ()) -> Path:
        path = self.root / "var" / "lib" / "sm120kit" / "pcie-p2p.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(
            json.dumps(
                {
                    "schema": 1,
                    "reboot_required": reboot,
                    "changes": [f"kernel command line: added {' '.join(params)}"] if params else [],
                    "kernel_params": list(params),
                    "acs_bridges": list(bridges),
                    "written_at": "2026-12-01T22:00:00Z",
                }
            )
        )
        return path

    def read(self, runner: FakeLspci, log: Sequence[str] = (), fact: Path | None = None) -> node.PcieFacts:
        fact_path = fact if fact is not None else self.root / "var" / "lib" / "sm120kit" / "pcie-p2p.json"
        return node.read(self.root, runner, lambda: list(log), fact_path)


def amd_root_ports(root: Path, group_type: str = "DMA-FQ", ctl: str = "") -> tuple[Tree, FakeLspci]:
    """NVIDIA/nccl#2079's shape: two GPUs (41:00.0, 61:00.0), each straight under an AMD GPP root port with ACS,
    AMD-Vi on (ivhd0), the GPUs' groups of `group_type`; ACSCtl from NVIDIA/nccl#523's first (redirecting) line."""
    tree = Tree(root)
    tree.units("ivhd0")
    tree.cmdline("BOOT_IMAGE=/boot/vmlinuz-6.8.0-60-generic root=/dev/nvme0n1p2 ro quiet splash")
    fake = FakeLspci()
    line = ctl or acsctl("nccl-523-acsctl-grep.txt", 0)
    for n, (rp, gpu) in enumerate((("0000:40:01.1", "0000:41:00.0"), ("0000:60:01.1", "0000:61:00.0"))):
        host = f"pci0000:{rp[5:7]}"
        tree.bridge([host, rp])
        tree.device([host, rp, gpu], group=str(30 + n), group_type=group_type)
        fake.names[rp], fake.ctl[rp], fake.names[gpu] = AMD_GPP, line, RTX_PRO
    return tree, fake


def plx_switch(root: Path, downstream_ctl: str, group_type: str = "identity") -> tuple[Tree, FakeLspci]:
    """A PEX 8747 switch (NVIDIA/nccl#19's part names) between an Intel root port and two GPUs; VT-d (dmar0)."""
    tree = Tree(root)
    tree.units("dmar0", "dmar1")
    tree.cmdline("BOOT_IMAGE=/vmlinuz root=UUID=0 ro intel_iommu=on iommu=pt")
    fake = FakeLspci()
    rp, up = "0000:00:03.0", "0000:03:00.0"
    tree.bridge(["pci0000:00", rp], vendor="0x8086")
    tree.bridge(["pci0000:00", rp, up], vendor="0x10b5")
    fake.names[rp], fake.ctl[rp] = INTEL_RP, ACS_OFF
    fake.names[up], fake.ctl[up] = PLX, None  # a switch's upstream port has no ACS capability
    for n, (down, gpu) in enumerate((("0000:04:08.0", "0000:05:00.0"), ("0000:04:10.0", "0000:06:00.0"))):
        tree.bridge(["pci0000:00", rp, up, down], vendor="0x10b5")
        tree.device(["pci0000:00", rp, up, down, gpu], group=str(40 + n), group_type=group_type)
        fake.names[down], fake.ctl[down], fake.names[gpu] = PLX, downstream_ctl, RTX_PRO
    return tree, fake


def root_complexes(root: Path, layout: dict[str, int]) -> tuple[Tree, FakeLspci]:
    """GPUs behind root complexes, {host bridge bus "00": GPU count}: each GPU under its own root port
    (0000:BB:0N.0) on bus BB+N+1, a switchless server's shape (built, not recorded: no thread gave such a tree);
    IOMMU passthrough, ACS off (NVIDIA/nccl#304's "working" line)."""
    tree = Tree(root)
    tree.cmdline("BOOT_IMAGE=/vmlinuz ro iommu=pt")
    fake = FakeLspci()
    for bus, count in layout.items():
        host = f"pci0000:{bus}"
        for n in range(count):
            port = f"0000:{bus}:{n + 1:02x}.0"
            gpu = f"0000:{int(bus, 16) + n + 1:02x}:00.0"
            tree.bridge([host, port])
            tree.device([host, port, gpu], group=str(int(bus, 16) + n), group_type="identity")
            fake.names[port], fake.ctl[port], fake.names[gpu] = "PCI bridge: root port", ACS_OFF, RTX_PRO
    return tree, fake
