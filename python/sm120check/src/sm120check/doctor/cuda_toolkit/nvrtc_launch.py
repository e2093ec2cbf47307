"""SM120 JIT: NVRTC builds sm_120 / sm_120a / sm_120f cubins; on each GPU a kernel built for it runs correctly."""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

from sm120check.doctor import child, nvrtc_api, remedies
from sm120check.doctor.cuda_toolkit.nvrtc_launch_payload import JitLaunch
from sm120check.doctor.cuda_toolkit.nvrtc_verdict import nvrtc_probe_verdict
from sm120check.doctor.model import Context, Result, Status
from sm120check.doctor.payload import PayloadError

TARGETS = ("sm_120", "sm_120a", "sm_120f")
PROBE = "sm120check.doctor.cuda_toolkit.nvrtc_launch_probe"


def jit_verdict(compiled: Sequence[nvrtc_api.Compiled], launch: JitLaunch | None, launch_problem: str) -> Result:
    """Verdict from the three NVRTC compiles and, when there was a GPU, the probe's launch report."""
    data: dict[str, object] = {f"{c.arch}_ms": round(c.seconds * 1000, 1) for c in compiled}
    data.update({f"{c.arch}_cubin_bytes": len(c.cubin) for c in compiled if c.ok})
    failed = [c for c in compiled if not c.ok]
    if failed:
        first = failed[0]
        return Result(
            "sm120_jit",
            Status.FAIL,
            f"NVRTC cannot compile for {', '.join(c.arch for c in failed)}: {first.error}",
            details=first.log[-2000:],
            remedy=remedies.nvrtc_compile(first.code),
            data=data,
        )
    built = f"NVRTC built {', '.join(TARGETS)} cubins"
    if launch is None and not launch_problem:
        return Result("sm120_jit", Status.PASS, f"{built} (no GPU: nothing launched)", data=data)
    if launch is None:
        return Result(
            "sm120_jit",
            Status.FAIL,
            f"{built}, but the GPU launch probe {launch_problem}",
            remedy=remedies.NVRTC_LAUNCH_PROBE,
            data=data,
        )
    rows = launch.gpus
    data["gpus"] = [g.to_json() for g in rows]
    bad = [g for g in rows if not g.ok]
    ran = "; ".join(f"GPU {g.gpu} {g.name} ran {g.arch}" for g in rows if g.ok)
    if bad or not rows:
        why = "; ".join(f"GPU {g.gpu} ({g.arch}): {g.error or str(g.mismatches) + ' wrong elements'}" for g in bad)
        return Result(
            "sm120_jit",
            Status.FAIL,
            f"{built}, but a kernel built for the GPU did not run correctly",
            details=why or "the probe found no GPU",
            remedy=remedies.DRIVER,
            data=data,
        )
    return Result("sm120_jit", Status.PASS, f"{built}; {ran}, result matches the CPU reference", data=data)


class Sm120JitCheck:
    """NVRTC compiles a kernel for sm_120, sm_120a, sm_120f; on each GPU a kernel built for it runs correctly."""

    id: ClassVar[str] = "sm120_jit"
    family: ClassVar[str] = "cuda_toolkit"
    level: ClassVar[int] = 2
    requires: ClassVar[tuple[str, ...]] = ("nvrtc",)
    uses: ClassVar[tuple[str, ...]] = ("driver",)

    def run(self, ctx: Context) -> Result:
        answer = nvrtc_api.probe(ctx.timeout, TARGETS)  # NVRTC loads and compiles in a child, never in the doctor
        if answer.problem or answer.opened is None:
            problem = answer.problem or f"found no {nvrtc_api.SONAME}: {answer.open_error}"
            return nvrtc_probe_verdict(self.id, problem, answer.step, answer.stderr_tail, ())
        compiled = list(answer.opened.compiled)
        driver = ctx.results.get("driver")  # a driver that failed (too old) or skipped: nothing is launched
        has_gpu = driver is not None and driver.status in (Status.PASS, Status.WARN) and bool(ctx.facts.gpus)
        if any(not c.ok for c in compiled) or not has_gpu:
            return jit_verdict(compiled, None, "")
        args = ["--gpus", ",".join(map(str, ctx.gpus))] if ctx.gpus else []
        outcome = child.run_probe(PROBE, args, timeout=ctx.timeout)
        if not outcome.ok:
            return jit_verdict(compiled, None, outcome.problem)
        try:
            return jit_verdict(compiled, JitLaunch.from_json(outcome.data), "")
        except PayloadError as exc:
            return jit_verdict(compiled, None, f"printed a malformed answer ({exc})")


CHECKS = (Sm120JitCheck,)
