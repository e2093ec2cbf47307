"""Level 3: communication between the GPUs of this node, run for real in child processes with hard timeouts.

On a PCIe box every EAGLE-3 verify step pays several small allreduces; FlashInfer allreduce fusion and torch
symmetric memory are what make speculation pay. These checks say whether those paths work here, how fast
they are against NCCL, and why not when they fail (P2P off, IOMMU/ACS, no multicast, an old FlashInfer).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from sm120check.comm import flashinfer_release, topology
from sm120check.doctor import remedies, stackenv
from sm120check.doctor.child import ChildOutcome, run_probe
from sm120check.doctor.model import Context, Result, Status
from sm120check.doctor.nvml_api import Gpu
from sm120check.jitcache import layout
from sm120check.jitcache import modules as jit_modules
from sm120check.jitcache.ninja import dry_run, find_ninja

FAMILY = "comm"
PROBES = "sm120check.doctor.probes"
SIZES_NOTE = "x 7168 bf16"
P2P_REMEDY = (
    "PCIe P2P is blocked: confirm by rerunning with NCCL_P2P_DISABLE=1 (slower, but it completes); fix by booting "
    "with iommu=pt (GRUB_CMDLINE_LINUX, or turn the IOMMU/VT-d off in firmware) and disabling ACS on the PCIe "
    "switch ports (firmware setting, or `setpci -s <port> ECAP_ACS+6.w=0000`), then reboot"
)
JIT_TIMEOUT_ENV = "SM120CHECK_JIT_TIMEOUT"
DEFAULT_JIT_TIMEOUT = 900.0  # about twice the cold build of both modules (jitcache.cost: 300-460 s)
FUSION_TOLERANCE = 2e-2  # bf16 outputs against an fp32 reference


def _skip(check_id: str, summary: str, remedy: str = "") -> Result:
    return Result(check_id, Status.SKIP, summary, remedy=remedy, family=FAMILY, level=3)


def _result(check_id: str, status: Status, summary: str, **kw: Any) -> Result:
    return Result(check_id, status, summary, family=FAMILY, level=3, **kw)


def with_evidence(result: Result, data: Mapping[str, Any]) -> Result:
    """A failed multi-GPU result carries each failing rank's phase and log tail (Python stacks on a hang)."""
    evidence = str(data.get("evidence") or "").strip()
    if result.status is not Status.FAIL or not evidence:
        return result
    return dataclasses.replace(result, details=f"{result.details}\n{evidence}".strip())


def selected_gpus(ctx: Context, check_id: str, need_torch: bool) -> list[Gpu] | Result:
    """The GPUs NVML listed (the node's facts) restricted to --gpus, or a skip saying why there is nothing to run on."""
    for required in ("driver", "torch") if need_torch else ("driver",):
        prior = ctx.results.get(required)
        if prior is None:
            return _skip(check_id, f"prerequisite `{required}` did not run", f"add `--select {required}`")
        if prior.status in (Status.FAIL, Status.SKIP):
            return _skip(check_id, f"prerequisite `{required}` {prior.status.value}ed: {prior.summary}", prior.remedy)
    rows = list(ctx.facts.gpus or ())  # `driver` passed or warned: NVML listed them
    if ctx.gpus is not None:
        known = {g.index for g in rows}
        unknown = [i for i in ctx.gpus if i not in known]
        if unknown:
            return _skip(check_id, f"--gpus names {unknown}, the driver sees {sorted(known)}", "pass indices it lists")
        rows = [g for g in rows if g.index in ctx.gpus]
    if len(rows) < 2:
        return _skip(check_id, f"needs at least 2 GPUs, {len(rows)} selected", "run on a multi-GPU node")
    return rows


def _as_list(value: object) -> list[Mapping[str, Any]]:
    return [v for v in value if isinstance(v, Mapping)] if isinstance(value, list | tuple) else []


def capability(gpu: Gpu) -> str:
    """The compute capability as FlashInfer and the release tables write it: "12.0"."""
    return f"{gpu.cc[0]}.{gpu.cc[1]}"


