"""The IOMMU's own lines in this boot's kernel log: which unit came up and the default domain type.

Lines picked (drivers/iommu/intel/dmar.c and iommu.c, drivers/iommu/amd/init.c):
    DMAR: IOMMU enabled
    DMAR: Intel(R) Virtualization Technology for Directed I/O
    AMD-Vi: Interrupt remapping enabled
    iommu: Default domain type: Translated
    iommu: Default domain type: Passthrough (set via kernel command line)
The lines come from health/kernel_log's bounded readers: /dev/kmsg, else `journalctl -k -b`, else `dmesg`.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass

MAX_LINES = 200_000
MAX_KEPT = 40  # evidence lines kept
_DOMAIN = re.compile(r"iommu: Default domain type: (?P<type>[A-Za-z]+)")

LogSource = Callable[[], list[str]]  # the lines of a log (tests give their own)


@dataclass(frozen=True)
class IommuLog:
    source: str = ""  # "" when no log was readable
    lines: tuple[str, ...] = ()  # the IOMMU lines kept as evidence
    default_domain: str = ""  # "Translated", "Passthrough", "" (not logged)
    intel: bool = False  # a DMAR line
    amd: bool = False  # an AMD-Vi line
    error: str = ""

    @property
    def kind(self) -> str:
        if self.amd:
            return "AMD-Vi"
        return "Intel VT-d" if self.intel else ""

    def to_json(self) -> dict[str, object]:
        return {
            "source": self.source,
            "lines": list(self.lines),
            "default_domain": self.default_domain,
            "kind": self.kind,
            "error": self.error,
        }


def parse(lines: Iterable[str], source: str = "") -> IommuLog:
    kept: list[str] = []
    domain = ""
    intel = amd = False
    for count, line in enumerate(lines):
        if count >= MAX_LINES:
            break
        if "DMAR:" in line:
            intel = True
        elif "AMD-Vi:" in line:
            amd = True
        elif "iommu: Default domain type" not in line:
            continue
        match = _DOMAIN.search(line)
        if match:
            domain = match.group("type")
        if len(kept) < MAX_KEPT and (
            match or "enabled" in line or "Virtualization Technology" in line or "IO_PAGE_FAULT" in line
        ):
            kept.append(line.strip()[:300])
    return IommuLog(source, tuple(kept), domain, intel, amd)


def read() -> IommuLog:
    """This boot's IOMMU lines from the first readable source; IommuLog.error when none is. They are written at
    boot, so a log larger than the bound keeps its oldest part here (the Xid reader keeps the newest)."""
    from sm120check.doctor.gpu import kernel_log

    log, problems = kernel_log.read_lines(newest=False)
    if log is None:
        return IommuLog(error="kernel log unreadable: " + "; ".join(problems))
    return parse(log.lines, log.source)
