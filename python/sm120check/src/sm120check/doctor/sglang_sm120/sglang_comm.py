"""Level 3: what SGLang itself turns on at launch on this node (fusion, symmetric memory), run from its own code.

The `comm` checks prove FlashInfer and torch work here; this one runs the stack venv's SGLang (patched or not)
in rank processes: its workspace preflight, `TorchSymmMemCommunicator` and fused allreduce + residual + RMSNorm
(probe `sm120check.doctor.sglang_sm120.sglang_comm_probe`), and says what a server started now would choose, with
SGLang's own log line when it would turn something off.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from sm120check.doctor import remedies
from sm120check.doctor.collective_payload import FUSION_TOLERANCE
from sm120check.doctor.model import Context, Result, Status
from sm120check.doctor.nvml_api import Gpu
from sm120check.doctor.payload import PayloadError
from sm120check.doctor.probecheck import Payload, ProbeCheck, malformed, with_evidence
from sm120check.doctor.sglang_sm120.sglang_comm_payload import PcieIpcRun, SglangCommAnswer, SglangRank

CHECK_ID = "sglang_comm"
SUPPORTED_WORLD_SIZES = (2, 4, 8)  # pcie_ipc_ar.py's _SUPPORTED_WORLD_SIZES
FAMILY = "sglang_sm120"


class SglangComm(ProbeCheck[SglangCommAnswer]):
    """SGLang's own workspace preflight, TorchSymmMemCommunicator, PcieIpcCommunicator (0.5.22+) and fused allreduce +
    residual + RMSNorm on the selected GPUs: whether a server started now runs fused and with symmetric memory, and
    SGLang's reason if not; whether its opt-in PCIe-IPC all-reduce sums exactly and how fast against NCCL."""

    id: ClassVar[str] = CHECK_ID
    family: ClassVar[str] = FAMILY
    requires: ClassVar[tuple[str, ...]] = ("driver", "torch")
    probe: ClassVar[str] = "sm120check.doctor.sglang_sm120.sglang_comm_probe"
    payload: ClassVar[Payload[SglangCommAnswer]] = SglangCommAnswer
    answer: ClassVar[str] = "SGLang communication"
    what: ClassVar[str] = "SGLang communication probe"
    remedy: ClassVar[str] = remedies.SGLANG_PATCH_RERUN

    def prepare(self, ctx: Context, gpus: Sequence[Gpu]) -> Result | None:
        if "sglang" not in ctx.facts.distributions:
            return _skip_sglang("SGLang is not installed in the stack venv", remedies.FULL_PROFILE)
        return None

    def malformed_answer(self, exc: PayloadError) -> Result:
        return malformed(self.id, self.answer, exc, remedies.SGLANG_PROBE_MALFORMED, FAMILY)

    def judge(self, answer: SglangCommAnswer, ctx: Context, gpus: Sequence[Gpu]) -> Result:
        return with_evidence(judge_sglang_comm(answer), {"evidence": answer.evidence})


def _result(status: Status, summary: str, **kw: Any) -> Result:
    return Result(CHECK_ID, status, summary, family=FAMILY, level=3, **kw)


def _skip_sglang(summary: str, remedy: str) -> Result:
    return _result(Status.SKIP, summary, remedy=remedy)


def _fail(summary: str, remedy: str, details: str = "", data: Mapping[str, Any] | None = None) -> Result:
    return _result(Status.FAIL, summary, remedy=remedy, details=details, data=dict(data or {}))


def _first(lines: Sequence[str], *needles: str) -> str:
    return next((line for line in lines if any(n in line for n in needles)), lines[0] if lines else "")


@dataclasses.dataclass(frozen=True)
class Choice:
    """One thing a server started now would turn on or off, SGLang's reason, and the fix."""

    name: str  # "allreduce fusion" or "symmetric memory"
    on: bool
    evidence: str
    remedy: str = ""