def _gpu_arg(gpus: Sequence[Gpu]) -> str:
    return ",".join(str(g.index) for g in gpus)


def _fmt_us(latency: Mapping[str, float]) -> str:
    return "/".join(f"{latency[k]:.0f}" for k in sorted(latency, key=int))


def _sizes(latency: Mapping[str, float]) -> str:
    return "/".join(sorted(latency, key=int))


def _child_failure(check_id: str, what: str, outcome: ChildOutcome, remedy: str) -> Result:
    return _result(
        check_id, Status.FAIL, f"{what} {outcome.problem}", details=outcome.stderr_tail[-2000:], remedy=remedy
    )


class Topology:
    """GPU pairs: P2P capability and link (NVLink or PCIe) from NVML and nvidia-smi, NUMA placement, and the
    settings that break PCIe P2P (IOMMU translation, ACS redirection, GeForce drivers)."""

    id: ClassVar[str] = "topology"
    family: ClassVar[str] = FAMILY
    level: ClassVar[int] = 3
    requires: ClassVar[tuple[str, ...]] = ("driver",)
    uses: ClassVar[tuple[str, ...]] = ()

    def run(self, ctx: Context) -> Result:
        gpus = selected_gpus(ctx, self.id, need_torch=False)
        if isinstance(gpus, Result):
            return gpus
        outcome = run_probe(f"{PROBES}.topology", ["--gpus", _gpu_arg(gpus)], timeout=min(ctx.timeout, 60.0))
        if not outcome.ok:
            return _child_failure(self.id, "topology probe", outcome, "check `nvidia-smi topo -m` by hand")
        return judge_topology(outcome.data, gpus)


