"""Level 3: communication between the GPUs of this node, run for real in child processes with hard timeouts.

On a PCIe box every EAGLE-3 verify step pays several small allreduces; FlashInfer allreduce fusion and torch
symmetric memory are what make speculation pay. These checks say whether those paths work here, how fast
they are against NCCL, and why not when they fail (P2P off, IOMMU/ACS, no multicast, an old FlashInfer).
Each probe's answer is one type (doctor/comm/topology_payload.py, nccl.py, symm_mem.py, fusion.py), read strictly: a
malformed answer is a `fail` naming the field.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from sm120check.doctor import facts, nccl_floor, remedies
from sm120check.doctor.child import probe_env, run_probe
from sm120check.doctor.collective_payload import FUSION_TOLERANCE
from sm120check.doctor.comm import topology_parse
from sm120check.doctor.comm.fusion_payload import FusionAnswer
from sm120check.doctor.comm.nccl_payload import NcclAnswer, size_label
from sm120check.doctor.comm.symm_mem_payload import SymmMemAnswer
from sm120check.doctor.comm.topology_payload import TopologyEvidence
from sm120check.doctor.model import Context, Result, Status
from sm120check.doctor.nvml_api import Gpu
from sm120check.doctor.payload import PayloadError
from sm120check.doctor.pcie import cmdline, roots
from sm120check.doctor.pcie.lspci import AcsState
from sm120check.doctor.pcie.node import PcieFacts
from sm120check.doctor.pcie.sysfs import SysGpu
from sm120check.doctor.probecheck import (
    Payload,
    ProbeCheck,
    capability,
    gpu_arg,
    malformed,
    selected_gpus,
    stack_child,
    with_evidence,
)
from sm120check.jitcache import flashinfer_release, layout
from sm120check.jitcache import modules as jit_modules
from sm120check.jitcache.ninja import dry_run, find_ninja

FAMILY = "comm"
TOPOLOGY_PROBE = "sm120check.doctor.comm.topology_probe"
NCCL_PROBE = "sm120check.doctor.comm.nccl_probe"
SYMM_MEM_PROBE = "sm120check.doctor.comm.symm_mem_probe"
FUSION_PROBE = "sm120check.doctor.comm.fusion_probe"
SIZES_NOTE = "x 7168 bf16"
P2P_REMEDY = remedies.COMM_P2P
JIT_TIMEOUT_ENV = "SM120CHECK_JIT_TIMEOUT"
DEFAULT_JIT_TIMEOUT = 900.0  # about twice the cold build of both modules (jitcache.cost: 300-460 s)
# Bus bandwidth floor at 64 MiB where the GPUs talk over PCIe: NVSentinel's (NVIDIA/NVSentinel
# docs/configuration/preflight.md, preflight-nccl-loopback: BW_THRESHOLD_GBPS 150, "set to approx 15 GB/s for PCIe");
# below it the link is narrow or slow, or P2P is off. NVLink/NVSwitch nodes get no floor here.
PCIE_BUSBW_FLOOR_GBPS = 15.0


def _skip(check_id: str, summary: str, remedy: str = "") -> Result:
    return Result(check_id, Status.SKIP, summary, remedy=remedy, family=FAMILY, level=3)


def _result(check_id: str, status: Status, summary: str, **kw: Any) -> Result:
    return Result(check_id, status, summary, family=FAMILY, level=3, **kw)


def _fmt_us(latency: Mapping[str, float]) -> str:
    return "/".join(f"{latency[k]:.0f}" for k in sorted(latency, key=int))


def _sizes(latency: Mapping[str, float]) -> str:
    return "/".join(sorted(latency, key=int))


class Topology(ProbeCheck[TopologyEvidence]):
    """GPU pairs: P2P capability and link (NVLink or PCIe) from NVML and nvidia-smi, NUMA placement, and the
    settings that break PCIe P2P (IOMMU translation, ACS redirection on the bridges above the GPUs, GeForce
    drivers); the IOMMU and ACS from the run's PCIe facts."""

    id: ClassVar[str] = "topology"
    family: ClassVar[str] = FAMILY
    probe: ClassVar[str] = TOPOLOGY_PROBE
    payload: ClassVar[Payload[TopologyEvidence]] = TopologyEvidence
    answer: ClassVar[str] = "topology"
    what: ClassVar[str] = "topology probe"
    remedy: ClassVar[str] = remedies.COMM_TOPOLOGY_PROBE
    needs_pcie: ClassVar[bool] = True  # the IOMMU mode, group types and ACS come from the run's PCIe facts

    def timeout(self, ctx: Context, gpus: Sequence[Gpu]) -> float:
        return min(ctx.timeout, 60.0)

    def args(self, ctx: Context, gpus: Sequence[Gpu], limit: float) -> list[str]:
        return ["--gpus", gpu_arg(gpus)]

    def judge(self, answer: TopologyEvidence, ctx: Context, gpus: Sequence[Gpu]) -> Result:
        return judge_topology(answer, gpus, facts.pcie_of(ctx.facts))


