"""The node's PCIe fabric, read once per run (a fact of the run, `NodeFacts.pcie`): what the `iommu` and `pcie_acs`
checks judge, where the `topology` check finds the IOMMU mode and ACS, and the root ports the peer checks name.

`read(root, lspci, log, fact_path)`: the sysfs root, the lspci runner, the kernel-log source and the fact file are
all injectable, so tests read fixture trees and recorded output. Names: lspci's description of each GPU (pci.ids);
the check falls back to NVML's name when NVML answered.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from sm120check.bounded import Unreadable, read_text
from sm120check.doctor.pcie import cmdline, fact_file, kernel_log, lspci, sysfs


@dataclass(frozen=True)
class PcieFacts:
    sysfs: sysfs.SysfsView
    cmdline: cmdline.KernelParams | None  # None: /proc/cmdline unreadable (cmdline_error says why)
    log: kernel_log.IommuLog
    fact: fact_file.FactRead
    names: dict[str, str] = field(default_factory=dict)  # GPU bdf -> lspci's description
    acs: dict[str, lspci.AcsState] = field(default_factory=dict)  # bridge bdf -> its ACS (every bridge above a GPU)
    lspci_error: str = ""  # lspci could not run at all (not installed)
    cmdline_error: str = ""

    def to_json(self) -> dict[str, object]:
        return {
            "sysfs": self.sysfs.to_json(),
            "cmdline": self.cmdline.to_json() if self.cmdline else None,
            "cmdline_error": self.cmdline_error,
            "log": self.log.to_json(),
            "fact": self.fact.to_json(),
            "names": dict(self.names),
            "acs": {k: v.to_json() for k, v in self.acs.items()},
            "lspci_error": self.lspci_error,
        }


def unreadable(why: str, fact_path: Path = fact_file.DEFAULT_PATH) -> PcieFacts:
    """The facts of a read that failed as a whole (`why`): no bus, no command line, no log; the judges say so."""
    return PcieFacts(
        sysfs.SysfsView(error=why),
        None,
        kernel_log.IommuLog(error=why),
        fact_file.FactRead(str(fact_path), error=why),
        cmdline_error=why,
    )


def read(
    root: Path = Path("/"),
    runner: lspci.Runner = lspci.run_lspci,
    log: kernel_log.LogSource | None = None,
    fact_path: Path = fact_file.DEFAULT_PATH,
) -> PcieFacts:
    """Read the node's PCIe facts under `root` (the doctor: "/"); `log` None reads this boot's kernel log."""
    view = sysfs.read(root)
    try:
        params: cmdline.KernelParams | None = cmdline.parse(read_text(root / "proc" / "cmdline", sysfs.ATTRIBUTE_BYTES))
        cmdline_error = ""
    except Unreadable as exc:
        params, cmdline_error = None, str(exc)
    if log is None:
        iommu_log = kernel_log.read()
    else:
        try:
            iommu_log = kernel_log.parse(log(), "given")
        except OSError as exc:
            iommu_log = kernel_log.IommuLog(error=f"kernel log unreadable: {exc}")
    names: dict[str, str] = {}
    acs: dict[str, lspci.AcsState] = {}
    lspci_error = ""
    if view.gpus:
        probe = runner(["-s", view.gpus[0].bdf])
        if not probe.ok and "not found" in probe.error:
            lspci_error = probe.error
        else:
            for gpu in view.gpus:
                names[gpu.bdf] = lspci.name_of(gpu.bdf, runner)
                for bridge in gpu.bridges:
                    if bridge not in acs:
                        acs[bridge] = lspci.acs_of(bridge, runner)
    return PcieFacts(view, params, iommu_log, fact_file.read(fact_path), names, acs, lspci_error, cmdline_error)
