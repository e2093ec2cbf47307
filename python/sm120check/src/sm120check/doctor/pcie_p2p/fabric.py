"""The node's PCIe fabric for GPU peer-to-peer, level 1, no GPU work: the `iommu` and `pcie_acs` checks.

NCCL hangs on the first all-reduce of a multi-GPU PCIe box (RTX PRO 6000 Blackwell) when the IOMMU translates the
GPUs' DMA or ACS on a bridge above them redirects peer requests to the root complex, while `nvidia-smi topo -p2p`
says OK (vllm#33041, local-inference-lab/rtx6kpro#15, NVIDIA/nccl#1999, NVIDIA/nccl#2079). Both checks judge one
read of the fabric (`pcie.node.PcieFacts`, a fact of the run) with pure verdict functions; the family is the role
that fixes it, `pcie_p2p`, whose fact file (/var/lib/sm120kit/pcie-p2p.json) says when a reboot is still due.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import partial
from typing import ClassVar

from sm120check.doctor import facts, remedies
from sm120check.doctor.model import Context, Result, Status
from sm120check.doctor.pcie import node, tp_groups
from sm120check.doctor.pcie.lspci import AcsState
from sm120check.doctor.pcie.tp_groups import TpPlan
from sm120check.doctor.probecheck import GEFORCE_NOTE as GEFORCE_NOTE  # the note the tests and the pair checks share
from sm120check.doctor.probecheck import is_geforce as is_geforce

FAMILY = "pcie_p2p"
ONE_GPU = "P2P does not matter with one GPU"
# The kernel prints its built-in default domain type at boot (iommu_subsys_init, a subsys_initcall: "iommu: Print
# default domain type on boot", Joerg Roedel, 2019) whether or not an IOMMU is there: without a unit or a group it
# names no device's translation.
BUILT_IN_DOMAIN = "the kernel's built-in default, logged with or without an IOMMU: no IOMMU unit or group here"


@dataclass(frozen=True)
class GpuRow:
    bdf: str
    name: str
    geforce: bool
    iommu_group: str
    group_type: str
    bridges: tuple[str, ...]
    root_complex: str = ""  # the host bridge above it ("pci0000:40")

    def to_json(self) -> dict[str, object]:
        return {
            "bdf": self.bdf,
            "name": self.name,
            "geforce": self.geforce,
            "iommu_group": self.iommu_group,
            "group_type": self.group_type,
            "bridges": list(self.bridges),
            "root_complex": self.root_complex,
        }


def gpu_rows(pf: node.PcieFacts, nvml_names: Mapping[str, str]) -> tuple[GpuRow, ...]:
    rows = []
    for g in pf.sysfs.gpus:
        name = pf.names.get(g.bdf) or nvml_names.get(g.bdf, "")
        rows.append(GpuRow(g.bdf, name, is_geforce(name), g.iommu_group, g.group_type, g.bridges, g.host_bridge))
    return tuple(rows)


@dataclass(frozen=True)
class IommuData:
    gpus: tuple[GpuRow, ...]
    kind: str  # "Intel VT-d", "AMD-Vi", "" (no IOMMU seen)
    mode: str  # "none", "off", "passthrough", "translated", "unknown"
    cmdline: tuple[str, ...]  # the IOMMU / pci= tokens of /proc/cmdline
    default_domain: str  # the kernel log's "Default domain type"; "" when not logged or no IOMMU is there
    provisioned: bool  # the pcie_p2p fact file exists and is valid
    reboot_pending: tuple[str, ...]  # kernel params the role set that /proc/cmdline still lacks
    p2p_expected: bool  # False: fewer than two GPUs, or GeForce (no P2P with the stock driver)

    def to_json(self) -> dict[str, object]:
        return {
            "gpus": [g.to_json() for g in self.gpus],
            "kind": self.kind,
            "mode": self.mode,
            "cmdline": list(self.cmdline),
            "default_domain": self.default_domain,
            "provisioned": self.provisioned,
            "reboot_pending": list(self.reboot_pending),
            "p2p_expected": self.p2p_expected,
        }


@dataclass(frozen=True)
class AcsData:
    gpus: tuple[GpuRow, ...]
    bridges: tuple[AcsState, ...]
    redirecting: tuple[str, ...]  # bridge BDFs with ReqRedir+ or CmpltRedir+
    noacs: bool  # pci=noacs on the command line
    reboot_pending: tuple[str, ...]
    p2p_expected: bool
    tp_groups: TpPlan  # the CUDA_VISIBLE_DEVICES order per tp size that keeps groups behind one root

    def to_json(self) -> dict[str, object]:
        return {
            "gpus": [g.to_json() for g in self.gpus],
            "bridges": [b.to_json() for b in self.bridges],
            "redirecting": list(self.redirecting),
            "noacs": self.noacs,
            "reboot_pending": list(self.reboot_pending),
            "p2p_expected": self.p2p_expected,
            "tp_groups": self.tp_groups.to_json(),
        }


def pending_params(pf: node.PcieFacts) -> tuple[str, ...]:
    """The kernel params the pcie_p2p role set (its fact says a reboot is due) that this boot's command line lacks."""
    fact = pf.fact.fact
    if fact is None or not fact.reboot_required:
        return ()
    if pf.cmdline is None:
        return fact.kernel_params
    return tuple(p for p in fact.kernel_params if not pf.cmdline.has(p))