@dataclasses.dataclass(frozen=True)
class _Pair:
    pair: tuple[int, int]
    link: str  # `topo -m` code, "" when unknown
    kind: str  # "nvlink", "pcie", "unknown"
    p2p: str  # "OK", "GNS", ... ("U": unknown)

    def to_json(self) -> dict[str, object]:
        return {"pair": list(self.pair), "link": self.link, "kind": self.kind, "p2p": self.p2p}


def _fabric_gpus(fabric: PcieFacts, gpus: Sequence[Gpu]) -> tuple[SysGpu, ...]:
    """The selected GPUs as the PCIe facts list them (matched by bus id); every NVIDIA GPU there when none matches."""
    wanted = {roots.sysfs_bdf(g.bus_id) for g in gpus}
    return tuple(g for g in fabric.sysfs.gpus if g.bdf in wanted) or fabric.sysfs.gpus


def _iommu(fabric: PcieFacts, rows: Sequence[SysGpu]) -> cmdline.IommuMode:
    """The IOMMU mode for the GPUs: their group types first, the kernel command line otherwise."""
    types = [g.group_type for g in rows if g.group_type]
    if fabric.cmdline is None and not types:
        return cmdline.IommuMode("unknown", f"kernel command line unreadable: {fabric.cmdline_error}")
    return cmdline.iommu_mode(fabric.cmdline.raw if fabric.cmdline is not None else "", types)


def _acs_line(fabric: PcieFacts, bridges: Sequence[AcsState], redirecting: Sequence[AcsState]) -> str:
    """What the facts say of ACS on the bridges above the GPUs, or why they cannot say."""
    failed = [b.error for b in bridges if b.error]
    if fabric.sysfs.error:
        return f"ACS: the PCI bus is not readable ({fabric.sysfs.error})"
    if fabric.lspci_error or failed:
        return f"ACS: lspci unavailable ({fabric.lspci_error or failed[0]})"
    if any(not b.readable for b in bridges):
        return "ACS: lspci could not read capabilities (run the doctor as root to see ACS)"
    return f"ACS: {len(redirecting)} port(s) redirect peer requests"