def judge_topology(evidence: Mapping[str, Any], gpus: Sequence[Gpu]) -> Result:
    """Turn the topology probe's raw evidence into a verdict (pure; tested with recorded outputs)."""
    indices = [g.index for g in gpus]
    names = {g.index: g.name for g in gpus}
    warnings: list[tuple[str, str]] = []
    details: list[str] = []
    matrix = None
    topo_m = evidence.get("topo_m") or {}
    if topo_m.get("ok"):
        try:
            matrix = topology.parse_topo_matrix(str(topo_m["text"]))
        except ValueError as exc:
            details.append(f"nvidia-smi topo -m unreadable: {exc}")
    else:
        details.append(f"nvidia-smi topo -m: {topo_m.get('error', 'not run')}")
    p2p: dict[tuple[int, int], str] = {}
    for entry in _as_list((evidence.get("nvml") or {}).get("pairs")):
        a, b = (int(x) for x in entry["pair"])
        read, write = str(entry.get("read", "U")), str(entry.get("write", "U"))
        p2p[(a, b)] = read if read != "OK" else write
    p2p_text = evidence.get("topo_p2p_r") or {}
    if not p2p and p2p_text.get("ok"):
        try:
            p2p = {
                pair: code
                for pair, code in topology.parse_p2p_matrix(str(p2p_text["text"])).items()
                if pair[0] < pair[1]
            }
        except ValueError as exc:
            details.append(f"nvidia-smi topo -p2p r unreadable: {exc}")
    pairs: list[dict[str, Any]] = []
    for a in indices:
        for b in indices:
            if a >= b:
                continue
            link = matrix.links.get((a, b)) if matrix else None
            pairs.append(
                {
                    "pair": [a, b],
                    "link": link.code if link else "",
                    "kind": link.kind if link else "unknown",
                    "p2p": p2p.get((a, b), "U"),
                }
            )
            details.append(
                f"GPU{a}-GPU{b}: {link.meaning if link else 'link unknown'}, P2P "
                f"{topology.P2P_MEANING.get(p2p.get((a, b), 'U'), p2p.get((a, b), 'U'))}"
            )
    pcie_pairs = [p for p in pairs if p["kind"] != "nvlink"]
    no_p2p = [p for p in pairs if p["p2p"] != "OK"]
    geforce = sorted({names[i] for p in no_p2p for i in p["pair"] if topology.driver_disables_p2p(names[i])})
    if geforce:
        warnings.append(
            (
                f"P2P disabled by the driver on {', '.join(geforce)}: NCCL falls back to host memory, symmetric "
                "memory and FlashInfer allreduce fusion cannot run",
                "use RTX PRO / data-center GPUs for P2P; on GeForce keep NCCL's default (shared memory) transport",
            )
        )
    elif no_p2p:
        codes = ", ".join(f"GPU{p['pair'][0]}-GPU{p['pair'][1]} {p['p2p']}" for p in no_p2p)
        warnings.append((f"P2P not available between {codes}", P2P_REMEDY))
    iommu = topology.iommu_mode(
        str(evidence.get("cmdline", "")), list((evidence.get("iommu_group_types") or {}).values())
    )
    details.append(f"IOMMU: {iommu.mode} ({iommu.evidence})")
    if iommu.blocks_p2p and pcie_pairs:
        warnings.append((f"IOMMU translates DMA ({iommu.evidence}): PCIe P2P can hang NCCL", P2P_REMEDY))
    acs = evidence.get("acs") or {}
    redirecting = [p for p in _as_list(acs.get("ports")) if p.get("redirect")]
    if not acs.get("ok"):
        details.append(f"ACS: lspci unavailable ({acs.get('error', '')})")
    elif not acs.get("readable"):
        details.append("ACS: lspci could not read capabilities (run the doctor as root to see ACS)")
    else:
        details.append(f"ACS: {len(redirecting)} port(s) redirect peer requests")
    switched = [p for p in pcie_pairs if p["link"] in ("PIX", "PXB")]
    if redirecting and switched:
        ports = ", ".join(str(p["address"]) for p in redirecting[:6])
        warnings.append(
            (
                f"ACS redirects peer traffic on {ports}: P2P through the PCIe switch goes via the root complex",
                P2P_REMEDY,
            )
        )
    numa = dict(matrix.numa_affinity) if matrix else {}
    numa_nodes = sorted({numa.get(i, "") for i in indices} - {""})
    if len(numa_nodes) > 1:
        details.append(f"GPUs span NUMA nodes {', '.join(numa_nodes)}: P2P across sockets needs NCCL_P2P_LEVEL=SYS")
    kinds = sorted({p["kind"] for p in pairs})
    summary_links = "NVLink" if kinds == ["nvlink"] else ("PCIe" if kinds == ["pcie"] else "/".join(kinds))
    data = {
        "pairs": pairs,
        "numa": {str(i): numa.get(i, "") for i in indices},
        "iommu": iommu.mode,
        "acs_redirect_ports": [p["address"] for p in redirecting],
        "topo_m": str(topo_m.get("text", "")),
        "topo_p2p_r": str(p2p_text.get("text", "")),
    }
    if warnings:
        return _result(
            "topology",
            Status.WARN,
            warnings[0][0],
            details="\n".join([w for w, _ in warnings[1:]] + details),
            remedy=warnings[0][1],
            data=data,
        )
    ok_pairs = sum(1 for p in pairs if p["p2p"] == "OK")
    return _result(
        "topology",
        Status.PASS,
        f"{len(indices)} GPUs over {summary_links}, P2P OK on {ok_pairs}/{len(pairs)} pairs",
        details="\n".join(details),
        data=data,
    )


