"""Level 1: does the installed SGLang know this GPU? Capability maps, multicast fallback, fusion gates, EAGLE-3."""

from __future__ import annotations

import time
from typing import ClassVar

from sm120check.doctor import remedies
from sm120check.doctor.model import Context, Result, Status

FAMILY = "sglang_sm120"
# Findings the patch leaves alone because EAGLE-3 cannot work for that model (sm120check.sglang.eagle.findings).
EAGLE3_LEFT_AS_IS = ("eagle3-unsupported:", "eagle3-runtime:", "eagle3-partial:")


def _gpu_cc(ctx: Context) -> str | None:
    """The first GPU's compute capability as NVML listed it ("12.0"); None without a GPU list."""
    gpus = ctx.facts.gpus
    return f"{gpus[0].cc[0]}.{gpus[0].cc[1]}" if gpus else None


class SglangSm120:
    """SGLang's source admits this GPU: symmetric-memory maps, two-shot without multicast, fusion gate, EAGLE-3."""

    id: ClassVar[str] = "sglang_sm120"
    family: ClassVar[str] = FAMILY
    level: ClassVar[int] = 1
    requires: ClassVar[tuple[str, ...]] = ()
    uses: ClassVar[tuple[str, ...]] = ()
    needs_nvml: ClassVar[bool] = True  # the scan's capability is the first GPU's (NVML's list), even run alone

    def run(self, ctx: Context) -> Result:
        from sm120check.sglang import scan as report
        from sm120check.sglang.errors import SglangError
        from sm120check.sglang.tree import SourceTree, find_installed, flashinfer_version, local_cc, parse_cc

        start = time.monotonic()

        def result(status: Status, summary: str, **kw: object) -> Result:
            return Result(
                self.id,
                status,
                summary,
                family=FAMILY,
                level=self.level,
                seconds=time.monotonic() - start,
                **kw,  # type: ignore[arg-type]
            )

        root = find_installed()
        if root is None:
            return result(Status.SKIP, "SGLang is not installed in this environment")
        try:
            cc_text = _gpu_cc(ctx)
            cc = parse_cc(cc_text, "driver") if cc_text else local_cc()
            fi, origin = flashinfer_version()
            found = report.run(SourceTree(root), cc, fi, origin)
        except SglangError as exc:
            return result(Status.WARN, "SGLang source not understood by sm120check", details=str(exc))
        failing = [f for f in found.findings if not f.ok]
        data = {
            "sglang_version": found.version,
            "cc": str(found.cc),
            "needs_patch": found.needs_patch,
            "failing": [f.id for f in failing],
            "wrapper_gaps": len(found.eagle.wrapper_gaps),
        }
        details = report.render(found, every_model=True)
        if found.needs_patch:
            fixable = [f for f in failing if f.patchable]
            summary = f"SGLang {found.version}: {len(fixable)} gap(s) for compute capability {found.cc}"
            return result(Status.FAIL, summary, details=details, remedy=remedies.SGLANG_PATCH, data=data)
        # EAGLE-3 findings left as is concern one model each (its inner model lacks the methods, or is chosen at
        # run time): named in the summary, but they do not warn, since every release has some and a node serving
        # another model is not affected. Anything else left as is (an old FlashInfer, MNNVL on SM10x) warns.
        eagle3 = [f for f in failing if f.id.startswith(EAGLE3_LEFT_AS_IS)]
        other = [f for f in failing if f not in eagle3]
        note = ""
        if eagle3:
            names = ", ".join(f.id.split(":", 1)[1] for f in eagle3[:3]) + (", ..." if len(eagle3) > 3 else "")
            note = f"; EAGLE-3 not available for {len(eagle3)} model(s) ({names}; see details)"
        data["eagle3_unavailable"] = [f.id.split(":", 1)[1] for f in eagle3]
        if other:
            summary = f"SGLang {found.version}: patched; {len(other)} item(s) left as is ({other[0].summary}){note}"
            return result(Status.WARN, summary, details=details, data=data)
        if eagle3:
            summary = f"SGLang {found.version} admits compute capability {found.cc}{note}"
            return result(Status.PASS, summary, details=details, data=data)
        return result(
            Status.PASS, f"SGLang {found.version} admits compute capability {found.cc}", details=details, data=data
        )


CHECKS = (SglangSm120,)