def judge_topology(evidence: TopologyEvidence, gpus: Sequence[Gpu], fabric: PcieFacts) -> Result:
    """Turn the topology probe's raw evidence and the run's PCIe facts (`fabric`: IOMMU group types, the kernel
    command line, ACS of the bridges above the GPUs) into a verdict (pure; tested with recorded outputs)."""
    indices = [g.index for g in gpus]
    names = {g.index: g.name for g in gpus}
    warnings: list[str] = []  # the first is the summary
    details: list[str] = []
    matrix = None
    if evidence.topo_m.ok:
        try:
            matrix = topology_parse.parse_topo_matrix(evidence.topo_m.text)
        except ValueError as exc:
            details.append(f"nvidia-smi topo -m unreadable: {exc}")
    else:
        details.append(f"nvidia-smi topo -m: {evidence.topo_m.error}")
    p2p: dict[tuple[int, int], str] = {}
    for entry in evidence.nvml.pairs:
        p2p[entry.pair] = entry.read if entry.read != "OK" else entry.write
    if not p2p and evidence.topo_p2p_r.ok:
        try:
            p2p = {
                pair: code
                for pair, code in topology_parse.parse_p2p_matrix(evidence.topo_p2p_r.text).items()
                if pair[0] < pair[1]
            }
        except ValueError as exc:
            details.append(f"nvidia-smi topo -p2p r unreadable: {exc}")
    pairs: list[_Pair] = []
    for a in indices:
        for b in indices:
            if a >= b:
                continue
            link = matrix.links.get((a, b)) if matrix else None
            code = p2p.get((a, b), "U")
            pairs.append(_Pair((a, b), link.code if link else "", link.kind if link else "unknown", code))
            details.append(
                f"GPU{a}-GPU{b}: {link.meaning if link else 'link unknown'}, P2P "
                f"{topology_parse.P2P_MEANING.get(code, code)}"
            )
    pcie_pairs = [p for p in pairs if p.kind != "nvlink"]
    no_p2p = [p for p in pairs if p.p2p != "OK"]
    geforce = sorted({names[i] for p in no_p2p for i in p.pair if topology_parse.driver_disables_p2p(names[i])})
    if geforce:
        warnings.append(
            f"P2P disabled by the driver on {', '.join(geforce)}: NCCL falls back to host memory, symmetric "
            "memory and FlashInfer allreduce fusion cannot run"
        )
    elif no_p2p:
        codes = ", ".join(f"GPU{p.pair[0]}-GPU{p.pair[1]} {p.p2p}" for p in no_p2p)
        warnings.append(f"P2P not available between {codes}")
    rows = _fabric_gpus(fabric, gpus)
    iommu = _iommu(fabric, rows)
    details.append(f"IOMMU: {iommu.mode} ({iommu.evidence})")
    if iommu.blocks_p2p and pcie_pairs:
        warnings.append(f"IOMMU translates DMA ({iommu.evidence}): PCIe P2P can hang NCCL")
    bridges = [fabric.acs[b] for b in dict.fromkeys(b for g in rows for b in g.bridges) if b in fabric.acs]
    redirecting = [b for b in bridges if b.redirects]
    details.append(_acs_line(fabric, bridges, redirecting))
    switched = [p for p in pcie_pairs if p.link in ("PIX", "PXB")]
    if redirecting and switched:
        ports = ", ".join(b.bdf for b in redirecting[:6])
        warnings.append(f"ACS redirects peer traffic on {ports}: P2P through the PCIe switch goes via the root complex")
    numa = dict(matrix.numa_affinity) if matrix else {}
    numa_nodes = sorted({numa.get(i, "") for i in indices} - {""})
    if len(numa_nodes) > 1:
        details.append(f"GPUs span NUMA nodes {', '.join(numa_nodes)}: P2P across sockets needs NCCL_P2P_LEVEL=SYS")
    kinds = sorted({p.kind for p in pairs})
    summary_links = "NVLink" if kinds == ["nvlink"] else ("PCIe" if kinds == ["pcie"] else "/".join(kinds))
    data = {
        "pairs": [p.to_json() for p in pairs],
        "numa": {str(i): numa.get(i, "") for i in indices},
        "iommu": iommu.mode,
        "acs_redirect_ports": [b.bdf for b in redirecting],
        "topo_m": evidence.topo_m.text,
        "topo_p2p_r": evidence.topo_p2p_r.text,
    }
    if warnings:
        return _result(
            "topology",
            Status.WARN,
            warnings[0],
            details="\n".join(warnings[1:] + details),
            remedy=remedies.COMM_GEFORCE if geforce else P2P_REMEDY,  # GeForce comes first; the others are P2P's
            data=data,
        )
    ok_pairs = sum(1 for p in pairs if p.p2p == "OK")
    return _result(
        "topology",
        Status.PASS,
        f"{len(indices)} GPUs over {summary_links}, P2P OK on {ok_pairs}/{len(pairs)} pairs",
        details="\n".join(details),
        data=data,
    )