class NcclAllreduce:
    """NCCL allreduce on the selected GPUs: exact result against a reference, latency at EAGLE-3 verify sizes
    (1, 3 and 8 tokens x 7168, bf16) and bus bandwidth at 64 MiB. A hang is a fail with the P2P/ACS remedy."""

    id: ClassVar[str] = "nccl_allreduce"
    family: ClassVar[str] = FAMILY
    level: ClassVar[int] = 3
    requires: ClassVar[tuple[str, ...]] = ("driver", "torch")
    uses: ClassVar[tuple[str, ...]] = ()

    def run(self, ctx: Context) -> Result:
        gpus = selected_gpus(ctx, self.id, need_torch=True)
        if isinstance(gpus, Result):
            return gpus
        args = ["--gpus", _gpu_arg(gpus), "--timeout", str(max(10.0, ctx.timeout - 5))]
        outcome = run_probe(f"{PROBES}.nccl", args, timeout=ctx.timeout, **_stack(ctx))
        if outcome.ok and not outcome.data.get("timed_out"):
            return with_evidence(judge_nccl(outcome.data, len(gpus)), outcome.data)
        hang = outcome.timed_out or bool(outcome.data.get("timed_out"))
        if not hang:
            problem = outcome.data.get("problem") or outcome.problem
            return _result(
                self.id,
                Status.FAIL,
                f"NCCL allreduce failed: {problem}",
                details=outcome.stderr_tail[-2000:],
                remedy=remedies.NCCL,
                data=dict(outcome.data),
            )
        retry = run_probe(
            f"{PROBES}.nccl",
            ["--gpus", _gpu_arg(gpus), "--timeout", "55", "--correctness-only"],
            timeout=60.0,
            python=_stack(ctx)["python"],
            env={"NCCL_P2P_DISABLE": "1", **stackenv.probe_env()},
        )
        works_without_p2p = retry.ok and bool(retry.data.get("ok")) and bool(retry.data.get("correct"))
        where = outcome.data.get("problem") or outcome.problem
        summary = (
            "NCCL allreduce hangs with P2P and completes with NCCL_P2P_DISABLE=1: PCIe P2P is blocked (IOMMU/ACS)"
            if works_without_p2p
            else f"NCCL allreduce hung ({where}), also with NCCL_P2P_DISABLE=1"
        )
        return _result(
            self.id,
            Status.FAIL,
            summary,
            details=str(where),
            remedy=P2P_REMEDY,
            data={"hang": True, "works_without_p2p": works_without_p2p},
        )


def judge_nccl(data: Mapping[str, Any], world_size: int) -> Result:
    if not data.get("ok"):
        return _result(
            "nccl_allreduce",
            Status.FAIL,
            f"NCCL allreduce failed: {data.get('problem')}",
            remedy=remedies.NCCL,
            data=dict(data),
        )
    ranks = _as_list(data.get("ranks"))
    version = str(ranks[0].get("nccl", "")) if ranks else ""
    if not data.get("correct"):
        wrong = sum(int(r.get("mismatches", 0)) for r in ranks)
        return _result(
            "nccl_allreduce",
            Status.FAIL,
            f"NCCL {version} allreduce returned {wrong} wrong element(s)",
            remedy=remedies.NCCL,
            data=dict(data),
        )
    latency = dict(data.get("latency_us") or {})
    busbw = float(data.get("busbw_gbps", 0.0))
    summary = (
        f"NCCL {version} allreduce correct on {world_size} GPUs; {_sizes(latency)} {SIZES_NOTE}: "
        f"{_fmt_us(latency)} us; busbw {busbw:.0f} GB/s at 64 MiB"
    )
    return _result(
        "nccl_allreduce",
        Status.PASS,
        summary,
        data={"nccl": version, "latency_us": latency, "busbw_gbps": busbw, "world_size": world_size},
    )


class SymmMem:
    """torch symmetric memory: rendezvous, multicast_ptr, one-shot and two-shot allreduce checked against NCCL and
    timed beside it; multimem only where multicast exists and is allowed."""

    id: ClassVar[str] = "symm_mem"
    family: ClassVar[str] = FAMILY
    level: ClassVar[int] = 3
    requires: ClassVar[tuple[str, ...]] = ("driver", "torch")
    uses: ClassVar[tuple[str, ...]] = ()

    def run(self, ctx: Context) -> Result:
        gpus = selected_gpus(ctx, self.id, need_torch=True)
        if isinstance(gpus, Result):
            return gpus
        args = ["--gpus", _gpu_arg(gpus), "--timeout", str(max(10.0, ctx.timeout - 5))]
        outcome = run_probe(f"{PROBES}.symm_mem", args, timeout=ctx.timeout, **_stack(ctx))
        if not outcome.ok:
            return _child_failure(self.id, "symmetric-memory probe", outcome, P2P_REMEDY)
        return with_evidence(judge_symm_mem(outcome.data), outcome.data)


