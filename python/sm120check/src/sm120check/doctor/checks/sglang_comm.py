"""Level 3: what SGLang itself turns on at launch on this node (fusion, symmetric memory), run from its own code.

The `comm` checks prove FlashInfer and torch work here; this one runs the stack venv's SGLang (patched or not)
in rank processes: its workspace preflight, `TorchSymmMemCommunicator` and fused allreduce + residual + RMSNorm
(probe `sm120check.doctor.probes.sglang_comm`), and says what a server started now would choose, with SGLang's
own log line when it would turn something off.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from sm120check.doctor.checks.comm import (
    FUSION_TOLERANCE,
    _as_list,
    _child_failure,
    _gpu_arg,
    _stack,
    selected_gpus,
    with_evidence,
)
from sm120check.doctor.child import run_probe
from sm120check.doctor.model import Context, Result, Status
from sm120check.doctor.stackenv import installed, prefix

CHECK_ID = "sglang_comm"
FAMILY = "sglang"
PATCH = "sm120check sglang patch (role sglang_sm120, tag sglang_sm120_configure), then rerun the doctor"
MEMORY = "free GPU memory before the server starts (nvidia-smi shows who holds it), or lower --mem-fraction-static"


class SglangComm:
    """SGLang's own workspace preflight, TorchSymmMemCommunicator and fused allreduce + residual + RMSNorm on the
    selected GPUs: whether a server started now runs fused and with symmetric memory, and SGLang's reason if not."""

    id: ClassVar[str] = CHECK_ID
    family: ClassVar[str] = FAMILY
    level: ClassVar[int] = 3
    requires: ClassVar[tuple[str, ...]] = ("driver", "torch")
    uses: ClassVar[tuple[str, ...]] = ()

    def run(self, ctx: Context) -> Result:
        gpus = selected_gpus(ctx, self.id, need_torch=True)
        if isinstance(gpus, Result):
            return _retag(gpus)
        packages = installed(prefix(ctx))
        if "sglang" not in packages:
            return _skip_sglang("SGLang is not installed in the stack venv", "profile full installs it")
        args = ["--gpus", _gpu_arg(gpus), "--timeout", str(max(10.0, ctx.timeout - 5))]
        outcome = run_probe("sm120check.doctor.probes.sglang_comm", args, timeout=ctx.timeout, **_stack(ctx))
        if not outcome.ok:
            return _retag(_child_failure(self.id, "SGLang communication probe", outcome, PATCH))
        return _retag(with_evidence(judge_sglang_comm(outcome.data), outcome.data))


def _retag(result: Result) -> Result:
    """Results built by the comm helpers carry their family; this check belongs to `sglang`."""
    return dataclasses.replace(result, family=FAMILY)


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


def _fusion_choice(ranks: Sequence[Mapping[str, Any]], logs: Sequence[str]) -> tuple[Choice, dict[str, float]]:
    preflight = [dict(r.get("preflight") or {}) for r in ranks]
    if all(p.get("present") for p in preflight) and not all(p.get("ok") for p in preflight):
        line = _first(logs, "preflight") or "the workspace preflight said no"
        failed_query = "probe failed" in line or any(p.get("sizes_error") for p in preflight)
        return Choice("allreduce fusion", False, f"SGLang: {line}", PATCH if failed_query else MEMORY), {}
    if len(ranks) < 2:
        return Choice("allreduce fusion", True, "workspace preflight passed (one GPU: no fused run)"), {}
    fusion = [dict(r.get("fusion") or {}) for r in ranks]
    not_run = next((f for f in fusion if not f.get("ran")), None)
    if not_run is not None:
        reason = str(not_run.get("reason") or _first(logs, "fusion", "FlashInfer") or "not run")
        remedy = PATCH if "SM90 or SM10X" in reason or "preflight" in reason else "see the details"
        return Choice("allreduce fusion", False, reason, remedy), {}
    errors = {k: max(float(f["max_rel_err"][k]) for f in fusion) for k in dict(fusion[0].get("max_rel_err") or {})}
    bad = {k: v for k, v in errors.items() if v > FUSION_TOLERANCE}
    if bad:
        worst = max(bad, key=lambda k: bad[k])
        evidence = f"fused result differs from the reference (rel. error {bad[worst]:.3g} at {worst} tokens)"
        return Choice("allreduce fusion", False, evidence, "report to SGLang/FlashInfer with this output"), errors
    tokens = "/".join(sorted(errors, key=int))
    return Choice("allreduce fusion", True, f"preflight passed, fused = reference at {tokens} tokens"), errors