class NcclAllreduce:
    """NCCL allreduce on the selected GPUs: exact results at the verify size and at 512 KiB, 1 MiB, 4 MiB and
    64 MiB (NVIDIA/nccl#2418), latency at EAGLE-3 verify sizes (1, 3 and 8 tokens x 7168, bf16) and bus bandwidth at
    64 MiB, with a floor over PCIe. A hang is a fail with the P2P/ACS remedy."""

    id: ClassVar[str] = "nccl_allreduce"
    family: ClassVar[str] = FAMILY
    level: ClassVar[int] = 3
    requires: ClassVar[tuple[str, ...]] = ("driver", "torch")
    uses: ClassVar[tuple[str, ...]] = ()

    # Its own run, not ProbeCheck's: a probe that died is judged by the answer it left (a hang is retried without
    # P2P to tell blocked PCIe P2P from a broken NCCL), not reported as a dead child.
    def run(self, ctx: Context) -> Result:
        gpus = selected_gpus(ctx, self.id, need_torch=True, family=FAMILY)
        if isinstance(gpus, Result):
            return gpus
        args = ["--gpus", gpu_arg(gpus), "--timeout", str(max(10.0, ctx.timeout - 5))]
        outcome = run_probe(NCCL_PROBE, args, timeout=ctx.timeout, **stack_child(ctx))
        answer = None
        if outcome.ok:
            try:
                answer = NcclAnswer.from_json(outcome.data)
            except PayloadError as exc:
                return malformed(self.id, "nccl", exc, remedies.comm_malformed(NCCL_PROBE), FAMILY)
            if not answer.launch.timed_out:
                return with_evidence(judge_nccl(answer, len(gpus)), answer.launch.evidence)
        if answer is None and not outcome.timed_out:
            return _result(
                self.id,
                Status.FAIL,
                f"NCCL allreduce failed: {outcome.problem}",
                details=outcome.stderr_tail[-2000:],
                remedy=remedies.NCCL,
                data=dict(outcome.data),
            )
        retry = run_probe(
            NCCL_PROBE,
            ["--gpus", gpu_arg(gpus), "--timeout", "55", "--correctness-only"],
            timeout=60.0,
            python=stack_child(ctx)["python"],
            env={"NCCL_P2P_DISABLE": "1", **probe_env()},
        )
        works_without_p2p = False
        if retry.ok:
            try:
                again = NcclAnswer.from_json(retry.data)
                works_without_p2p = again.launch.ok and bool(again.correct)
            except PayloadError:
                works_without_p2p = False  # an unreadable retry proves nothing
        where = answer.launch.problem if answer is not None else outcome.problem
        summary = (
            "NCCL allreduce hangs with P2P and completes with NCCL_P2P_DISABLE=1: PCIe P2P is blocked (IOMMU/ACS)"
            if works_without_p2p
            else f"NCCL allreduce hung ({where}), also with NCCL_P2P_DISABLE=1"
        )
        return _result(
            self.id,
            Status.FAIL,
            summary,
            details=where,
            remedy=P2P_REMEDY,
            data={"hang": True, "works_without_p2p": works_without_p2p},
        )


def _release_note(version: str) -> str:
    """What sm120kit's NCCL table says of this release (known bad, under the floor, unconfirmed)."""
    if not version:
        return ""
    verdict = nccl_floor.judge_nccl(version)
    return f"{verdict.summary}: {verdict.details}" if verdict.details else verdict.summary


