"""Stack versions: the stack venv's torch, FlashInfer, SGLang, sglang-kernel and other pins against the manifest."""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

from sm120check.doctor import remedies, stackenv
from sm120check.doctor.model import Context, Result, Status

KEY_PACKAGES = ("torch", "flashinfer-python", "sglang", "sglang-kernel", "cuda-bindings", "nvidia-nccl-cu13")


def same_version(installed: str, pinned: str) -> bool:
    """Equal, ignoring a local label the pin does not give: "2.11.0+cu130" satisfies "2.11.0"."""
    if "+" not in pinned:
        installed = installed.split("+", 1)[0]
    return installed == pinned


def stack_verdict(installed: Mapping[str, str], pinned: Mapping[str, str], venv: str) -> Result:
    pins = {stackenv.normalize(k): v for k, v in pinned.items()}
    data: dict[str, object] = {k: installed[k] for k in KEY_PACKAGES if k in installed}
    missing = [f"{k} {v}" for k, v in pins.items() if k not in installed]
    wrong = [
        f"{k} {installed[k]} (pinned {v})"
        for k, v in pins.items()
        if k in installed and not same_version(installed[k], v)
    ]
    data.update(pinned=len(pins), missing=len(missing), wrong=len(wrong))
    if missing or wrong:
        parts = ([f"missing {', '.join(missing)}"] if missing else []) + (
            [f"wrong {', '.join(wrong)}"] if wrong else []
        )
        return Result(
            "stack",
            Status.FAIL,
            f"the stack venv {venv} differs from the manifest: {'; '.join(parts)}",
            remedy=remedies.STACK_PINS,
            data=data,
        )
    shown = ", ".join(f"{k} {installed[k]}" for k in KEY_PACKAGES if k in installed and k in pins)
    return Result(
        "stack", Status.PASS, f"all {len(pins)} pinned packages match" + (f": {shown}" if shown else ""), data=data
    )


class StackCheck:
    """The stack venv's torch, flashinfer-python, sglang, sglang-kernel and other pins equal the manifest's."""

    id: ClassVar[str] = "stack"
    family: ClassVar[str] = "python_stack"
    level: ClassVar[int] = 1
    requires: ClassVar[tuple[str, ...]] = ()
    uses: ClassVar[tuple[str, ...]] = ()

    def run(self, ctx: Context) -> Result:
        if (absent := stackenv.missing_venv(ctx, self.id)) is not None:
            return absent
        venv, installed = ctx.facts.venv, ctx.facts.distributions
        if ctx.manifest is None:
            found = (
                ", ".join(f"{k} {installed[k]}" for k in KEY_PACKAGES if k in installed)
                or "none of the stack's packages"
            )
            return Result(
                self.id,
                Status.SKIP,
                "no manifest to compare the stack venv against",
                details=f"{venv}: {found}",
                remedy=remedies.NO_MANIFEST,
            )
        return stack_verdict(installed, ctx.manifest.python_packages, str(venv))


CHECKS = (StackCheck,)
