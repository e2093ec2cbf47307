"""The answer of python_stack/torch_info_probe.py: torch's build, its NCCL, whether CUDA works, the libraries it
mapped."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from sm120check.doctor.payload import Fields

PROBE = "torch_info"


@dataclass(frozen=True)
class TorchInfo:
    """None (or "", ()) is a field the probe did not print: it failed before, or the step raised (`*_error`)."""

    installed: bool
    import_error: str = ""  # set: `import torch` raised; nothing else is known
    import_s: float | None = None
    version: str = ""
    cuda: str | None = None  # torch.version.cuda, None for a CPU-only build
    file: str = ""
    arch_list: tuple[str, ...] = ()
    nccl: str | None = None
    nccl_error: str = ""
    cuda_available: bool | None = None
    device_count: int | None = None
    op_ok: bool | None = None  # a CUDA tensor op returned the right sum
    capabilities: tuple[str, ...] | None = None  # per device, "12.0"
    cuda_error: str = ""
    maps: Mapping[str, tuple[str, ...]] = field(default_factory=dict)  # library stem -> files the process mapped
    seconds: float | None = None

    @property
    def imported(self) -> bool:
        return self.installed and not self.import_error

    def to_json(self) -> dict[str, object]:
        out: dict[str, object] = {"installed": self.installed}
        if not self.imported:
            return out | ({"import_error": self.import_error} if self.import_error else {})
        out.update(
            import_s=self.import_s,
            version=self.version,
            cuda=self.cuda,
            file=self.file,
            arch_list=list(self.arch_list),
        )
        optional: dict[str, object] = {
            "nccl": self.nccl,
            "nccl_error": self.nccl_error or None,
            "cuda_available": self.cuda_available,
            "device_count": self.device_count,
            "op_ok": self.op_ok,
            "capabilities": None if self.capabilities is None else list(self.capabilities),
            "cuda_error": self.cuda_error or None,
        }
        out.update({k: v for k, v in optional.items() if v is not None})
        out.update(maps={k: list(v) for k, v in self.maps.items()}, seconds=self.seconds)
        return out

    @classmethod
    def from_json(cls, data: object) -> TorchInfo:
        f = Fields(PROBE, data)
        installed = f.flag("installed")
        if not installed or f.has("import_error"):
            return cls(installed, f.text("import_error") if f.has("import_error") else "")
        return cls(
            installed,
            import_s=f.maybe_number("import_s"),
            version=f.text("version"),
            cuda=f.maybe_text("cuda"),
            file=f.text("file"),
            arch_list=f.texts("arch_list"),
            nccl=f.maybe_text("nccl"),
            nccl_error=f.maybe_text("nccl_error") or "",
            cuda_available=f.maybe_flag("cuda_available"),
            device_count=f.maybe_integer("device_count"),
            op_ok=f.maybe_flag("op_ok"),
            capabilities=f.texts("capabilities") if f.has("capabilities") else None,
            cuda_error=f.maybe_text("cuda_error") or "",
            maps=f.text_lists("maps"),
            seconds=f.maybe_number("seconds"),
        )