def judge_nccl(answer: NcclAnswer, world_size: int) -> Result:
    check_id = "nccl_allreduce"
    version = answer.nccl
    sizes = [s.to_json() for s in answer.sizes]
    if not answer.launch.ok:
        failed = sorted({r.failed_bytes for r in answer.ranks if r.failed_bytes is not None})
        if failed:  # an allreduce raised (an illegal memory access) at a message size: NVIDIA/nccl#2418
            return _result(
                check_id,
                Status.FAIL,
                f"NCCL {version} allreduce failed at {size_label(failed[0])}: {answer.launch.problem}",
                details=_release_note(version),
                remedy=remedies.nccl_upgrade(version),
                data=answer.to_json(),
            )
        return _result(
            check_id,
            Status.FAIL,
            f"NCCL allreduce failed: {answer.launch.problem}",
            remedy=remedies.NCCL,
            data=answer.to_json(),
        )
    if not answer.correct:
        wrong = [s for s in answer.sizes if not s.correct]
        total = sum(s.mismatches for s in wrong) or sum(r.mismatches or 0 for r in answer.ranks)
        at = ", ".join(size_label(s.bytes) for s in wrong) or "the verify size"
        return _result(
            check_id,
            Status.FAIL,
            f"NCCL {version} allreduce returned {total} wrong element(s) at {at}",
            details=_release_note(version),
            remedy=remedies.nccl_upgrade(version),
            data=answer.to_json(),
        )
    latency = dict(answer.latency_us)
    busbw = answer.busbw_gbps if answer.busbw_gbps is not None else 0.0
    data: dict[str, object] = {
        "nccl": version,
        "latency_us": latency,
        "busbw_gbps": busbw,
        "world_size": world_size,
        "sizes": sizes,
        "links": [link.to_json() for link in answer.links],
    }
    exact = ", ".join(size_label(s.bytes) for s in answer.sizes)
    details = [f"exact at {exact} (NVIDIA/nccl#2418: 2.26.2 faults at 512 KiB and more)"]
    if answer.links_error:
        details.append(f"link between the GPUs unknown ({answer.links_error}): no bus-bandwidth floor applied")
    if answer.over_pcie and answer.busbw_gbps is not None and busbw < PCIE_BUSBW_FLOOR_GBPS:
        return _result(
            check_id,
            Status.WARN,
            f"NCCL {version} allreduce correct on {world_size} GPUs, but busbw {busbw:.1f} GB/s at 64 MiB over PCIe "
            f"is below the {PCIE_BUSBW_FLOOR_GBPS:.0f} GB/s floor; {_sizes(latency)} {SIZES_NOTE}: "
            f"{_fmt_us(latency)} us",
            details="\n".join(details),
            remedy=remedies.COMM_PCIE_BUSBW,
            data=data | {"busbw_floor_gbps": PCIE_BUSBW_FLOOR_GBPS},
        )
    summary = (
        f"NCCL {version} allreduce correct on {world_size} GPUs; {_sizes(latency)} {SIZES_NOTE}: "
        f"{_fmt_us(latency)} us; busbw {busbw:.0f} GB/s at 64 MiB"
    )
    return _result(check_id, Status.PASS, summary, details="\n".join(details), data=data)


class SymmMem(ProbeCheck[SymmMemAnswer]):
    """torch symmetric memory: rendezvous, multicast_ptr, one-shot and two-shot allreduce checked against NCCL and
    timed beside it; multimem only where multicast exists and is allowed."""

    id: ClassVar[str] = "symm_mem"
    family: ClassVar[str] = FAMILY
    requires: ClassVar[tuple[str, ...]] = ("driver", "torch")
    probe: ClassVar[str] = SYMM_MEM_PROBE
    payload: ClassVar[Payload[SymmMemAnswer]] = SymmMemAnswer
    answer: ClassVar[str] = "symm_mem"
    what: ClassVar[str] = "symmetric-memory probe"
    remedy: ClassVar[str] = P2P_REMEDY

    def judge(self, answer: SymmMemAnswer, ctx: Context, gpus: Sequence[Gpu]) -> Result:
        return with_evidence(judge_symm_mem(answer), answer.launch.evidence)


def judge_symm_mem(answer: SymmMemAnswer) -> Result:
    check_id = "symm_mem"
    problem = answer.launch.problem
    if answer.launch.timed_out:
        return _result(check_id, Status.FAIL, f"symmetric memory hung: {problem}", remedy=P2P_REMEDY)
    if not answer.launch.ok:
        if "invalid device ordinal" in problem:
            return _result(
                check_id,
                Status.FAIL,
                "symmetric memory cannot map peer GPU memory (no P2P): " + problem,
                remedy=P2P_REMEDY,
            )
        return _result(check_id, Status.FAIL, f"symmetric memory failed: {problem}", remedy=remedies.COMM_SYMM_MEM)
    wrong = sorted(op for op, ok in answer.correct.items() if not ok)
    if wrong:
        return _result(
            check_id,
            Status.FAIL,
            f"symmetric-memory allreduce wrong for {', '.join(wrong)}",
            remedy=remedies.COMM_SYMM_MEM_WRONG,
            data=answer.to_json(),
        )
    latency = {op: dict(v) for op, v in answer.latency_us.items()}
    ptrs = list(answer.multicast_ptr)
    multicast = any(ptrs)
    if "multimem" in latency:
        multimem = "multimem ran"
    elif not answer.multimem_allowed:
        multimem = "multimem not run: multicast disabled (TORCH_SYMM_MEM_DISABLE_MULTICAST / NCCL_NVLS_ENABLE=0)"
    else:
        multimem = "multimem not run: no multicast on this node"
    parts = [f"{op} {_fmt_us(latency[op])} us" for op in ("one_shot", "two_shot", "multimem", "nccl") if op in latency]
    sizes = _sizes(latency.get("nccl", {}))
    summary = f"one-shot and two-shot correct; {sizes} {SIZES_NOTE}: " + ", ".join(parts)
    details = f"multicast_ptr {'set' if multicast else '0'} ({ptrs}); {multimem}"
    return _result(
        check_id,
        Status.PASS,
        summary,
        details=details,
        data={"latency_us": latency, "multicast": multicast, "multicast_ptr": ptrs},
    )


