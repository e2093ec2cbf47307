"""One scan of an SGLang tree for one compute capability: the facts, the findings, and how to show them."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from sm120check.sglang import eagle, fusion, symm_mem
from sm120check.sglang.tree import FLASHINFER_MIN_FOR_SM120, ComputeCapability, SourceTree, parse_version


@dataclass(frozen=True)
class Finding:
    id: str
    ok: bool
    patchable: bool  # `sm120check sglang patch` would fix it (only meaningful when not ok)
    summary: str
    path: str = ""


@dataclass(frozen=True)
class ScanReport:
    source: str
    version: str
    cc: ComputeCapability
    flashinfer: str | None
    flashinfer_origin: str
    symm: symm_mem.SymmMemScan
    gates: tuple[fusion.FusionGate, ...]
    eagle: eagle.EagleScan
    findings: tuple[Finding, ...]

    @property
    def needs_patch(self) -> bool:
        return any(not f.ok and f.patchable for f in self.findings)

    @property
    def blocked(self) -> tuple[Finding, ...]:
        return tuple(f for f in self.findings if not f.ok and not f.patchable)

    def to_dict(self) -> dict[str, object]:
        return {
            "source": self.source,
            "sglang_version": self.version,
            "cc": str(self.cc),
            "cc_origin": self.cc.origin,
            "flashinfer": {"version": self.flashinfer, "origin": self.flashinfer_origin},
            "needs_patch": self.needs_patch,
            "capability_maps": [asdict(m) for m in self.symm.maps],
            "communicator": {
                "class": self.symm.communicator,
                "path": self.symm.communicator_path,
                "multimem_lookup_tolerant": self.symm.multimem_lookup_tolerant,
                "multicast_early_return": self.symm.multicast_early_return,
                "multicast_relaxed": self.symm.multicast_relaxed,
            },
            "fusion_gates": [asdict(g) for g in self.gates],
            "eagle3": {
                "contract": [asdict(c) for c in self.eagle.contract],
                "sources": list(self.eagle.sources),
                "models": len(self.eagle.models),
                "wrappers": sum(m.wrapper for m in self.eagle.models),
                "wrapper_gaps": [
                    {"class": m.name, "path": m.path, "missing": list(m.missing)} for m in self.eagle.wrapper_gaps
                ],
                "model_status": {m.name: dict(m.methods) for m in self.eagle.models},
            },
            "findings": [asdict(f) for f in self.findings],
        }


def _gate_finding(gate: fusion.FusionGate, cc: ComputeCapability, flashinfer: str | None) -> Finding:
    fid = f"fusion-gate:{gate.path}::{gate.function}"
    where = f"{gate.kind} gate `{gate.expression}` in {gate.function}"
    if cc.major in gate.majors:
        return Finding(fid, True, False, f"{where} admits major {cc.major}", gate.path)
    if cc.major != 12:
        return Finding(
            fid, False, False, f"{where} does not admit major {cc.major}; no patch for that major", gate.path
        )
    if flashinfer is None:
        return Finding(
            fid, False, False, f"{where} does not admit 12; FlashInfer is not installed, left as is", gate.path
        )
    if parse_version(flashinfer) < FLASHINFER_MIN_FOR_SM120:
        need = ".".join(map(str, FLASHINFER_MIN_FOR_SM120))
        summary = f"{where} does not admit 12; FlashInfer {flashinfer} < {need} has no SM120 fusion kernels, left as is"
        return Finding(fid, False, False, summary, gate.path)
    return Finding(fid, False, True, f"{where} does not admit 12 (FlashInfer {flashinfer} supports it)", gate.path)


def _names(keys: tuple[int, ...]) -> str:
    return ", ".join(map(str, keys))


def run(tree: SourceTree, cc: ComputeCapability, flashinfer: str | None, flashinfer_origin: str) -> ScanReport:
    symm = symm_mem.scan(tree)
    gates = fusion.scan(tree)
    found = eagle.scan(tree)
    sizes, multimem = symm.sizes_map, symm.multimem_map
    major = cc.major
    findings = [
        Finding(
            "capability-map",
            major in sizes.majors,
            True,
            f"{sizes.name} has majors {_names(sizes.majors)}: {major} "
            + ("present" if major in sizes.majors else "missing, so the communicator never turns on"),
            sizes.path,
        ),
        Finding(
            "multimem-lookup",
            major in multimem.majors or symm.multimem_lookup_tolerant,
            True,
            f"{multimem.name} has majors {_names(multimem.majors)}; "
            + (
                "a major not listed there selects two-shot"
                if symm.multimem_lookup_tolerant
                else f"it is indexed directly, so major {major} "
                + ("is found" if major in multimem.majors else "raises KeyError")
            ),
            multimem.path,
        ),
        Finding(
            "multicast-early-return",
            not symm.multicast_early_return,
            True,
            f"{symm.communicator} "
            + (
                "turns itself off without multicast (PCIe, or multicast disabled) even where two-shot needs P2P only"
                if symm.multicast_early_return
                else "keeps two-shot on without multicast"
                + (" (relaxed by sm120check)" if symm.multicast_relaxed else "")
            ),
            symm.communicator_path,
        ),
    ]
    findings += [_gate_finding(g, cc, flashinfer) for g in gates if g.kind != "auto-enable"]
    for gap in found.wrapper_gaps:
        findings.append(
            Finding(
                f"eagle3:{gap.name}",
                False,
                True,
                f"{gap.name} holds self.language_model but lacks {', '.join(gap.missing)} (EAGLE-3 target crashes)",
                gap.path,
            )
        )
    return ScanReport(
        str(tree.root), tree.version, cc, flashinfer, flashinfer_origin, symm, gates, found, tuple(findings)
    )


def render(report: ScanReport) -> str:
    mark = {True: "ok  ", False: "FIX "}
    lines = [
        f"SGLang {report.version} at {report.source}",
        f"compute capability {report.cc} ({report.cc.origin}); FlashInfer {report.flashinfer or 'not installed'}",
        "capability maps: " + "; ".join(f"{m.name} {{{', '.join(map(str, m.majors))}}}" for m in report.symm.maps),
        "EAGLE-3 contract (from "
        + f"{len(report.eagle.sources)} worker/runner files): "
        + ", ".join(c.name for c in report.eagle.contract)
        + f"; {len(report.eagle.models)} registered models, {sum(m.wrapper for m in report.eagle.models)} wrappers",
    ]
    for f in report.findings:
        status = mark[f.ok] if f.ok or f.patchable else "warn"
        lines.append(f"  {status} {f.summary}")
    for g in report.gates:
        if g.kind == "auto-enable":
            admits = "admits" if report.cc.major in g.majors else "does not admit"
            lines.append(f"  note auto-enable `{g.expression}` in {g.path} {admits} {report.cc.major}; not patched")
    if report.needs_patch:
        lines.append("fix: sm120check sglang patch" + (f" --source {report.source}" if report.source else ""))
    return "\n".join(lines)
