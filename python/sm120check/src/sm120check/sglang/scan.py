"""One scan of an SGLang tree for one compute capability: the facts, the findings, and how to show them."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from sm120check.sglang import (
    eagle,
    flashinfer_workspace,
    fusion_gates,
    plain_decode,
    preflight,
    spec_stream,
    symm_mem_gates,
)
from sm120check.sglang.tree import FLASHINFER_MIN_FOR_SM120, ComputeCapability, SourceTree, parse_flashinfer_version


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
    symm: symm_mem_gates.SymmMemScan
    gates: tuple[fusion_gates.SourceGate, ...]
    eagle: eagle.EagleScan
    findings: tuple[Finding, ...]
    preflight: preflight.PreflightScan | None = None
    # FlashInfer's workspace constants, read when the preflight patch would apply (None: it would not)
    workspace_constants: flashinfer_workspace.ConstantsCheck | None = None
    # The speculation switch (opt in): whether this tree has it, or could take it
    switch: plain_decode.SwitchScan | None = None
    # Its companion edit of the output streamer (applied with the switch)
    stream: plain_decode.SwitchScan | None = None

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
            "eagle3": eagle.to_dict(self.eagle),
            "workspace_preflight": asdict(self.preflight) if self.preflight else None,
            "flashinfer_workspace_constants": asdict(self.workspace_constants) if self.workspace_constants else None,
            "plain_decode": asdict(self.switch) if self.switch else None,
            "spec_stream": asdict(self.stream) if self.stream else None,
            "findings": [asdict(f) for f in self.findings],
        }


def _gate_finding(gate: fusion_gates.SourceGate, cc: ComputeCapability, flashinfer: str | None) -> Finding:
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
    if parse_flashinfer_version(flashinfer) < FLASHINFER_MIN_FOR_SM120:
        need = ".".join(map(str, FLASHINFER_MIN_FOR_SM120))
        summary = f"{where} does not admit 12; FlashInfer {flashinfer} < {need} has no SM120 fusion kernels, left as is"
        return Finding(fid, False, False, summary, gate.path)
    return Finding(fid, False, True, f"{where} does not admit 12 (FlashInfer {flashinfer} supports it)", gate.path)


AUTO_ENABLE_ID = "fusion-auto-enable:"
PREFLIGHT_ID = "fusion-preflight"


def _auto_enable_finding(
    gate: fusion_gates.SourceGate, cc: ComputeCapability, flashinfer: str | None
) -> Finding | None:
    """Only the auto-enable that turns fusion on for this major with a FlashInfer that has no kernels for it (the
    startup crash of sglang#15650, 0.5.4.post3 to 0.5.7) is a finding; the others are notes in the render."""
    if cc.major != 12 or cc.major not in gate.majors or flashinfer is None:
        return None
    if parse_flashinfer_version(flashinfer) >= FLASHINFER_MIN_FOR_SM120:
        return None
    fid = f"{AUTO_ENABLE_ID}{gate.path}::{gate.function}"
    summary = (
        f"auto-enable `{gate.expression}` in {gate.function} turns FlashInfer allreduce fusion on for major 12 by "
        f"itself, and FlashInfer {flashinfer} has no SM120 fusion kernels: the server fails at start (sglang#15650, "
        "'No supported CUDA architectures found'); this release has no flag to turn fusion off, so the patch limits "
        "the auto-enable to SM100 (or install FlashInfer >= " + ".".join(map(str, FLASHINFER_MIN_FOR_SM120)) + ")"
    )
    return Finding(fid, False, True, summary, gate.path)


def _preflight_finding(
    workspace: preflight.PreflightScan,
    cc: ComputeCapability,
    flashinfer: str | None,
    constants: flashinfer_workspace.ConstantsCheck | None = None,
) -> Finding:
    where = f"workspace preflight {workspace.function}"
    if not workspace.queries_multicast:
        how = " (sized as FlashInfer allocates, by sm120check)" if workspace.relaxed else ""
        return Finding(PREFLIGHT_ID, True, False, f"{where} needs no multicast{how}", workspace.path)
    problem = (
        f"{where} rounds to cuMulticastGetGranularity, which fails without multicast (every PCIe box): SGLang logs "
        "'FlashInfer workspace preflight probe failed (...). Skipping allreduce fusion.' and serves unfused"
    )
    if cc.major not in preflight.TRTLLM_MAJORS:
        reason = f"; major {cc.major} resolves to the MNNVL backend, which uses multicast: left as is"
        return Finding(PREFLIGHT_ID, False, False, problem + reason, workspace.path)
    need = ".".join(map(str, preflight.FLASHINFER_NON_MULTICAST))
    if flashinfer is None:
        reason = "; FlashInfer is not installed, left as is"
        return Finding(PREFLIGHT_ID, False, False, problem + reason, workspace.path)
    if parse_flashinfer_version(flashinfer) < preflight.FLASHINFER_NON_MULTICAST:
        reason = f"; FlashInfer {flashinfer} < {need} may allocate differently, left as is"
        return Finding(PREFLIGHT_ID, False, False, problem + reason, workspace.path)
    if constants is not None and not constants.agrees:
        reason = (
            f"; FlashInfer {flashinfer} sizes its workspace otherwise than the patch was written for "
            f"({'; '.join(constants.differences)}): left as is until sm120check learns the new sizes"
        )
        return Finding(PREFLIGHT_ID, False, False, problem + reason, workspace.path)
    fix = f", although FlashInfer {flashinfer} creates that workspace without multicast"
    return Finding(PREFLIGHT_ID, False, True, problem + fix, workspace.path)


def _names(keys: tuple[int, ...]) -> str:
    return ", ".join(map(str, keys))


def _opt_in_finding(fid: str, found: plain_decode.SwitchScan, wanted: bool, name: str, on: str, off: str) -> Finding:
    """An edit of `--plain-decode` (the switch, the streamer's): a finding to fix only where it was asked for, else a
    note. `name` the edit, `on` / `off` what the tree does with it / without it."""
    if found.applied:
        return Finding(fid, True, False, on, found.path)
    if not wanted:
        why = f" ({found.reason})" if found.reason else " (opt in: sm120check sglang patch --plain-decode)"
        return Finding(fid, True, False, off + why, found.path)
    if found.reason:
        return Finding(fid, False, False, f"{name} asked for and cannot apply: {found.reason}", found.path)
    return Finding(fid, False, True, f"{name} asked for (--plain-decode) and not applied yet", found.path)


def run(
    tree: SourceTree,
    cc: ComputeCapability,
    flashinfer: str | None,
    flashinfer_origin: str,
    plain: bool = False,
) -> ScanReport:
    symm = symm_mem_gates.scan(tree)
    gates = fusion_gates.scan(tree)
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
    findings += [f for f in (_auto_enable_finding(g, cc, flashinfer) for g in gates if g.kind == "auto-enable") if f]
    workspace = preflight.scan(tree)
    constants = None
    if workspace is not None:
        if workspace.queries_multicast and flashinfer is not None and cc.major in preflight.TRTLLM_MAJORS:
            constants = flashinfer_workspace.check(flashinfer_workspace.locate(tree.root), flashinfer)
        findings.append(_preflight_finding(workspace, cc, flashinfer, constants))
    # EAGLE-3: patchable gaps (eagle3:), inner models without the methods (eagle3-unsupported:), inner classes
    # chosen at run time (eagle3-runtime:) and delegations some inner classes cannot answer (eagle3-partial:).
    findings += [Finding(*f) for f in eagle.findings(found)]
    worker = tree.read(plain_decode.PATH) if tree.exists(plain_decode.PATH) else None
    switch = plain_decode.survey(worker, tree.version)
    streamer = tree.read(spec_stream.PATH) if tree.exists(spec_stream.PATH) else None
    stream = spec_stream.survey(streamer, tree.version)
    findings += [
        _opt_in_finding(
            plain_decode.PATCH_ID, switch, plain, "speculation switch",
            "speculation switch present: a 0-step decode batch runs the plain decode", "speculation switch not applied",
        ),
        _opt_in_finding(
            spec_stream.PATCH_ID, stream, plain, "speculative-stream edit",
            "speculative histograms sent only with a request's last output",
            "speculative histograms sent with every output",
        ),
    ]  # fmt: skip
    return ScanReport(
        str(tree.root),
        tree.version,
        cc,
        flashinfer,
        flashinfer_origin,
        symm,
        gates,
        found,
        tuple(findings),
        preflight=workspace,
        workspace_constants=constants,
        switch=switch,
        stream=stream,
    )


EAGLE_PREFIX = "eagle3"


def _status(f: Finding) -> str:
    """The doctor's words: pass; fail where the patch closes it; warn where nothing here can."""
    return "PASS" if f.ok else "FAIL" if f.patchable else "WARN"


def _model_of(f: Finding) -> str:
    return f.id.split(":", 1)[1] if ":" in f.id else ""


def render(report: ScanReport, model: str = "", every_model: bool = False) -> str:
    """The summary line first, then the findings; EAGLE-3 model findings as counts unless `model` narrows them to
    the models whose class name holds it (case-insensitive), or `every_model` lists them all (the doctor's details)."""
    core = [f for f in report.findings if not f.id.startswith(EAGLE_PREFIX)]
    eagle3 = [f for f in report.findings if f.id.startswith(EAGLE_PREFIX)]
    counts = {word: sum(_status(f) == word for f in report.findings) for word in ("FAIL", "WARN", "PASS")}
    verdict = "patch needed: sm120check sglang patch" if report.needs_patch else "nothing to patch"
    lines = [
        f"SGLang {report.version} for compute capability {report.cc}: {counts['FAIL']} fail, {counts['WARN']} warn, "
        f"{counts['PASS']} pass ({len(eagle3)} of them EAGLE-3 model classes); {verdict}",
        f"source {report.source}; compute capability {report.cc} ({report.cc.origin}); FlashInfer "
        f"{report.flashinfer or 'not installed'}",
        "capability maps: " + "; ".join(f"{m.name} {{{', '.join(map(str, m.majors))}}}" for m in report.symm.maps),
        "EAGLE-3 contract (from "
        + f"{len(report.eagle.sources)} worker/runner files): "
        + ", ".join(c.name for c in report.eagle.contract)
        + f"; {len(report.eagle.models)} registered models, {sum(m.wrapper for m in report.eagle.models)} wrappers "
        + f"(holding self.{', self.'.join(eagle.HELD_ATTRS)}), {len(report.eagle.unsupported)} without EAGLE-3 support",
    ]
    lines += [f"  {_status(f):<4}  {f.summary}" for f in core]
    if every_model:
        lines += [f"  {_status(f):<4}  {f.summary}" for f in eagle3]
    elif model:
        chosen = [f for f in eagle3 if model.lower() in _model_of(f).lower()]
        lines += [f"  {_status(f):<4}  {f.summary}" for f in chosen]
        known = [m.name for m in report.eagle.models if model.lower() in m.name.lower()]
        if not chosen and known:
            shown = ", ".join(known[:5]) + (f" and {len(known) - 5} more" if len(known) > 5 else "")
            lines.append(f"  PASS  EAGLE-3: no gap in {shown} (the classes matching {model!r})")
        elif not chosen:
            lines.append(
                f"  WARN  EAGLE-3: no registered model class matches {model!r} (a part of the class name, such as "
                "LlamaForCausalLM; --json lists them all)"
            )
    elif eagle3:
        for word, what in (
            ("FAIL", "lack EAGLE-3's methods; the patch delegates them"),
            ("WARN", "cannot run EAGLE-3"),
        ):
            names = [_model_of(f) for f in eagle3 if _status(f) == word]
            if names:
                lines.append(
                    f"  {word:<4}  EAGLE-3: {len(names)} model classes {what} (--model NAME shows one, --json all)"
                )
    crashing = {f.path for f in report.findings if f.id.startswith(AUTO_ENABLE_ID)}
    for g in report.gates:
        if g.kind == "auto-enable" and g.path not in crashing:
            admits = "admits" if report.cc.major in g.majors else "does not admit"
            lines.append(f"  note  auto-enable `{g.expression}` in {g.path} {admits} {report.cc.major}; not patched")
    if report.workspace_constants is not None:
        lines.append(f"  note  {flashinfer_workspace.describe(report.workspace_constants)}")
    if report.needs_patch:
        ids = (plain_decode.PATCH_ID, spec_stream.PATCH_ID)
        plain = " --plain-decode" if any(f.id in ids and not f.ok for f in report.findings) else ""
        lines.append("fix: sm120check sglang patch" + plain + (f" --source {report.source}" if report.source else ""))
    return "\n".join(lines)