class AllreduceFusion(ProbeCheck[FusionAnswer]):
    """FlashInfer allreduce fusion (kARResidualRMSNorm) on the selected GPUs against allreduce + residual add +
    RMSNorm in torch, fused and unfused latency; backend, JIT target and cold/cached JIT build reported; knows
    which FlashInfer releases have SM120 kernels. Also PcieIpcAllReduceWorkspace (FlashInfer 0.7.0+)."""

    id: ClassVar[str] = "allreduce_fusion"
    family: ClassVar[str] = FAMILY
    requires: ClassVar[tuple[str, ...]] = ("driver", "torch")
    probe: ClassVar[str] = FUSION_PROBE
    payload: ClassVar[Payload[FusionAnswer]] = FusionAnswer
    answer: ClassVar[str] = "fusion"
    what: ClassVar[str] = "allreduce-fusion probe"
    remedy: ClassVar[str] = remedies.COMM_FUSION_PROBE

    # Its own run, not ProbeCheck's: the FlashInfer release gate comes before the probe and the judge reads it, and
    # the probe's limit depends on whether its JIT modules are cached.
    def run(self, ctx: Context) -> Result:
        gpus = self.select(ctx)
        if isinstance(gpus, Result):
            return gpus
        version = flashinfer_version(ctx)
        if not version:
            return _skip(self.id, "FlashInfer is not installed", remedies.COMM_NO_FLASHINFER)
        pin = ctx.manifest.python_packages.get("flashinfer-python") if ctx.manifest else None
        caps = [capability(g) for g in gpus]
        gate = flashinfer_release.fusion_support(version, caps, multicast=False, pin=pin)
        if not gate.ok and not flashinfer_release.requires_multicast(flashinfer_release.parse_version(version)):
            return _result(
                self.id,
                Status.FAIL,
                gate.summary,
                remedy=gate.remedy,
                data={"flashinfer": version, "majors": list(gate.majors)},
            )
        all_caps = [capability(g) for g in ctx.facts.gpus or ()]
        cached = predicted_cached(version, all_caps)
        timeout = ctx.timeout if cached else jit_timeout(ctx)
        answer = self.ask(ctx, gpus, timeout)
        if isinstance(answer, Result):
            return answer
        return with_evidence(judge_fusion(answer, gate, timeout), answer.launch.evidence)


def flashinfer_version(ctx: Context) -> str:
    """flashinfer-python's version in the stack venv ("" if absent); the running interpreter's path otherwise
    (a fact, read once before the checks: facts.flashinfer_version)."""
    return ctx.facts.flashinfer


def jit_timeout(ctx: Context) -> float:
    """Limit for a run that must JIT-compile first: Context.jit_timeout if the runner has it, else
    $SM120CHECK_JIT_TIMEOUT, else 900 s; never below the ordinary timeout."""
    configured = ctx.jit_timeout or os.environ.get(JIT_TIMEOUT_ENV) or DEFAULT_JIT_TIMEOUT
    try:
        seconds = float(configured)
    except ValueError:
        raise ValueError(f"{JIT_TIMEOUT_ENV}={configured!r}: give a number of seconds, for example 900") from None
    return max(seconds, ctx.timeout)


def predicted_cached(version: str, capabilities: Sequence[str], env: Mapping[str, str] | None = None) -> bool:
    """Whether every module the fusion probe builds (the serving modules this FlashInfer provides for these GPUs)
    loads from FlashInfer's JIT cache without compiling (no flashinfer import): its library exists and ninja, which
    FlashInfer runs on every load, has no work there."""
    env = os.environ if env is None else env
    try:
        targets = layout.jit_targets(capabilities, env.get(layout.ARCH_LIST_ENV))
        wanted = jit_modules.for_release(version, layout.target_majors(targets))
    except ValueError:
        return False
    ninja = find_ninja(env)
    if ninja is None:
        return False
    root = layout.cache_root(env)
    for name in wanted:
        library = layout.module_library(root, version, layout.arch_dir(targets), name)
        if not library.exists() or not dry_run(library.parent, ninja).clean:
            return False
    return True