def _fact_line(pf: node.PcieFacts) -> str:
    read = pf.fact
    if read.missing:
        return f"{read.path}: absent (not provisioned by pcie_p2p)"
    if read.error:
        return f"fact file unusable: {read.error}"
    fact = read.fact
    assert fact is not None
    return (
        f"{read.path} (written {fact.written_at}): reboot_required {str(fact.reboot_required).lower()}, "
        f"kernel_params {' '.join(fact.kernel_params) or '-'}, changes: {'; '.join(fact.changes) or '-'}"
    )


def _cmdline_line(pf: node.PcieFacts) -> str:
    if pf.cmdline is None:
        return f"/proc/cmdline unreadable: {pf.cmdline_error}"
    return "/proc/cmdline: " + (" ".join(pf.cmdline.relevant) or "no iommu or pci= parameter")


def _kind(pf: node.PcieFacts) -> str:
    kinds = sorted({u.kind for u in pf.sysfs.units if u.kind != "other"})
    if kinds:
        return " + ".join(kinds)
    if pf.log.kind:
        return pf.log.kind
    params = pf.cmdline
    if params is not None and params.amd_iommu:
        return "AMD-Vi"
    if params is not None and params.intel_iommu:
        return "Intel VT-d"
    return ""


def _iommu_seen(pf: node.PcieFacts, gpus: tuple[GpuRow, ...]) -> bool:
    """An IOMMU unit in /sys/class/iommu or a GPU in an IOMMU group: without either, no DMA is translated."""
    return bool(pf.sysfs.units) or any(g.iommu_group for g in gpus)


def _mode(pf: node.PcieFacts, gpus: tuple[GpuRow, ...]) -> str:
    types = {g.group_type for g in gpus if g.group_type}
    if any(t.startswith("DMA") for t in types):
        return "translated"
    if types and all(t == "identity" for t in types):
        return "passthrough"
    if not _iommu_seen(pf, gpus):
        return "off" if pf.cmdline is not None and pf.cmdline.off else "none"
    if pf.cmdline is not None and pf.cmdline.passthrough:
        return "passthrough"
    if pf.log.default_domain == "Passthrough":
        return "passthrough"
    if pf.log.default_domain == "Translated":
        return "translated"
    return "unknown"


def iommu_verdict(pf: node.PcieFacts, nvml_names: Mapping[str, str] | None = None) -> Result:
    """The IOMMU's mode for the GPUs' groups on a multi-GPU node: passthrough or none passes, translated warns."""
    gpus = gpu_rows(pf, nvml_names or {})
    pending = pending_params(pf)
    kind = _kind(pf)
    mode = _mode(pf, gpus)
    params = pf.cmdline.relevant if pf.cmdline is not None else ()
    geforce = any(g.geforce for g in gpus)
    seen = _iommu_seen(pf, gpus)
    data = IommuData(
        gpus,
        kind,
        mode,
        params,
        pf.log.default_domain if seen else "",
        pf.fact.fact is not None,
        pending,
        len(gpus) >= 2 and not geforce,
    )
    groups = [
        f"{g.bdf} ({g.name or 'NVIDIA GPU'}): iommu group {g.iommu_group or '-'} type {g.group_type or '-'}"
        for g in gpus
    ]
    units = ", ".join(f"{u.name} ({u.kind})" for u in pf.sysfs.units) or "none"
    evidence = [
        *groups,
        f"/sys/class/iommu: {units}",
        _cmdline_line(pf),
        *(f"kernel log: {line}" for line in pf.log.lines[:6]),
        *([f"default domain {pf.log.default_domain}: {BUILT_IN_DOMAIN}"] if pf.log.default_domain and not seen else []),
        *([f"kernel log: {pf.log.error}"] if pf.log.error else []),
        _fact_line(pf),
        *pf.sysfs.skipped[:5],
    ]
    verdict = partial(Result, "iommu", details="\n".join(evidence), data=data.to_json())
    return _iommu_result(verdict, pf, gpus, kind, mode, pending, geforce)