def _symm_choice(ranks: Sequence[Mapping[str, Any]], logs: Sequence[str]) -> Choice:
    symm = [dict(r.get("symm_mem") or {}) for r in ranks]
    if any(s.get("disabled") for s in symm):
        line = _first([x for s in symm for x in _as_strings(s.get("log"))], "multicast", "disabl", "symm")
        return Choice("symmetric memory", False, f"SGLang: {line or 'TorchSymmMemCommunicator disabled'}", PATCH)
    checks = [c for s in symm for c in _as_list(s.get("checks"))]
    wrong = [c for c in checks if c.get("ran") and not c.get("ok")]
    if wrong:
        evidence = f"all_reduce differs from NCCL at {wrong[0].get('elements')} elements"
        return Choice("symmetric memory", False, evidence, "report to SGLang; serve without --enable-torch-symm-mem")
    sizes = sorted({int(c["elements"]) for c in checks if c.get("ran")})
    if not sizes:
        return Choice("symmetric memory", False, "the communicator took no all_reduce at any size", PATCH)
    return Choice(
        "symmetric memory", True, f"all_reduce = NCCL at {len(sizes)} sizes up to {max(sizes) * 2 // 1024} KiB"
    )


def _as_strings(value: object) -> list[str]:
    return [str(v) for v in value] if isinstance(value, list) else []


def judge_sglang_comm(data: Mapping[str, Any]) -> Result:
    """The probe's evidence -> one verdict: what SGLang turns on at launch, and why not (pure; tested on records)."""
    if data.get("timed_out") or not data.get("ok"):
        return _fail(f"SGLang's communication code did not finish: {data.get('problem')}", PATCH)
    ranks = _as_list(data.get("ranks"))
    if not ranks:
        return _fail("the SGLang probe returned no ranks", PATCH)
    version = str(ranks[0].get("sglang", "?"))
    logs = [line for r in ranks for part in ("preflight", "symm_mem", "fusion") for line in _lines(r, part)]
    fusion, errors = _fusion_choice(ranks, logs)
    choices = [fusion] + ([_symm_choice(ranks, logs)] if len(ranks) >= 2 else [])
    skipped = sorted(
        {
            int(c["elements"])
            for r in ranks
            for c in _as_list(dict(r.get("symm_mem") or {}).get("checks"))
            if not c.get("ran")
        }
    )
    pre = dict(ranks[0].get("preflight") or {})
    data_out: dict[str, Any] = {
        "sglang": version,
        "world_size": len(ranks),
        **{c.name.replace(" ", "_"): "on" if c.on else "off" for c in choices},
        "preflight_sizes": pre.get("sizes"),
        "fusion_max_rel_err": errors,
        "symm_mem_not_taken": skipped,
    }
    summary = f"SGLang {version} at launch: " + "; ".join(
        f"{c.name} {'on' if c.on else 'OFF'} ({c.evidence})" for c in choices
    )
    details = "\n".join([*logs, f"sizes the communicator left to NCCL: {skipped}" if skipped else ""]).strip()
    off = [c for c in choices if not c.on]
    if off:
        remedy = "; ".join(dict.fromkeys(c.remedy for c in off if c.remedy))
        return _fail(summary, remedy, details=details, data=data_out)
    if len(ranks) < 2:
        details = "one GPU: SGLang's communicator and fused allreduce need two (tensor parallelism)"
    return _result(Status.PASS, summary, details=details, data=data_out)


def _lines(rank: Mapping[str, Any], part: str) -> list[str]:
    section = rank.get(part)
    return [str(x) for x in section.get("log", [])] if isinstance(section, Mapping) else []


CHECKS = (SglangComm,)