def judge_symm_mem(data: Mapping[str, Any]) -> Result:
    check_id = "symm_mem"
    if data.get("timed_out"):
        return _result(check_id, Status.FAIL, f"symmetric memory hung: {data.get('problem')}", remedy=P2P_REMEDY)
    if not data.get("ok"):
        problem = str(data.get("problem", ""))
        if "invalid device ordinal" in problem:
            return _result(
                check_id,
                Status.FAIL,
                "symmetric memory cannot map peer GPU memory (no P2P): " + problem,
                remedy=P2P_REMEDY,
            )
        return _result(
            check_id,
            Status.FAIL,
            f"symmetric memory failed: {problem}",
            remedy="needs torch >= 2.6 with CUDA P2P between the GPUs; " + P2P_REMEDY,
        )
    correct = dict(data.get("correct") or {})
    wrong = sorted(op for op, ok in correct.items() if not ok)
    if wrong:
        return _result(
            check_id,
            Status.FAIL,
            f"symmetric-memory allreduce wrong for {', '.join(wrong)}",
            remedy="report to PyTorch with this output; serve with NCCL meanwhile",
            data=dict(data),
        )
    latency = {op: dict(v) for op, v in dict(data.get("latency_us") or {}).items()}
    ptrs = [int(p) for p in data.get("multicast_ptr") or []]
    multicast = any(ptrs)
    if "multimem" in latency:
        multimem = "multimem ran"
    elif not data.get("multimem_allowed"):
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


class AllreduceFusion:
    """FlashInfer allreduce fusion (kARResidualRMSNorm) on the selected GPUs against allreduce + residual add +
    RMSNorm in torch, fused and unfused latency; backend, JIT target and cold/cached JIT build reported; knows
    which FlashInfer releases have SM120 kernels. Also PcieIpcAllReduceWorkspace (FlashInfer 0.7.0+)."""

    id: ClassVar[str] = "allreduce_fusion"
    family: ClassVar[str] = FAMILY
    level: ClassVar[int] = 3
    requires: ClassVar[tuple[str, ...]] = ("driver", "torch")
    uses: ClassVar[tuple[str, ...]] = ()

    def run(self, ctx: Context) -> Result:
        gpus = selected_gpus(ctx, self.id, need_torch=True)
        if isinstance(gpus, Result):
            return gpus
        version = flashinfer_version(ctx)
        if not version:
            return _skip(self.id, "FlashInfer is not installed", f"{remedies.PYTHON_STACK} installs flashinfer-python")
        pin = ctx.manifest.python_packages.get("flashinfer-python") if ctx.manifest else None
        caps = [capability(g) for g in gpus]
        gate = flashinfer_release.fusion_gate(version, caps, multicast=False, pin=pin)
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
        args = ["--gpus", _gpu_arg(gpus), "--timeout", str(max(10.0, timeout - 5))]
        outcome = run_probe(f"{PROBES}.fusion", args, timeout=timeout, **_stack(ctx))
        if not outcome.ok:
            return _child_failure(
                self.id,
                "allreduce-fusion probe",
                outcome,
                f"warm FlashInfer's JIT cache first: {remedies.FLASHINFER_JIT}",
            )
        return with_evidence(judge_fusion(outcome.data, gate, timeout), outcome.data)


def _stack(ctx: Context) -> dict[str, Any]:
    """Run torch probes with the stack venv's interpreter (the manifest's venv), like the torch check."""
    return {"python": str(ctx.facts.venv_python), "env": stackenv.probe_env()}


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