def _iommu_result(
    verdict: Callable[..., Result],
    pf: node.PcieFacts,
    gpus: tuple[GpuRow, ...],
    kind: str,
    mode: str,
    pending: tuple[str, ...],
    geforce: bool,
) -> Result:
    named = kind or "the IOMMU"
    if pf.sysfs.error:
        return verdict(Status.SKIP, f"the PCI bus is not readable: {pf.sysfs.error}")
    if not gpus:
        return verdict(Status.SKIP, "no NVIDIA GPU on the PCI bus (sysfs)")
    if len(gpus) < 2:
        return verdict(Status.PASS, f"one NVIDIA GPU ({gpus[0].bdf}): {ONE_GPU}; IOMMU {mode}")
    if pf.fact.error:
        return verdict(
            Status.WARN, "the pcie_p2p fact file is unusable: " + pf.fact.error, remedy=remedies.PCIE_FACT_FILE
        )
    if pending:
        return verdict(
            Status.WARN,
            f"reboot pending: pcie_p2p set {' '.join(pending)}, this boot's /proc/cmdline lacks it; {named} {mode}",
            remedy=remedies.PCIE_REBOOT,
        )
    if geforce:
        return verdict(Status.PASS, f"{GEFORCE_NOTE}; {named} {mode}")
    if mode == "translated":
        types = (
            ", ".join(sorted({g.group_type for g in gpus if g.group_type})) or f"default domain {pf.log.default_domain}"
        )
        return verdict(
            Status.WARN,
            f"{named} translates the {len(gpus)} GPUs' DMA ({types}): PCIe P2P can hang NCCL on the first all-reduce",
            remedy=remedies.IOMMU_PASSTHROUGH,
        )
    if mode == "unknown":
        return verdict(
            Status.WARN,
            f"{named} is on but its mode for the GPUs cannot be read (no group type, no iommu= parameter, not logged)",
            remedy=remedies.IOMMU_PASSTHROUGH,
        )
    if mode == "passthrough":
        return verdict(Status.PASS, f"{named} in passthrough (identity) for the {len(gpus)} GPUs' groups")
    return verdict(Status.PASS, f"no IOMMU translates the {len(gpus)} GPUs' DMA ({mode})")


def acs_verdict(pf: node.PcieFacts, nvml_names: Mapping[str, str] | None = None) -> Result:
    """ACS redirection on any bridge between an NVIDIA GPU and its root port, on a multi-GPU node: warn."""
    gpus = gpu_rows(pf, nvml_names or {})
    bridges = tuple(pf.acs[b] for b in dict.fromkeys(b for g in gpus for b in g.bridges) if b in pf.acs)
    redirecting = tuple(b.bdf for b in bridges if b.redirects)
    noacs = pf.cmdline is not None and pf.cmdline.noacs
    pending = pending_params(pf)
    geforce = any(g.geforce for g in gpus)
    plan = tp_groups.plan(tp_groups.places(pf.sysfs.gpus))
    data = AcsData(gpus, bridges, redirecting, noacs, pending, len(gpus) >= 2 and not geforce, plan)
    lines = [
        f"{g.bdf} ({g.name or 'NVIDIA GPU'}) <- {' <- '.join(g.bridges) or 'no bridge (on a root bus)'}" for g in gpus
    ]
    for b in bridges:
        acs = b.ctl if b.has_acs else "no ACS capability"
        shown = acs if b.readable else f"unreadable ({b.error or 'access denied'})"
        lines.append(f"{b.bdf} {b.name or ''}: ACSCtl {shown}".replace("  ", " "))
    cleared = pf.fact.fact.acs_bridges if pf.fact.fact is not None else ()
    still = [b for b in redirecting if _same_bdf(b, cleared)]
    if still:
        lines.append(
            f"pcie_p2p cleared ACS on {', '.join(still)} (its fact file), yet lspci shows redirection there now"
        )
    lines += [_cmdline_line(pf), _fact_line(pf), *plan.lines]
    verdict = partial(Result, "pcie_acs", details="\n".join(lines), data=data.to_json())
    return _acs_result(verdict, pf, gpus, bridges, redirecting, pending, geforce)


