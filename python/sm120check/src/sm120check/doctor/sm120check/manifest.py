"""The node manifest: which stack this node was provisioned for, and by which sm120kit (family `sm120check`, the
role that writes it)."""

from __future__ import annotations

from typing import ClassVar

from sm120check import __version__, manifest
from sm120check.doctor import remedies
from sm120check.doctor.model import Context, Result, Status


class ManifestCheck:
    """The node manifest (/etc/sm120kit/manifest.json) is present and readable, and names the profile."""

    id: ClassVar[str] = "manifest"
    family: ClassVar[str] = "sm120check"
    level: ClassVar[int] = 1
    requires: ClassVar[tuple[str, ...]] = ()
    uses: ClassVar[tuple[str, ...]] = ()

    def run(self, ctx: Context) -> Result:
        m = ctx.manifest
        if m is None:
            missing = ctx.manifest_error_kind in (None, manifest.ErrorKind.MISSING)
            return Result(
                self.id,
                Status.WARN if missing else Status.FAIL,
                "no node manifest: version comparisons use built-in CUDA 13.0 defaults or are skipped"
                if missing
                else "the node manifest cannot be used",
                details=ctx.manifest_error or f"{manifest.manifest_path()} not found",
                remedy=remedies.MANIFEST_MISSING,
                data={"error": ctx.manifest_error_kind.value} if ctx.manifest_error_kind else {},
            )
        data = {"path": str(m.path), "profile": m.profile, "venv": m.venv}
        summary = f"{m.path}: profile {m.profile}, venv {m.venv}"
        # sm120kit_version: the checker installed with this manifest is the one reading it.
        if m.sm120kit_version != __version__:
            return Result(
                self.id,
                Status.WARN,
                f"{summary}; written by sm120kit {m.sm120kit_version}, doctor is {__version__}",
                remedy=remedies.MANIFEST_STALE,
                data=data,
            )
        return Result(self.id, Status.PASS, summary, data=data)


CHECKS = (ManifestCheck,)