def judge_fusion(answer: FusionAnswer, gate: flashinfer_release.FusionSupport, timeout: float) -> Result:
    check_id = "allreduce_fusion"
    jit = answer.jit
    modules = jit.modules if jit is not None else ()
    env = jit.environment if jit is not None else None
    cold = [m for m in modules if not m.cached_before]
    jit_note = (
        "JIT compiled cold: " + ", ".join(f"{m.name} {m.seconds:.0f} s" for m in cold)
        if cold
        else "JIT modules loaded from cache"
        if modules
        else "JIT state unknown"
    )
    targets = list(env.targets) if env is not None else []
    arch_list = env.arch_list_env if env is not None else ""
    target = f"JIT targets {' '.join(targets) or '?'} (FLASHINFER_CUDA_ARCH_LIST={arch_list or 'unset'})"
    base: dict[str, object] = {"jit": jit.to_json() if jit is not None else {}, "cold_build": bool(cold)}
    problem = answer.launch.problem
    if flashinfer_release.ARCH_GATE_ERROR in problem:
        return _result(
            check_id,
            Status.FAIL,
            f"FlashInfer refused the GPUs' architecture: {problem}",
            remedy=gate.remedy or remedies.COMM_FUSION_ARCH,
            data=base,
        )
    if answer.launch.timed_out:
        in_build = "jit build" in problem
        summary = (
            f"FlashInfer JIT build did not finish within {timeout:.0f} s"
            if in_build
            else f"allreduce fusion hung: {problem}"
        )
        remedy = remedies.COMM_FUSION_JIT_TIMEOUT if in_build else P2P_REMEDY
        return _result(check_id, Status.FAIL, summary, details=target, remedy=remedy, data=base)
    if not answer.launch.ok:
        return _result(
            check_id,
            Status.FAIL,
            f"allreduce fusion failed: {problem}",
            details=f"{jit_note}; {target}",
            remedy=gate.remedy or remedies.COMM_FUSION_FAILED,
            data=base,
        )
    errors = dict(answer.max_rel_err)
    fused, unfused = dict(answer.fused_us), dict(answer.unfused_us)
    backend = f"backend {answer.backend} ({answer.workspace})"
    bad = {k: v for k, v in errors.items() if v > FUSION_TOLERANCE}
    pcie = answer.pcie_ipc
    full = base | {
        "backend": answer.backend,
        "workspace": answer.workspace,
        "latency_us": {"fused": fused, "unfused": unfused},
        "max_rel_err": errors,
        "pcie_ipc": pcie.to_json() if pcie is not None else None,
        "targets": targets,
    }
    if bad:
        worst = max(bad, key=lambda k: bad[k])
        return _result(
            check_id,
            Status.FAIL,
            f"allreduce fusion differs from the torch reference (rel. error {bad[worst]:.3g} at {worst} tokens)",
            details=f"{backend}; {target}",
            remedy=remedies.COMM_FUSION_WRONG,
            data=full,
        )
    summary = (
        f"FlashInfer {answer.flashinfer} fusion correct, {backend}; {_sizes(fused)} {SIZES_NOTE}: fused "
        f"{_fmt_us(fused)} us vs unfused {_fmt_us(unfused)} us"
    )
    details = [jit_note, target]
    if pcie is not None and pcie.error is not None:
        details.append(f"PcieIpcAllReduceWorkspace failed: {pcie.error}")
    elif pcie is not None:
        details.append(
            f"PcieIpcAllReduceWorkspace ({pcie.profile}): {'correct' if pcie.correct else 'WRONG'}, "
            f"{_fmt_us(pcie.latency_us) if pcie.latency_us else '-'} us"
        )
    if cold:
        return _result(
            check_id,
            Status.WARN,
            summary + f"; {jit_note}",
            details="\n".join(details),
            remedy=remedies.COMM_FUSION_COLD,
            data=full,
        )
    return _result(check_id, Status.PASS, summary, details="\n".join(details), data=full)


CHECKS = (Topology, NcclAllreduce, SymmMem, AllreduceFusion)