def _same_bdf(bdf: str, listed: tuple[str, ...]) -> bool:
    """`bdf` ("0000:40:01.1") is in `listed`, whose entries may omit the domain ("40:01.1", as setpci takes it)."""
    return any(b.lower() in (bdf, bdf[5:]) for b in listed)


def _acs_result(
    verdict: Callable[..., Result],
    pf: node.PcieFacts,
    gpus: tuple[GpuRow, ...],
    bridges: tuple[AcsState, ...],
    redirecting: tuple[str, ...],
    pending: tuple[str, ...],
    geforce: bool,
) -> Result:
    if pf.sysfs.error:
        return verdict(Status.SKIP, f"the PCI topology is not readable: {pf.sysfs.error}")
    if not gpus:
        return verdict(Status.SKIP, "no NVIDIA GPU on the PCI bus (sysfs)")
    if len(gpus) < 2:
        return verdict(Status.PASS, f"one NVIDIA GPU ({gpus[0].bdf}): {ONE_GPU}")
    if geforce:
        return verdict(Status.PASS, GEFORCE_NOTE)
    if pf.lspci_error:
        return verdict(Status.SKIP, f"cannot read ACS: {pf.lspci_error}", remedy=remedies.LSPCI_MISSING)
    if not any(g.bridges for g in gpus):
        return verdict(
            Status.SKIP,
            "no PCI bridge above the GPUs (a VM or container with a flat bus): ACS is the host's to check",
        )
    unreadable = [b.bdf for b in bridges if not b.readable]
    if redirecting:
        named = ", ".join(f"{b.bdf} ({b.name})" if b.name else b.bdf for b in bridges if b.redirects)
        if pending:
            return verdict(
                Status.WARN,
                f"reboot pending: pcie_p2p set {' '.join(pending)}; ACS still redirects peer traffic on {named}",
                remedy=remedies.PCIE_REBOOT,
            )
        return verdict(
            Status.WARN,
            f"ACS redirects peer requests to the root complex on {len(redirecting)} bridge(s) above the GPUs: {named}",
            remedy=remedies.ACS_REDIRECT,
        )
    if unreadable:
        return verdict(
            Status.SKIP,
            f"ACS control of {len(unreadable)} bridge(s) above the GPUs is unreadable ({', '.join(unreadable)})",
            remedy=remedies.LSPCI_ROOT,
        )
    return verdict(Status.PASS, f"no ACS redirection on the {len(bridges)} bridge(s) above the {len(gpus)} GPUs")


def _nvml_names(ctx: Context) -> dict[str, str]:
    """NVML's GPU names by sysfs BDF, when NVML answered in this run (lspci's pci.ids name comes first)."""
    gpus = ctx.facts.gpus if ctx.facts.nvml_read is not None else None
    out: dict[str, str] = {}
    for gpu in gpus or ():
        domain, _, rest = gpu.bus_id.strip().lower().partition(":")
        out[f"{domain[-4:]}:{rest}"] = gpu.name
    return out


class IommuCheck:
    """The IOMMU is in passthrough or off for the GPUs (translated DMA hangs NCCL P2P on multi-GPU PCIe).

    A pcie_p2p change still waiting for a reboot (its fact file) is said so."""

    id: ClassVar[str] = "iommu"
    family: ClassVar[str] = FAMILY
    level: ClassVar[int] = 1
    requires: ClassVar[tuple[str, ...]] = ()
    uses: ClassVar[tuple[str, ...]] = ()
    needs_pcie: ClassVar[bool] = True  # the run's fabric read (facts.pcie_reader)

    def run(self, ctx: Context) -> Result:
        return iommu_verdict(facts.pcie_of(ctx.facts), _nvml_names(ctx))


class AcsCheck:
    """No bridge above an NVIDIA GPU redirects peer requests (ACS ReqRedir+/CmpltRedir+ hang NCCL P2P).

    Redirection sends P2P up through the root complex and the IOMMU (NVIDIA/nccl#2079). The details also suggest the
    CUDA_VISIBLE_DEVICES order that keeps each tensor-parallel group behind one root complex (tp_groups)."""

    id: ClassVar[str] = "pcie_acs"
    family: ClassVar[str] = FAMILY
    level: ClassVar[int] = 1
    requires: ClassVar[tuple[str, ...]] = ()
    uses: ClassVar[tuple[str, ...]] = ()
    needs_pcie: ClassVar[bool] = True

    def run(self, ctx: Context) -> Result:
        return acs_verdict(facts.pcie_of(ctx.facts), _nvml_names(ctx))


CHECKS = (IommuCheck, AcsCheck)
