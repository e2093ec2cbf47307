"""One bridge's ACS capability and control, and one device's name, from `lspci -vvv -s <bdf>` (pciutils).

Lines read (lspci's ls-ecaps.c prints them under "Capabilities: [...] Access Control Services"):
    ACSCap: SrcValid+ TransBlk+ ReqRedir+ CmpltRedir+ UpstreamFwd+ EgressCtrl- DirectTrans-
    ACSCtl: SrcValid+ TransBlk- ReqRedir+ CmpltRedir+ UpstreamFwd+ EgressCtrl- DirectTrans-
ReqRedir+ / CmpltRedir+ in ACSCtl send peer requests and completions up to the root complex (and through the
IOMMU), which is what makes NCCL hang on the first all-reduce on PCIe boxes (NVIDIA/nccl#2079). Without root,
lspci prints "Capabilities: <access denied>" and no ACS lines.

The command is injectable (`Runner`): tests give recorded text; the doctor runs lspci in its own process group,
bounded by a timeout and stopped once it has written MAX_OUTPUT bytes (those are kept).
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from sm120check.doctor import child

TIMEOUT = 5.0  # one device's config space: lspci answers in milliseconds
MAX_OUTPUT = 256 << 10


@dataclass(frozen=True)
class CommandText:
    """A command's output, or why there is none."""

    ok: bool
    text: str = ""
    error: str = ""


Runner = Callable[[Sequence[str]], CommandText]


def run_lspci(args: Sequence[str]) -> CommandText:
    """`lspci *args`, bounded: not installed, timed out and a non-zero exit are errors, never exceptions."""
    binary = shutil.which("lspci") or next(
        (p for p in ("/usr/bin/lspci", "/usr/sbin/lspci", "/sbin/lspci") if shutil.which(p)), None
    )
    if binary is None:
        return CommandText(False, error="lspci not found (install pciutils)")
    done = child.run_command([binary, *args], timeout=TIMEOUT, limit=MAX_OUTPUT)  # stopped once it wrote that
    if done.cut:
        return CommandText(True, done.stdout)
    if done.timed_out:
        return CommandText(False, error=f"lspci {' '.join(args)} did not answer within {TIMEOUT:.0f} s")
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip()[-300:]
        return CommandText(False, error=f"lspci {' '.join(args)} exited {done.returncode}: {tail or 'no output'}")
    return CommandText(True, done.stdout)


@dataclass(frozen=True)
class AcsState:
    """ACS of one device as lspci showed it."""

    bdf: str
    name: str = ""  # lspci's description: "PCI bridge: PLX Technology, Inc. PEX 8747 ... (rev ca)"
    readable: bool = True  # False: "<access denied>" (not root)
    cap: str = ""  # the ACSCap flags, "" when the device has no ACS capability
    ctl: str = ""  # the ACSCtl flags
    error: str = ""  # lspci failed for this device

    @property
    def has_acs(self) -> bool:
        return bool(self.ctl or self.cap)

    @property
    def req_redir(self) -> bool:
        return "ReqRedir+" in self.ctl.split()

    @property
    def cmplt_redir(self) -> bool:
        return "CmpltRedir+" in self.ctl.split()

    @property
    def redirects(self) -> bool:
        return self.req_redir or self.cmplt_redir

    def to_json(self) -> dict[str, object]:
        return {
            "bdf": self.bdf,
            "name": self.name,
            "readable": self.readable,
            "acs_cap": self.cap,
            "acs_ctl": self.ctl,
            "redirect": self.redirects,
            "error": self.error,
        }


def _flags(text: str) -> str:
    """ "SrcValid+ TransBlk- ..." with tabs and odd spacing normalized; only flag-shaped words kept."""
    words = [w for w in text.replace("\t", " ").split() if w[-1:] in "+-" and w[:-1].isalpha() and len(w) <= 24]
    return " ".join(words[:16])


def parse_device(bdf: str, text: str) -> AcsState:
    """`lspci -vvv -s <bdf>` text -> that device's ACS state (the first device block only)."""
    name = ""
    cap = ctl = ""
    denied = False
    seen_header = False
    for line in text.splitlines()[:5000]:
        if line and not line[0].isspace():
            if seen_header:
                break  # a second device: -s matched more than one
            seen_header = True
            _, _, name = line.partition(" ")
            continue
        stripped = line.strip()
        if "<access denied>" in stripped:
            denied = True
        elif stripped.startswith("ACSCap:"):
            cap = _flags(stripped[len("ACSCap:") :])
        elif stripped.startswith("ACSCtl:"):
            ctl = _flags(stripped[len("ACSCtl:") :])
    return AcsState(bdf, name.strip()[:200], not denied, cap, ctl)


def parse_all(text: str) -> tuple[list[AcsState], bool]:
    """Whole `lspci -vvv` text -> the ACS state of every device with an ACS control, and whether the capabilities
    were readable (no "<access denied>")."""
    blocks: list[list[str]] = []
    for line in text.splitlines():
        if line and not line[0].isspace() and not line.startswith(">"):
            blocks.append([line])
        elif blocks:
            blocks[-1].append("\t" + line.lstrip(">") if line.startswith(">") else line)
    states = [parse_device(block[0].partition(" ")[0], "\n".join(block)) for block in blocks]
    return [s for s in states if s.ctl], "<access denied>" not in text


def acs_of(bdf: str, runner: Runner = run_lspci) -> AcsState:
    out = runner(["-vvv", "-s", bdf])
    if not out.ok:
        return AcsState(bdf, readable=False, error=out.error)
    return parse_device(bdf, out.text)


def name_of(bdf: str, runner: Runner = run_lspci) -> str:
    """lspci's one-line description of a device ("" when lspci cannot say)."""
    out = runner(["-s", bdf])
    if not out.ok:
        return ""
    first = next(iter(out.text.splitlines()), "")
    return first.partition(" ")[2].strip()[:200]
