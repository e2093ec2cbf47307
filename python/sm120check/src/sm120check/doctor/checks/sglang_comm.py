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
        return _retag(with_evidence(judge_sglang_comm(outcome.data, gpus), outcome.data))


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


def judge_sglang_comm(data: Mapping[str, Any], gpus: Sequence[Mapping[str, Any]] = ()) -> Result:
    """The probe's evidence -> one verdict: what SGLang will choose at launch, and why (pure; tested on records)."""
    if data.get("timed_out") or not data.get("ok"):
        return _fail(f"SGLang's communication code did not finish: {data.get('problem')}", PATCH)
    ranks = _as_list(data.get("ranks"))
    if not ranks:
        return _fail("the SGLang probe returned no ranks", PATCH)
    version = str(ranks[0].get("sglang", "?"))
    logs = [str(line) for r in ranks for part in ("preflight", "symm_mem", "fusion") for line in _lines(r, part)]
    preflight = [dict(r.get("preflight") or {}) for r in ranks]
    choices: dict[str, Any] = {"sglang": version, "world_size": len(ranks)}
    if all(p.get("present") for p in preflight):
        choices["preflight_sizes"] = preflight[0].get("sizes")
        if not all(p.get("ok") for p in preflight):
            line = _first(logs, "preflight")
            probe_failed = "probe failed" in line or any(p.get("sizes_error") for p in preflight)
            choices["fusion"] = "off"
            return _fail(
                f"SGLang {version} will skip allreduce fusion at launch: {line or 'workspace preflight said no'}",
                PATCH if probe_failed else MEMORY,
                details="\n".join(logs),
                data=choices,
            )
    if len(ranks) < 2:
        summary = f"SGLang {version}: workspace preflight passes (a server here would not skip fusion for it)"
        return _result(Status.PASS, summary, details="one GPU: the communicator and fusion need two", data=choices)
    symm = [dict(r.get("symm_mem") or {}) for r in ranks]
    if any(s.get("disabled") for s in symm):
        line = _first(logs, "multicast", "disabl", "symm")
        choices["symm_mem"] = "off"
        return _fail(
            f"SGLang {version} turns symmetric memory off at launch: {line or 'TorchSymmMemCommunicator disabled'}",
            PATCH,
            details="\n".join(logs),
            data=choices,
        )
    wrong = [c for s in symm for c in _as_list(s.get("checks")) if c.get("ran") and not c.get("ok")]
    skipped = sorted({int(c["elements"]) for s in symm for c in _as_list(s.get("checks")) if not c.get("ran")})
    if wrong:
        return _fail(
            f"SGLang's symmetric-memory all_reduce differs from NCCL at {wrong[0].get('elements')} elements",
            "report to SGLang with this output; serve without --enable-torch-symm-mem",
            data=choices,
        )
    fusion = [dict(r.get("fusion") or {}) for r in ranks]
    not_run = next((f for f in fusion if not f.get("ran")), None)
    if not_run is not None:
        choices["fusion"] = "off"
        reason = str(not_run.get("reason") or _first(logs, "fusion", "FlashInfer") or "not run")
        remedy = PATCH if "SM90 or SM10X" in reason or "preflight" in reason else "see the details"
        return _fail(f"SGLang {version} fusion did not run: {reason}", remedy, details="\n".join(logs), data=choices)
    errors = {k: max(float(f["max_rel_err"][k]) for f in fusion) for k in dict(fusion[0].get("max_rel_err") or {})}
    bad = {k: v for k, v in errors.items() if v > FUSION_TOLERANCE}
    choices.update(fusion="on", symm_mem="on", fusion_max_rel_err=errors, symm_mem_not_taken=skipped)
    if bad:
        worst = max(bad, key=lambda k: bad[k])
        return _fail(
            f"SGLang's fused allreduce + RMSNorm differs from the reference (rel. error {bad[worst]:.3g} at "
            f"{worst} tokens)",
            "report to SGLang/FlashInfer with this output; serve unfused",
            data=choices,
        )
    sizes = sorted({int(c["elements"]) for s in symm for c in _as_list(s.get("checks")) if c.get("ran")})
    summary = (
        f"SGLang {version} at launch: allreduce fusion on (preflight passed; fused = reference at "
        f"{'/'.join(sorted(errors, key=int))} tokens), symmetric memory on (all_reduce = NCCL at "
        f"{len(sizes)} sizes up to {max(sizes) * 2 // 1024 if sizes else 0} KiB)"
    )
    details = f"sizes SGLang's communicator left to NCCL: {skipped}" if skipped else ""
    return _result(Status.PASS, summary, details=details, data=choices)


def _lines(rank: Mapping[str, Any], part: str) -> list[str]:
    section = rank.get(part)
    return [str(x) for x in section.get("log", [])] if isinstance(section, Mapping) else []


CHECKS = (SglangComm,)