def _fusion_choice(ranks: Sequence[SglangRank], logs: Sequence[str]) -> tuple[Choice, dict[str, float]]:
    preflight = [r.preflight for r in ranks]
    if all(p is not None and p.present for p in preflight) and not all(p is not None and p.ok for p in preflight):
        line = _first(logs, "preflight") or "the workspace preflight said no"
        failed_query = "probe failed" in line or any(p is not None and p.sizes_error for p in preflight)
        remedy = remedies.SGLANG_PATCH_RERUN if failed_query else remedies.GPU_MEMORY
        return Choice("allreduce fusion", False, f"SGLang: {line}", remedy), {}
    if len(ranks) < 2:
        return Choice("allreduce fusion", True, "workspace preflight passed (one GPU: no fused run)"), {}
    fusion = [r.fusion for r in ranks]
    ran = [f for f in fusion if f is not None and f.ran]
    if len(ran) < len(fusion):
        not_run = next(f for f in fusion if f is None or not f.ran)
        given = not_run.reason if not_run is not None else None
        reason = given or _first(logs, "fusion", "FlashInfer") or "not run"
        patchable = "SM90 or SM10X" in reason or "preflight" in reason
        remedy = remedies.SGLANG_PATCH_RERUN if patchable else remedies.SEE_DETAILS
        return Choice("allreduce fusion", False, reason, remedy), {}
    errors = {k: max(f.max_rel_err[k] for f in ran) for k in ran[0].max_rel_err}
    bad = {k: v for k, v in errors.items() if v > FUSION_TOLERANCE}
    if bad:
        worst = max(bad, key=lambda k: bad[k])
        evidence = f"fused result differs from the reference (rel. error {bad[worst]:.3g} at {worst} tokens)"
        return Choice("allreduce fusion", False, evidence, remedies.SGLANG_FUSION_WRONG), errors
    tokens = "/".join(sorted(errors, key=int))
    return Choice("allreduce fusion", True, f"preflight passed, fused = reference at {tokens} tokens"), errors


def _symm_choice(ranks: Sequence[SglangRank], logs: Sequence[str]) -> Choice:
    symm = [r.symm_mem for r in ranks if r.symm_mem is not None]
    if any(s.disabled for s in symm):
        line = _first([x for s in symm for x in s.log], "multicast", "disabl", "symm")
        evidence = f"SGLang: {line or 'TorchSymmMemCommunicator disabled'}"
        return Choice("symmetric memory", False, evidence, remedies.SGLANG_PATCH_RERUN)
    checks = [c for s in symm for c in s.checks]
    wrong = [c for c in checks if c.ran and not c.ok]
    if wrong:
        evidence = f"all_reduce differs from NCCL at {wrong[0].elements} elements"
        return Choice("symmetric memory", False, evidence, remedies.SGLANG_SYMM_MEM_WRONG)
    sizes = sorted({c.elements for c in checks if c.ran})
    if not sizes:
        evidence = "the communicator took no all_reduce at any size"
        return Choice("symmetric memory", False, evidence, remedies.SGLANG_PATCH_RERUN)
    return Choice(
        "symmetric memory", True, f"all_reduce = NCCL at {len(sizes)} sizes up to {max(sizes) * 2 // 1024} KiB"
    )


def judge_sglang_comm(answer: SglangCommAnswer) -> Result:
    """The probe's evidence -> one verdict: what SGLang turns on at launch, and why not (pure; tested on records)."""
    if answer.timed_out or not answer.ok:
        return _fail(f"SGLang's communication code did not finish: {answer.problem}", remedies.SGLANG_PATCH_RERUN)
    ranks = answer.ranks
    if not ranks:
        return _fail("the SGLang probe returned no ranks", remedies.SGLANG_PATCH_RERUN)
    version = ranks[0].sglang or "?"
    logs = [line for r in ranks for line in _lines(r)]
    fusion, errors = _fusion_choice(ranks, logs)
    choices = [fusion] + ([_symm_choice(ranks, logs)] if len(ranks) >= 2 else [])
    skipped = sorted({c.elements for r in ranks if r.symm_mem is not None for c in r.symm_mem.checks if not c.ran})
    pre = ranks[0].preflight
    data_out: dict[str, object] = {
        "sglang": version,
        "world_size": len(ranks),
        **{c.name.replace(" ", "_"): "on" if c.on else "off" for c in choices},
        "preflight_sizes": list(pre.sizes) if pre is not None and pre.sizes is not None else None,
        "fusion_max_rel_err": errors,
        "symm_mem_not_taken": skipped,
    }
    summary = f"SGLang {version} at launch: " + "; ".join(
        f"{c.name} {'on' if c.on else 'OFF'} ({c.evidence})" for c in choices
    )
    details = "\n".join([*logs, f"sizes the communicator left to NCCL: {skipped}" if skipped else ""]).strip()
    ipc = judge_pcie_ipc([r.pcie_ipc for r in ranks if r.pcie_ipc is not None], len(ranks))
    if ipc is not None:
        data_out["pcie_ipc"] = ipc.data
        summary += f"; PCIe-IPC all-reduce (opt-in) {ipc.text}"
    off = [c for c in choices if not c.on] + ([ipc.choice] if ipc is not None and ipc.state == "wrong" else [])
    if off:
        return _fail(summary, remedies.all_of(*(c.remedy for c in off)), details=details, data=data_out)
    if len(ranks) < 2:
        details = "one GPU: SGLang's communicator and fused allreduce need two (tensor parallelism)"
    if ipc is not None and ipc.state == "off":
        return _result(Status.WARN, summary, remedy=remedies.SGLANG_PCIE_IPC_OFF, details=details, data=data_out)
    return _result(Status.PASS, summary, details=details, data=data_out)


