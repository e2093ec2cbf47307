"""The answer of cuda_toolkit/nvrtc_launch_probe.py: for each GPU, the kernel NVRTC built for its architecture and how
it ran."""

from __future__ import annotations

from dataclasses import dataclass

from sm120check.doctor.payload import Fields

PROBE = "nvrtc_launch"


@dataclass(frozen=True)
class LaunchRow:
    """One GPU: `ok` with the counts when the kernel ran, else `error` (NVRTC's log when the compile failed)."""

    gpu: int
    name: str
    cc: str  # "12.0"
    arch: str  # "sm_120"
    ok: bool
    error: str | None = None
    log: str | None = None
    mismatches: int | None = None
    elements: int | None = None
    cubin_bytes: int | None = None
    compile_s: float | None = None
    launch_s: float | None = None

    def to_json(self) -> dict[str, object]:
        row: dict[str, object] = {"gpu": self.gpu, "name": self.name, "cc": self.cc, "arch": self.arch, "ok": self.ok}
        optional: dict[str, object] = {
            "error": self.error,
            "log": self.log,
            "mismatches": self.mismatches,
            "elements": self.elements,
            "cubin_bytes": self.cubin_bytes,
            "compile_s": self.compile_s,
            "launch_s": self.launch_s,
        }
        return row | {k: v for k, v in optional.items() if v is not None}

    @classmethod
    def from_json(cls, f: Fields) -> LaunchRow:
        return cls(
            f.integer("gpu"),
            f.text("name"),
            f.text("cc"),
            f.text("arch"),
            f.flag("ok"),
            error=f.maybe_text("error"),
            log=f.maybe_text("log"),
            mismatches=f.maybe_integer("mismatches"),
            elements=f.maybe_integer("elements"),
            cubin_bytes=f.maybe_integer("cubin_bytes"),
            compile_s=f.maybe_number("compile_s"),
            launch_s=f.maybe_number("launch_s"),
        )


@dataclass(frozen=True)
class JitLaunch:
    nvrtc: str  # the libnvrtc.so.13 file the probe compiled with
    gpus: tuple[LaunchRow, ...]

    def to_json(self) -> dict[str, object]:
        return {"nvrtc": self.nvrtc, "gpus": [g.to_json() for g in self.gpus]}

    @classmethod
    def from_json(cls, data: object) -> JitLaunch:
        f = Fields(PROBE, data)
        return cls(f.text("nvrtc"), tuple(LaunchRow.from_json(g) for g in f.objects("gpus")))