def judge_fusion(data: Mapping[str, Any], gate: flashinfer_release.FusionGate, timeout: float) -> Result:
    check_id = "allreduce_fusion"
    jit = dict(data.get("jit") or {})
    modules = _as_list(jit.get("modules"))
    env = dict(jit.get("environment") or {})
    cold = [m for m in modules if not m.get("cached_before")]
    jit_note = (
        "JIT compiled cold: " + ", ".join(f"{m['name']} {float(m['seconds']):.0f} s" for m in cold)
        if cold
        else "JIT modules loaded from cache"
        if modules
        else "JIT state unknown"
    )
    targets = " ".join(env.get("targets", [])) or "?"
    target = f"JIT targets {targets} (FLASHINFER_CUDA_ARCH_LIST={env.get('arch_list_env') or 'unset'})"
    base = {"jit": jit, "cold_build": bool(cold)}
    problem = str(data.get("problem", ""))
    if flashinfer_release.ARCH_GATE_ERROR in problem:
        return _result(
            check_id,
            Status.FAIL,
            f"FlashInfer refused the GPUs' architecture: {problem}",
            remedy=gate.remedy or "set FLASHINFER_CUDA_ARCH_LIST to the GPUs' targets (e.g. 12.0f)",
            data=base,
        )
    if data.get("timed_out"):
        in_build = "jit build" in problem
        summary = (
            f"FlashInfer JIT build did not finish within {timeout:.0f} s"
            if in_build
            else f"allreduce fusion hung: {problem}"
        )
        remedy = (
            f"warm FlashInfer's JIT cache: {remedies.FLASHINFER_JIT}; or raise {JIT_TIMEOUT_ENV}"
            if in_build
            else P2P_REMEDY
        )
        return _result(check_id, Status.FAIL, summary, details=target, remedy=remedy, data=base)
    if not data.get("ok"):
        return _result(
            check_id,
            Status.FAIL,
            f"allreduce fusion failed: {problem}",
            details=f"{jit_note}; {target}",
            remedy=gate.remedy or "see the details; serve without allreduce fusion meanwhile",
            data=base,
        )
    errors = {k: float(v) for k, v in dict(data.get("max_rel_err") or {}).items()}
    latency = {k: dict(v) for k, v in dict(data.get("latency_us") or {}).items()}
    backend = f"backend {data.get('backend')} ({data.get('workspace')})"
    bad = {k: v for k, v in errors.items() if v > FUSION_TOLERANCE}
    full = dict(
        base,
        backend=data.get("backend"),
        workspace=data.get("workspace"),
        latency_us=latency,
        max_rel_err=errors,
        pcie_ipc=data.get("pcie_ipc"),
        targets=env.get("targets", []),
    )
    if bad:
        worst = max(bad, key=lambda k: bad[k])
        return _result(
            check_id,
            Status.FAIL,
            f"allreduce fusion differs from the torch reference (rel. error {bad[worst]:.3g} at {worst} tokens)",
            details=f"{backend}; {target}",
            remedy="report to FlashInfer with this output; serve unfused",
            data=full,
        )
    fused, unfused = latency.get("fused", {}), latency.get("unfused", {})
    summary = (
        f"FlashInfer {data.get('flashinfer')} fusion correct, {backend}; {_sizes(fused)} {SIZES_NOTE}: fused "
        f"{_fmt_us(fused)} us vs unfused {_fmt_us(unfused)} us"
    )
    pcie = data.get("pcie_ipc")
    details = [jit_note, target]
    if isinstance(pcie, Mapping) and pcie.get("error"):
        details.append(f"PcieIpcAllReduceWorkspace failed: {pcie['error']}")
    elif isinstance(pcie, Mapping):
        pcie_latency = dict(pcie.get("latency_us") or {})
        details.append(
            f"PcieIpcAllReduceWorkspace ({pcie.get('profile')}): {'correct' if pcie.get('correct') else 'WRONG'}, "
            f"{_fmt_us(pcie_latency) if pcie_latency else '-'} us"
        )
    if cold:
        return _result(
            check_id,
            Status.WARN,
            summary + f"; {jit_note}",
            details="\n".join(details),
            remedy=f"warm FlashInfer's JIT cache at provisioning, so servers start without compiling: "
            f"{remedies.FLASHINFER_JIT}",
            data=full,
        )
    return _result(check_id, Status.PASS, summary, details="\n".join(details), data=full)


CHECKS = (Topology, NcclAllreduce, SymmMem, AllreduceFusion)