@dataclasses.dataclass(frozen=True)
class PcieIpcVerdict:
    """What the ranks' PcieIpcCommunicator runs say. `state`: ok (built, took the decode sizes, exact), off (not built
    or took nothing: a server with it on stays on NCCL), wrong (a sum differs: never turn it on), absent (the release
    has none). `data` is what the launch role reads (roles/sglang_server/tasks/verdicts.yml)."""

    state: str
    text: str
    choice: Choice
    data: dict[str, object]


def judge_pcie_ipc(runs: Sequence[PcieIpcRun], world_size: int) -> PcieIpcVerdict | None:
    """The ranks' runs -> one verdict (pure); None when no rank ran it (one GPU, or a probe before it existed)."""
    if not runs:
        return None
    name = "PCIe-IPC all-reduce"
    if not all(r.present for r in runs):
        reason = next((r.reason for r in runs if r.reason), "") or "no pcie_ipc_ar module"
        choice = Choice(name, False, f"not in this SGLang release ({reason})", remedies.SGLANG_PCIE_IPC_OFF)
        return PcieIpcVerdict("absent", "absent (SGLang 0.5.22+ has it)", choice, {"state": "absent"})
    logs = [line for r in runs for line in r.log]
    rows = max((r.rows or 0) for r in runs)
    max_numel = min((r.max_numel or 0) for r in runs)
    base: dict[str, object] = {"rows": rows, "max_numel": max_numel}
    if any(r.disabled for r in runs):
        raised = next((r.error for r in runs if r.error), None)
        line = _first(logs, "failed", "no pcie_ipc_comm", "PCIe-IPC") or "PcieIpcCommunicator disabled itself"
        if raised:  # what SGLang raised is the reason; the world-size guess is only for a silent disable
            line = f"building it raised {raised}"
        elif world_size not in SUPPORTED_WORLD_SIZES and not logs:  # SGLang says so at debug level only
            line = f"world size {world_size}: its kernels build for 2, 4 or 8 ranks only"
        choice = Choice(name, False, f"SGLang: {line}", remedies.SGLANG_PCIE_IPC_OFF)
        return PcieIpcVerdict("off", f"OFF ({choice.evidence})", choice, base | {"state": "off", "reason": line})
    checks = [c for r in runs for c in r.checks]
    wrong = sorted({c.tokens for c in checks if c.taken and not c.exact})
    if wrong:
        evidence = f"all-reduce differs from the exact sum at {'/'.join(map(str, wrong))} rows"
        if raised := next((f"{c.error} at {c.tokens} rows" for c in checks if c.error), None):
            evidence = f"all-reduce raised {raised}"
        choice = Choice(name, False, evidence, remedies.SGLANG_PCIE_IPC_WRONG)
        return PcieIpcVerdict("wrong", f"WRONG ({evidence})", choice, base | {"state": "wrong", "wrong_rows": wrong})
    taken = sorted({c.tokens for c in checks if c.taken})
    left = sorted({c.tokens for c in checks if not c.taken} - set(taken))
    if not taken:
        evidence = "the communicator took no reduction (all left to NCCL)"
        choice = Choice(name, False, evidence, remedies.SGLANG_PCIE_IPC_OFF)
        return PcieIpcVerdict("off", f"OFF ({evidence})", choice, base | {"state": "off", "reason": evidence})
    ipc_us = _slowest(checks, "pcie_ipc_us")
    nccl_us = _slowest(checks, "nccl_us")
    widest = max(taken)
    speed = (
        f"; {ipc_us[widest]:g} us against NCCL's {nccl_us[widest]:g} us at {widest} rows" if widest in ipc_us else ""
    )
    evidence = f"exact at {'/'.join(map(str, taken))} rows{speed}"
    data = base | {"state": "ok", "rows_taken": taken, "rows_left": left, "pcie_ipc_us": ipc_us, "nccl_us": nccl_us}
    return PcieIpcVerdict("ok", f"works ({evidence})", Choice(name, True, evidence), data)


def _slowest(checks: Sequence[Any], key: str) -> dict[int, float]:
    """Per row count, the slowest rank's median: a collective is as fast as its slowest rank."""
    out: dict[int, float] = {}
    for c in checks:
        value = getattr(c, key)
        if c.taken and value is not None:
            out[c.tokens] = max(out.get(c.tokens, 0.0), float(value))
    return out


def _lines(rank: SglangRank) -> list[str]:
    """The log lines SGLang wrote in the preflight, the communicator and the fused run, in that order."""
    sections = (
        rank.preflight.log if rank.preflight is not None else (),
        rank.symm_mem.log if rank.symm_mem is not None else (),
        rank.pcie_ipc.log if rank.pcie_ipc is not None else (),
        (rank.fusion.log or ()) if rank.fusion is not None else (),
    )
    return [line for section in sections for line in section]


CHECKS = (SglangComm,)
